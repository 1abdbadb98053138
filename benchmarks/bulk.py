"""Purge and recovery over bulk data, in this process (Django set up on the benchmark database).

The rows are made by one ``INSERT ... SELECT generate_series`` each (on MariaDB,
from its sequence engine's ``seq_1_to_N``), then the table is analysed (as
autovacuum would) before anything is timed.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.server import Database
from benchmarks.stats import rotated

if TYPE_CHECKING:
    from idempotency.progress import Progress

TABLE = "idempotency_idempotencyrecord"
LOST_LEASE_OPERATION = "bench.lost-lease"

_FILL = """
INSERT INTO idempotency_idempotencyrecord (
    scope, idem_key, operation, request_hash, request_method, request_path, status,
    owner_token, lease_until, response_status, response_headers, response_body, resource_id,
    attempts, recovery_attempts, version, created_at, updated_at, completed_at, expires_at
)
SELECT
    __SCOPE__, md5(%(tag)s || g), 'bench.bulk', __HASH__,
    'POST', '/api/orders/', 'SUCCEEDED', decode(md5('owner' || g), 'hex'), NULL, 201,
    '[["Content-Type", "application/json"]]'::jsonb,
    convert_to('{"id": ' || g || ', "url": "http://127.0.0.1/api/orders/' || g
        || '/", "sku": "bench", "quantity": 1, "status": "PENDING", '
        || '"created_at": "2026-01-01T00:00:00Z", "paid_at": null}', 'UTF8'),
    g::text, 1, 0, 2, now() - interval '2 days', now() - interval '2 days',
    now() - interval '2 days', __EXPIRES__
FROM generate_series(1, %(rows)s) AS g
"""
# Expired a day ago, one millisecond apart: all purgeable, in expiry order.
EXPIRED = "now() - interval '1 day' + g * interval '1 millisecond'"
LIVE = "now() + interval '1 day'"
# The same records on MariaDB/MySQL: its sequence engine for generate_series, its own
# string and interval syntax; only the default scope and hash (what run.py fills).
_FILL_MYSQL = f"""
INSERT INTO {TABLE} (
    scope, idem_key, operation, request_hash, request_method, request_path, status,
    owner_token, lease_until, response_status, response_headers, response_body, resource_id,
    attempts, recovery_attempts, version, created_at, updated_at, completed_at, expires_at
)
SELECT
    CONCAT('user:', seq %% 1000, ':bench.bulk'), md5(CONCAT(%(tag)s, seq)), 'bench.bulk',
    UNHEX(md5(seq)), 'POST', '/api/orders/', 'SUCCEEDED', UNHEX(md5(CONCAT('owner', seq))),
    NULL, 201,
    '[["Content-Type", "application/json"]]',
    CONCAT('{{"id": ', seq, ', "url": "http://127.0.0.1/api/orders/', seq,
        '/", "sku": "bench", "quantity": 1, "status": "PENDING", ',
        '"created_at": "2026-01-01T00:00:00Z", "paid_at": null}}'),
    seq, 1, 0, 2, NOW(6) - INTERVAL 2 DAY, NOW(6) - INTERVAL 2 DAY,
    NOW(6) - INTERVAL 2 DAY, __EXPIRES__
FROM seq_1_to___ROWS__
"""
_MYSQL_EXPIRES = {
    EXPIRED: "NOW(6) - INTERVAL 1 DAY + INTERVAL seq * 1000 MICROSECOND",
    LIVE: "NOW(6) + INTERVAL 1 DAY",
}

_LOSE_LEASES = f"""
INSERT INTO {TABLE} (
    scope, idem_key, operation, request_hash, request_method, request_path, status,
    owner_token, lease_until, response_headers, resource_id, attempts, recovery_attempts,
    version, created_at, updated_at
)
SELECT
    'user:1:' || %(operation)s, 'lost-' || g, %(operation)s, decode(md5(g::text), 'hex'), 'POST',
    '/bench/orders/lease/', 'PROCESSING', decode(md5('lost' || g), 'hex'),
    now() - interval '5 minutes',
    '[]'::jsonb, '', 1, 0, 1, now() - interval '10 minutes', now() - interval '10 minutes'
FROM generate_series(1, %(rows)s) AS g
"""
RAW_BATCH_DELETE = f"""
DELETE FROM {TABLE} WHERE id IN (
    SELECT id FROM {TABLE} WHERE expires_at < now() LIMIT %s
)
"""
# MariaDB/MySQL refuse LIMIT in an IN subquery, and take it on the DELETE itself.
RAW_BATCH_DELETE_MYSQL = f"DELETE FROM {TABLE} WHERE expires_at < NOW(6) LIMIT %s"
# What drf-idempotency and drf-idempotencykey run: every expired row in one statement.
UNBATCHED_DELETE = f"DELETE FROM {TABLE} WHERE expires_at < CURRENT_TIMESTAMP"


def setup_django(database: Database, alternatives: Path | None) -> None:
    root = str(Path(__file__).resolve().parent.parent)
    for path in [root, str(alternatives) if alternatives else None]:
        if path and path not in sys.path:
            sys.path.insert(0, path)
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["DATABASE_URL"] = database.url
    import logging

    import django

    django.setup()
    # Recovery logs every record it settles; the table says how many.
    logging.getLogger("idempotency").setLevel(logging.ERROR)


@contextmanager
def migrated(name: str, *target: str, keep: bool = False) -> Iterator[Database]:
    """The database ``name`` made anew on ``BENCH_DATABASE_URL``'s server, Django set up on it
    and migrated (to ``target``, an app and a migration, when given); dropped afterwards
    unless ``keep``."""
    from django.core.management import call_command

    database = Database.named(name)
    database.recreate()
    try:
        setup_django(database, None)
        call_command("migrate", *target, verbosity=0)
        yield database
    finally:
        if not keep:
            database.drop()


def mysql() -> bool:
    from django.db import connection

    return connection.vendor == "mysql"


def execute(sql: str, params: Any = None) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


BULK_SCOPE = "'user:' || (g %% 1000) || ':bench.bulk'"
# The 16 bytes a record keeps of a request's fingerprint.
BULK_HASH = "decode(md5(g::text), 'hex')"


def fill(
    rows: int, expires: str, tag: str, scope: str = BULK_SCOPE, request_hash: str = BULK_HASH
) -> None:
    """``rows`` finished records, keys ``md5(tag || g)``; scope and hash are SQL over ``g``."""
    if mysql():
        assert (scope, request_hash) == (BULK_SCOPE, BULK_HASH), "PostgreSQL's SQL only"
        sql = _FILL_MYSQL.replace("__EXPIRES__", _MYSQL_EXPIRES[expires])
        execute(sql.replace("__ROWS__", str(int(rows))), {"tag": tag})
        execute(f"ANALYZE TABLE {TABLE}")
        return
    sql = _FILL.replace("__EXPIRES__", expires).replace("__SCOPE__", scope)
    execute(sql.replace("__HASH__", request_hash), {"rows": rows, "tag": tag})
    execute(f"ANALYZE {TABLE}")


def clear_bulk() -> None:
    execute(f"DELETE FROM {TABLE} WHERE operation IN ('bench.bulk', %s)", [LOST_LEASE_OPERATION])


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def explain(sql: str, params: Any = None) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` inside a transaction that is rolled back.

    On MariaDB ``ANALYZE FORMAT=JSON``: it too runs the statement, and says what it read.
    It takes the statement alone: a setting of its own (``SET STATEMENT ... FOR``, the
    store's lock wait) is left out.
    """
    from django.db import connection, transaction

    analyze = "ANALYZE FORMAT=JSON" if mysql() else "EXPLAIN (ANALYZE, BUFFERS)"
    sql = re.sub(r"^SET STATEMENT .+? FOR ", "", sql)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"{analyze} {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


_FILL_DRF_IDEMPOTENCYKEY = """
INSERT INTO drf_idempotencykey_idempotencykey (
    key, last_accessed_at, accessed_count, user_id, request_method, request_body, request_path,
    request_digest, response_code, response_body, response_content_type, response_headers,
    response_cookies, response_saved_at, created_at, modified_at
)
SELECT
    md5(%(tag)s || g)::uuid, now() - interval '2 days', 1, (SELECT min(id) FROM auth_user),
    'POST', '{"sku": "bench", "quantity": 1}', '/bench/orders/drf-idempotencykey/',
    decode(md5(g::text), 'hex'), 201, '{"id": ' || g || ', "sku": "bench", "quantity": 1}',
    'application/json', '{}'::jsonb, '{}'::jsonb, now() - interval '2 days',
    now() - interval '2 days' + g * interval '1 millisecond', now() - interval '2 days'
FROM generate_series(1, %(rows)s) AS g
"""
_FILL_DRF_IDEMPOTENCY = """
INSERT INTO drf_idempotency_idempotencyrecord (
    key, fingerprint, status, response_status_code, response_headers, response_body,
    created_at, completed_at, expires_at
)
SELECT
    md5(%(tag)s || g), md5(g::text), 'completed', 201,
    '{"Content-Type": "application/json"}'::jsonb,
    encode(convert_to('{"id": ' || g || ', "sku": "bench", "quantity": 1}', 'UTF8'), 'base64'),
    now() - interval '2 days', now() - interval '2 days',
    now() - interval '1 day' + g * interval '1 millisecond'
FROM generate_series(1, %(rows)s) AS g
"""


@dataclass(frozen=True)
class Deleter:
    """One way of deleting ``rows`` expired records, with how to make them first."""

    name: str
    fill: Callable[[int, str], None]
    run: Callable[[], int]
    plan: Callable[[], str] | None = None


@dataclass
class PurgeResult:
    seconds: dict[str, list[float]] = field(default_factory=dict)
    deleted: dict[str, list[int]] = field(default_factory=dict)
    plans: dict[str, str] = field(default_factory=dict)


PURGE = "idempotency.retention.purge()"
RAW = "raw batched DELETE"
UNBATCHED = "one unbatched DELETE"


def raw_batched_delete(batch_size: int) -> int:
    """What a DBA would write: delete expired rows by primary key, a batch per statement."""
    deleted = 0
    statement = RAW_BATCH_DELETE_MYSQL if mysql() else RAW_BATCH_DELETE
    while True:
        count = execute(statement, [batch_size])
        deleted += count
        if count < batch_size:
            return deleted


def deleters(batch_size: int, alternatives: list[str]) -> list[Deleter]:
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from idempotency.retention import purge

    def ours(rows: int, tag: str) -> None:
        fill(rows, EXPIRED, tag)

    def purge_plan() -> str:
        # The statement of purge's second batch (it starts where the first ended),
        # captured in a transaction that is rolled back, then explained.
        with CaptureQueriesContext(connection) as captured:
            try:
                with transaction.atomic():
                    purge(batch_size=batch_size, progress=_stop_after(2 * batch_size))
                    # Fewer rows than two batches (--quick): purge ended without _Enough,
                    # and the timed run must still find every row.
                    transaction.set_rollback(True)
            except _Enough:
                pass
        sql = [query["sql"] for query in captured if "DELETE" in query["sql"]][-1]
        return f"{sql}\n\n{explain(sql)}"

    def raw_plan() -> str:
        statement = RAW_BATCH_DELETE_MYSQL if mysql() else RAW_BATCH_DELETE
        return f"{statement.strip()}\n\n{explain(statement, [batch_size])}"

    chosen = [
        Deleter(PURGE, ours, lambda: purge(batch_size=batch_size), purge_plan),
        Deleter(RAW, ours, lambda: raw_batched_delete(batch_size), raw_plan),
        # The peers' way on this app's own table: the reference on MariaDB, where the
        # peers' fills (PostgreSQL's SQL) do not run.
        Deleter(UNBATCHED, ours, lambda: execute(UNBATCHED_DELETE)),
    ]
    if "drf-idempotencykey" in alternatives:
        chosen.append(
            Deleter(
                "drf-idempotencykey: manage.py cleanup_idempotency_keys",
                lambda rows, tag: _fill_other(_FILL_DRF_IDEMPOTENCYKEY, rows, tag),
                lambda: _command("cleanup_idempotency_keys"),
            )
        )
    if "drf-idempotency" in alternatives:
        chosen.append(
            Deleter(
                "drf-idempotency: manage.py cleanup_expired_idempotency_keys",
                lambda rows, tag: _fill_other(_FILL_DRF_IDEMPOTENCY, rows, tag),
                lambda: _command("cleanup_expired_idempotency_keys"),
            )
        )
    return chosen


class _Enough(Exception):
    pass


def _stop_after(rows: int) -> Callable[[Progress], None]:
    def progress(current: Progress) -> None:
        if current.done >= rows:
            raise _Enough

    return progress


def _fill_other(sql: str, rows: int, tag: str) -> None:
    execute(sql, {"rows": rows, "tag": tag})
    table = sql.split("INSERT INTO ", 1)[1].split()[0]
    execute(f"ANALYZE {table}")


def _command(name: str) -> int:
    """Run a cleanup command; the count of deleted rows is the number in its summary line."""
    from django.core.management import call_command

    output = StringIO()
    call_command(name, stdout=output)
    found = re.search(r"\d+", output.getvalue())
    return int(found.group()) if found else 0


def purge_side_by_side(rows: int, rounds: int, chosen: list[Deleter]) -> PurgeResult:
    """Each deleter on freshly made rows, in rotating order, ``rounds`` times."""
    result = PurgeResult()
    for round_ in range(rounds):
        for deleter in rotated(chosen, round_):
            deleter.fill(rows, f"purge-{round_}-{deleter.name}")
            if deleter.plan is not None and deleter.name not in result.plans:
                result.plans[deleter.name] = deleter.plan()
            seconds, deleted = timed(deleter.run)
            result.seconds.setdefault(deleter.name, []).append(seconds)
            result.deleted.setdefault(deleter.name, []).append(deleted)
            clear_bulk()
    return result


@dataclass
class RecoveryResult:
    finished_rows: int
    expired_leases: int
    seconds: float = 0.0
    report: dict[str, Any] = field(default_factory=dict)
    idle_seconds: float = 0.0  # a pass with no expired lease among the same rows
    plans: list[str] = field(default_factory=list)


def recovery_scan(rows: int, leases: int) -> RecoveryResult:
    """One ``recover_expired`` pass over ``rows`` finished records and ``leases`` lost ones."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from idempotency.recovery import recover_expired

    result = RecoveryResult(finished_rows=rows, expired_leases=leases)
    fill(rows, LIVE, tag="recovery")
    execute(_LOSE_LEASES, {"rows": leases, "operation": LOST_LEASE_OPERATION})
    execute(f"ANALYZE {TABLE}")
    # The queries of a pass, captured in a transaction rolled back, then explained.
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        recover_expired()
        transaction.set_rollback(True)
    scans = [query["sql"] for query in captured if query["sql"].lstrip().startswith("SELECT")]
    result.plans.append(f"{scans[0]}\n\n{explain(scans[0])}")
    result.seconds, report = timed(recover_expired)
    result.report = report.as_dict()
    result.idle_seconds, _ = timed(recover_expired)
    clear_bulk()
    return result
