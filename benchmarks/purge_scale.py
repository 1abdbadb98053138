#!/usr/bin/env python
"""Purge at scale, under load: ``.venv/bin/python benchmarks/purge_scale.py``.

Serves the example project under gunicorn and keeps a steady, bounded stream
of protected creates going (``--rate`` requests per second, each with a new
key) while 10^7 expired records (``--records``) are purged, once per way of
purging, on a freshly filled table each time:

- this app's batched purge, ``idempotency.retention.purge()`` (what the
  ``idempotency_cleanup`` command and the beat task run), as configured: each
  batch sized to last ``PURGE_BATCH_SECONDS``, at most ``PURGE_BATCH_SIZE`` rows
  (``--batch-size`` sets that bound);
- a raw batched ``DELETE`` (``bulk.RAW_BATCH_DELETE``: by id, ``LIMIT n``, each
  batch committed, no ``SKIP LOCKED``) of the median batch size the purge chose,
  what a DBA would write by hand;
- the purge as it was before batches were sized by time (``BEFORE``: batches of
  1,000 by id, each locked with ``FOR UPDATE SKIP LOCKED`` then deleted, from
  where the last ended), for the creates' latency against today's;
- one unbatched ``DELETE`` of every expired row, as the cleanup commands of
  drf-idempotency and drf-idempotencykey run it (``QuerySet.filter(...).delete()``),
  here on this app's table so that the creates meet it.

Beside the creates, a thin stream of late retries (``--retry-rate``) re-sends
requests whose records have expired but may not be purged yet: each is
replayed (not purged yet), runs again (purged), or waits on the purge's row
lock (bounded by ``LOCK_TIMEOUT``, then 409).

For each: its rows per second and the longest batch (transaction), the
creates' (the claims') latency during the purge against the same load just
before it on the same table, what the late retries met, the purge's duration,
and the table's size before, after the purge and after ``VACUUM`` (itself run
under the load).
Prints a markdown document and writes it to ``--output``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bulk  # noqa: E402
from benchmarks.http_scenarios import OURS, order_call  # noqa: E402
from benchmarks.loadgen import Call, Timed, paced  # noqa: E402
from benchmarks.server import Database, environment, gunicorn, prepare  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402

SETTLE = 1.0  # seconds of load before and after the action, inside its window


@dataclass(frozen=True)
class Strategy:
    name: str
    run: Callable[[Batches], int]  # deletes the expired records, returns how many


@dataclass
class Batches:
    """Each batch (transaction) of a way of purging: its rows and seconds."""

    rows: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def add(self, rows: int, seconds: float) -> None:
        self.rows.append(rows)
        self.seconds.append(seconds)

    @property
    def median_rows(self) -> int:
        return int(statistics.median(self.rows)) if self.rows else 0


@dataclass
class Window:
    """The creates sent while one thing ran (or while nothing did)."""

    seconds: float
    replies: list[Timed]

    @property
    def latencies(self) -> list[float]:
        return [reply.seconds * 1000 for reply in self.replies if 200 <= reply.status < 300]

    @property
    def errors(self) -> int:
        return sum(1 for reply in self.replies if not 200 <= reply.status < 300)

    def p(self, q: float) -> float:
        return percentile(self.latencies, q)


@dataclass
class Retries:
    """The late retries sent while one thing ran: what each met."""

    replies: list[Timed]

    def count(self, kind: str) -> int:
        return sum(1 for reply in self.replies if _kind(reply) == kind)

    def p(self, q: float) -> float:
        return percentile([reply.seconds * 1000 for reply in self.replies], q)


def _kind(reply: Timed) -> str:
    if 200 <= reply.status < 300:
        return "replayed" if reply.replayed else "ran again"
    return "in use" if reply.status == 409 else "error"


@dataclass
class Measured:
    strategy: str
    fill_seconds: float = 0.0
    deleted: int = 0
    baseline: Window = field(default_factory=lambda: Window(0.0, []))
    purge: Window = field(default_factory=lambda: Window(0.0, []))
    retries: Retries = field(default_factory=lambda: Retries([]))
    vacuum: Window = field(default_factory=lambda: Window(0.0, []))
    sizes: dict[str, int] = field(default_factory=dict)  # bytes, table with indexes
    batches: Batches = field(default_factory=Batches)
    dead_rows: int = 0  # after the purge, before VACUUM
    free_after_vacuum: float = 0.0  # percent of the table, reusable by new rows


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.mariadb:
        return mariadb_main(args)
    database = Database.named(args.database)
    database.recreate()
    try:
        env = environment(database, None, run_id=uuid.uuid4().hex[:12])
        prepare(env)
        bulk.setup_django(database, None)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with gunicorn(env, args.workers, args.threads, args.output.parent / "gunicorn.log") as port:
            load = Load("127.0.0.1", port, args.connections, args.rate)
            load.during(lambda: time.sleep(2))  # every worker connects and imports, unmeasured
            load.retry = _late_retries(load, args)
            results = [measure(strategy, args, load) for strategy in strategies(args.batch_size)]
            results.insert(1, measure(raw_batched(results[0].batches.median_rows), args, load))
        setup = _setup(database)
    finally:
        if not args.keep_database:
            database.drop()
    document = render(results, args, setup)
    print(document)
    args.output.write_text(document)
    print(f"(written to {args.output})", file=sys.stderr)
    return 0


class Load:
    """The steady stream of creates (and late retries), switched on around one action."""

    def __init__(self, host: str, port: int, connections: int, rate: float) -> None:
        self.host, self.port, self.connections, self.rate = host, port, connections, rate
        self.retry: Callable[[], Call] | None = None  # the next late retry
        self.retry_rate = 0.0

    def during(self, action: Callable[[], Any]) -> tuple[Window, Retries, Any]:
        """Run ``action`` under the load; the windows hold what was sent while it ran."""
        stop = threading.Event()
        creates: list[Timed] = []
        retries: list[Timed] = []
        streams = [(creates, _create, self.connections, self.rate)]
        if self.retry is not None and self.retry_rate:
            streams.append((retries, self.retry, 1, self.retry_rate))
        threads = [
            threading.Thread(
                target=lambda out, call, connections, rate: out.extend(
                    paced(self.host, self.port, call, connections, rate, stop)
                ),
                args=stream,
                daemon=True,
            )
            for stream in streams
        ]
        for thread in threads:
            thread.start()
        time.sleep(SETTLE)
        began = time.monotonic()
        try:
            result = action()
        finally:
            ended = time.monotonic()
            time.sleep(SETTLE)
            stop.set()
            for thread in threads:
                thread.join()

        def inside(replies: list[Timed]) -> list[Timed]:
            return [reply for reply in replies if began <= reply.sent <= ended]

        return Window(ended - began, inside(creates)), Retries(inside(retries)), result


def _create() -> Call:
    return order_call(OURS, str(uuid.uuid4()))


PROBE_KEY = "purge-scale-probe"
TAG = "scale"


def _late_retries(load: Load, args: argparse.Namespace) -> Callable[[], Call]:
    """Requests that repeat expired records' keys, each key once, in random order.

    Every ``args.retry_every``-th filled record is made to belong to the benchmark
    user's scope with this very request's hash (read from one real create), so
    that re-sending its key is a true retry of it.
    """
    paced(load.host, load.port, lambda: order_call(OURS, PROBE_KEY), 1, 10, _after(0.05))
    scope, request_hash = _row(
        f"SELECT scope, request_hash FROM {bulk.TABLE} WHERE idem_key = %s", [PROBE_KEY]
    )
    every = args.retry_every
    args.fill_scope = _every(every, _literal(scope), bulk.BULK_SCOPE)
    args.fill_hash = _every(every, _literal(request_hash), bulk.BULK_HASH)
    numbers = list(range(every, args.records + 1, every))
    random.Random(12).shuffle(numbers)
    keys = iter(hashlib.md5(f"{TAG}{g}".encode()).hexdigest() for g in numbers)
    load.retry_rate = args.retry_rate
    lock = threading.Lock()

    def retry() -> Call:
        with lock:
            return order_call(OURS, next(keys, str(uuid.uuid4())))

    return retry


def _after(seconds: float) -> threading.Event:
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    return stop


def _every(every: int, chosen: str, otherwise: str) -> str:
    return f"CASE WHEN g %% {every} = 0 THEN {chosen} ELSE {otherwise} END"


def _literal(value: str | bytes) -> str:
    if isinstance(value, bytes):  # a digest column (bytea)
        return f"'\\x{value.hex()}'::bytea"
    return "'" + value.replace("'", "''").replace("%", "%%") + "'"


def strategies(batch_size: int | None) -> list[Strategy]:
    from django.utils import timezone

    from idempotency import retention
    from idempotency.conf import idempotency_settings
    from idempotency.models import IdempotencyRecord

    bound = batch_size or idempotency_settings.PURGE_BATCH_SIZE

    def ours(batches: Batches) -> int:
        # Each batch as the purge itself times it (its transaction, to the commit's end),
        # with no progress callback: that would add a count(*) of the expired rows first.
        class Recorded(retention.BatchSizer):
            def observe(self, rows: int, seconds: float) -> int:
                if rows:
                    batches.add(rows, seconds)
                return super().observe(rows, seconds)

        plain, retention.BatchSizer = retention.BatchSizer, Recorded  # type: ignore[misc]
        try:
            return retention.purge(batch_size=bound)
        finally:
            retention.BatchSizer = plain  # type: ignore[misc]

    def single_delete(batches: Batches) -> int:
        # What both alternatives' cleanup commands run: one QuerySet.delete(),
        # which Django sends as one DELETE ... WHERE expires_at <= %s.
        started = time.perf_counter()
        deleted, _ = IdempotencyRecord.objects.filter(expires_at__lte=timezone.now()).delete()
        batches.add(deleted, time.perf_counter() - started)
        return deleted

    return [
        Strategy(
            f"idempotency.retention.purge(), {idempotency_settings.PURGE_BATCH_SECONDS:g} s "
            f"batches of at most {bound:,}",
            ours,
        ),
        Strategy("the purge before (batches of 1,000 by id, locked first)", before),
        Strategy("one unbatched DELETE (as drf-idempotency, drf-idempotencykey)", single_delete),
    ]


# The purge's statement before batches were sized by time, with its keyset on expires_at.
BEFORE = f"""
WITH gone AS (DELETE FROM {bulk.TABLE} WHERE id IN (
    SELECT id FROM {bulk.TABLE}
    WHERE expires_at IS NOT NULL AND expires_at < now()
      AND status IN ('SUCCEEDED', 'FAILED_FINAL', 'FAILED_RETRYABLE')
      AND expires_at >= coalesce(%(floor)s::timestamptz, '-infinity')
    ORDER BY expires_at LIMIT 1000 FOR UPDATE SKIP LOCKED
) RETURNING expires_at) SELECT count(*), max(expires_at) FROM gone
"""


def before(batches: Batches) -> int:
    """``BEFORE`` a batch at a time, each in its own transaction (autocommit)."""
    deleted, floor = 0, None
    while True:
        started = time.perf_counter()
        count, floor = _row(BEFORE, {"floor": floor})
        batches.add(count, time.perf_counter() - started)
        deleted += count
        if count < 1000:
            return deleted


def raw_batched(size: int) -> Strategy:
    """``bulk.RAW_BATCH_DELETE`` in autocommit, batches of ``size``, each timed."""
    size = max(size, 1)

    def run(batches: Batches) -> int:
        deleted = 0
        while True:
            started = time.perf_counter()
            count = bulk.execute(bulk.RAW_BATCH_DELETE, [size])
            batches.add(count, time.perf_counter() - started)
            deleted += count
            if count < size:
                return deleted

    return Strategy(f"raw batched DELETE, batches of {size:,} (the purge's median)", run)


def measure(strategy: Strategy, args: argparse.Namespace, load: Load) -> Measured:
    _step(f"{strategy.name}: filling {args.records:,} expired records")
    result = Measured(strategy.name)
    bulk.execute(f"TRUNCATE {bulk.TABLE} CASCADE")  # its steps reference it
    result.fill_seconds, _ = bulk.timed(
        lambda: bulk.fill(args.records, bulk.EXPIRED, TAG, args.fill_scope, args.fill_hash)
    )
    bulk.execute("CHECKPOINT")  # the fill's dirty pages are not written during the windows
    result.sizes["filled"] = _size()
    _step(f"{strategy.name}: {args.baseline_seconds} s of creates without a purge")
    result.baseline, _, _ = load.during(lambda: time.sleep(args.baseline_seconds))
    _step(f"{strategy.name}: purging under the same load")
    result.purge, result.retries, result.deleted = load.during(lambda: strategy.run(result.batches))
    result.sizes["purged"] = _size()
    result.dead_rows = _dead_rows()
    _step(f"{strategy.name}: VACUUM under the same load")
    result.vacuum, _, _ = load.during(lambda: bulk.execute(f"VACUUM {bulk.TABLE}"))
    result.sizes["vacuumed"] = _size()
    result.free_after_vacuum = _free_percent()
    return result


def _size() -> int:
    return int(_scalar("SELECT pg_total_relation_size(%s)", [bulk.TABLE]))


def _dead_rows() -> int:
    time.sleep(1.5)  # statistics reach pg_stat_user_tables within a second of the commit
    found = _scalar("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s", [bulk.TABLE])
    return int(found or 0)


def _free_percent() -> float:
    """The share of the table VACUUM left reusable (pgstattuple_approx reads the free space map)."""
    try:
        bulk.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        found = _scalar("SELECT approx_free_percent FROM pgstattuple_approx(%s)", [bulk.TABLE])
    except Exception:  # the extension is not installed on this server: say nothing
        return float("nan")
    return float(found)


def _scalar(sql: str, params: list[Any]) -> Any:
    row = _row(sql, params)
    return None if row is None else row[0]


def _row(sql: str, params: list[Any]) -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def render(results: list[Measured], args: argparse.Namespace, setup: list[str]) -> str:
    parts = ["# Purge at scale, under load", "", *(f"- {line}" for line in setup)]
    parts += [
        f"- Load: {args.rate:g} protected creates per second (a new key each) over "
        f"{args.connections} keep-alive connections, paced; {args.baseline_seconds} s "
        "without a purge, then the purge, then VACUUM, each on the same table.",
        f"- Records: {args.records:,} expired records made by one INSERT ... SELECT "
        "generate_series and ANALYZEd, on a truncated table, before each purge.",
        "",
        "## Creates while purging",
        "",
        "| purge | rows deleted | seconds | rows/s | batches | median batch rows "
        "| longest batch s | creates during | p50 ms | p95 ms | p99 ms "
        "| max ms | errors | p50 ms without | p95 ms without | p99 ms without "
        "| p95 during / without |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        purge, base, batches = result.purge, result.baseline, result.batches
        parts.append(
            f"| {result.strategy} | {result.deleted:,} | {purge.seconds:.2f} "
            f"| {_rate(result):,.0f} | {len(batches.rows)} | {batches.median_rows:,} "
            f"| {max(batches.seconds, default=0):.3f} "
            f"| {len(purge.replies)} | {purge.p(50):.1f} | {purge.p(95):.1f} | {purge.p(99):.1f} "
            f"| {max(purge.latencies, default=0):.1f} | {purge.errors} | {base.p(50):.1f} "
            f"| {base.p(95):.1f} | {base.p(99):.1f} | {_ratio(purge.p(95), base.p(95))} |"
        )
    parts += [
        "",
        "## Late retries while purging",
        "",
        f"Requests re-sending the key of an expired record ({args.retry_rate:g} per second, "
        "each key once): replayed (its record not purged yet), ran again (purged: the "
        "window had passed), or in use (waited on the purge's row lock past "
        "LOCK_TIMEOUT, 409).",
        "",
        "| purge | late retries | replayed | ran again | in use (409) | errors "
        "| p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        retries = result.retries
        parts.append(
            f"| {result.strategy} | {len(retries.replies)} | {retries.count('replayed')} "
            f"| {retries.count('ran again')} | {retries.count('in use')} "
            f"| {retries.count('error')} | {retries.p(50):.1f} | {retries.p(99):.1f} "
            f"| {max((r.seconds * 1000 for r in retries.replies), default=0):.1f} |"
        )
    parts += [
        "",
        "## Table size (with its indexes) and VACUUM",
        "",
        "| purge | fill s | filled | after purge | dead rows | VACUUM s (under load) "
        "| p99 ms during VACUUM | after VACUUM | free after VACUUM |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        sizes = result.sizes
        parts.append(
            f"| {result.strategy} | {result.fill_seconds:.0f} | {_mb(sizes['filled'])} "
            f"| {_mb(sizes['purged'])} | {result.dead_rows:,} | {result.vacuum.seconds:.1f} "
            f"| {result.vacuum.p(99):.1f} | {_mb(sizes['vacuumed'])} "
            f"| {result.free_after_vacuum:.0f}% |"
        )
    parts += ["", "## Side by side", "", *_side_by_side(results), ""]
    return "\n".join(parts)


def _side_by_side(results: list[Measured]) -> list[str]:
    ours, raw, earlier, single = results
    return [
        "| comparison | ratio |",
        "|---|---:|",
        f"| rows/s: purge() / one unbatched DELETE | {_ratio(_rate(ours), _rate(single))} |",
        f"| rows/s: purge() / raw batched DELETE | {_ratio(_rate(ours), _rate(raw))} |",
        f"| rows/s: purge() / the purge before | {_ratio(_rate(ours), _rate(earlier))} |",
        f"| creates' p95 during the purge: purge() / the purge before "
        f"| {_ratio(ours.purge.p(95), earlier.purge.p(95))} |",
        f"| creates' p95 during the purge: purge() / one DELETE "
        f"| {_ratio(ours.purge.p(95), single.purge.p(95))} |",
        f"| creates' p99 during the purge: purge() / one DELETE "
        f"| {_ratio(ours.purge.p(99), single.purge.p(99))} |",
        *(
            f"| creates' p95 during / without the purge: {result.strategy} "
            f"| {_ratio(result.purge.p(95), result.baseline.p(95))} |"
            for result in results
        ),
    ]


def _rate(result: Measured) -> float:
    return result.deleted / result.purge.seconds if result.purge.seconds else 0.0


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def _mb(size: int) -> str:
    return f"{size / 1024 / 1024:,.0f} MB"


def _setup(database: Database) -> list[str]:
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return [
        f"Machine: {os.cpu_count()} cores, load average at the end {load}; shared with "
        "other work: compare the ratios of one run, not numbers across runs.",
        f"PostgreSQL {database.scalar('SHOW server_version')}, autovacuum "
        f"{database.scalar('SHOW autovacuum')}, shared_buffers "
        f"{database.scalar('SHOW shared_buffers')}, max_wal_size "
        f"{database.scalar('SHOW max_wal_size')}.",
    ]


# MariaDB: the purge against one unbatched DELETE of the same rows, without the load
# (the example project's server runs on PostgreSQL here). MariaDB's Sequence engine
# makes the rows, as generate_series does on PostgreSQL: the same shapes as bulk.py's.
MARIADB_FILL = f"""
INSERT INTO {bulk.TABLE} (
    scope, idem_key, operation, request_hash, request_method, request_path, status,
    owner_token, lease_until, response_status, response_headers, response_body, resource_id,
    attempts, recovery_attempts, version, created_at, updated_at, completed_at, expires_at
)
SELECT
    concat('user:', seq %% 1000, ':bench.bulk'), md5(concat(%s, seq)), 'bench.bulk',
    sha2(seq, 256), 'POST', '/api/orders/', 'SUCCEEDED', md5(concat('owner', seq)), NULL, 201,
    '[["Content-Type", "application/json"]]',
    concat('{{"id": ', seq, ', "url": "http://127.0.0.1/api/orders/', seq,
        '/", "sku": "bench", "quantity": 1, "status": "PENDING", ',
        '"created_at": "2026-01-01T00:00:00Z", "paid_at": null}}'),
    seq, 1, 0, 2, utc_timestamp(6) - interval 2 day, utc_timestamp(6) - interval 2 day,
    utc_timestamp(6) - interval 2 day,
    utc_timestamp(6) - interval 1 day + interval seq * 1000 microsecond
FROM seq_1_to_{{rows}}
"""


def mariadb_main(args: argparse.Namespace) -> int:
    """``--mariadb URL``: on a database of that server, each way of purging ``--rounds`` times."""
    from urllib.parse import urlsplit

    import MySQLdb

    server = urlsplit(args.mariadb)
    admin = MySQLdb.connect(
        host=server.hostname or "127.0.0.1",
        port=server.port or 3306,
        user=server.username or "root",
        password=server.password or "",
    )
    admin.cursor().execute(f"DROP DATABASE IF EXISTS {args.database}")
    admin.cursor().execute(f"CREATE DATABASE {args.database}")
    try:
        _mariadb_django(server._replace(path=f"/{args.database}").geturl())
        document = _mariadb_rounds(args)
    finally:
        if not args.keep_database:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {args.database}")
    print(document)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(document)
    print(f"(written to {args.output})", file=sys.stderr)
    return 0


def _mariadb_django(url: str) -> None:
    import logging

    import django
    from django.core.management import call_command

    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["DATABASE_URL"] = url
    django.setup()
    logging.getLogger("idempotency").setLevel(logging.ERROR)
    call_command("migrate", verbosity=0)


def _mariadb_rounds(args: argparse.Namespace) -> str:
    from django.utils import timezone

    from idempotency.models import IdempotencyRecord

    ours = strategies(args.batch_size)[0]

    def single_delete(batches: Batches) -> int:
        started = time.perf_counter()
        deleted, _ = IdempotencyRecord.objects.filter(expires_at__lte=timezone.now()).delete()
        batches.add(deleted, time.perf_counter() - started)
        return deleted

    ways = [ours, Strategy("one unbatched DELETE (QuerySet.delete())", single_delete)]
    seconds: dict[str, list[float]] = {way.name: [] for way in ways}
    batches: dict[str, Batches] = {way.name: Batches() for way in ways}
    for round_ in range(args.rounds):
        for way in ways[round_ % 2 :] + ways[: round_ % 2]:  # each goes first in turn
            _step(f"{way.name}: filling {args.records:,} expired records")
            bulk.execute(f"DELETE FROM {bulk.TABLE}")
            bulk.execute(MARIADB_FILL.replace("{rows}", str(args.records)), [f"{round_}{way.name}"])
            bulk.execute(f"ANALYZE TABLE {bulk.TABLE}")
            _step(f"{way.name}: purging")
            took, _ = bulk.timed(lambda way=way: way.run(batches[way.name]))
            seconds[way.name].append(took)
    return _mariadb_render(args, ways, seconds, batches)


def _mariadb_render(
    args: argparse.Namespace,
    ways: list[Strategy],
    seconds: dict[str, list[float]],
    batches: dict[str, Batches],
) -> str:
    single = statistics.median(seconds[ways[1].name])
    parts = [
        "# Purge on MariaDB, against one unbatched DELETE",
        "",
        f"- {args.records:,} expired records made by one INSERT ... SELECT FROM seq_1_to_n, "
        f"then ANALYZE TABLE, before each; {args.rounds} rounds, each way first in turn; no load.",
        f"- Machine: {os.cpu_count()} cores, load average at the end "
        + ", ".join(f"{value:.2f}" for value in os.getloadavg()),
        "",
        "| purge | seconds, each round | median | rows/s / one DELETE's | batches "
        "| median batch rows | longest batch s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for way in ways:
        taken, done = seconds[way.name], batches[way.name]
        parts.append(
            f"| {way.name} | {', '.join(f'{value:.2f}' for value in taken)} "
            f"| {statistics.median(taken):.2f} | {single / statistics.median(taken):.2f} "
            f"| {len(done.rows)} | {done.median_rows:,} | {max(done.seconds, default=0):.3f} |"
        )
    return "\n".join([*parts, ""])


def _step(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--rate", type=float, default=40.0, help="creates per second")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--retry-rate", type=float, default=5.0, help="late retries per second")
    parser.add_argument(
        "--retry-every", type=int, default=1000, help="every n-th record can be retried late"
    )
    parser.add_argument("--baseline-seconds", type=float, default=30.0)
    parser.add_argument(
        "--batch-size", type=int, default=None, help="the purge's bound (PURGE_BATCH_SIZE)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--database",
        default=os.environ.get("BENCH_DATABASE", "bench_purge_scale"),
        help="database to create (and drop) on the server of BENCH_DATABASE_URL",
    )
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument(
        "--mariadb",
        metavar="URL",
        help="on MariaDB (mysql://root@127.0.0.1:3306/): the purge against one DELETE, no load",
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --mariadb: fills per way")
    parser.add_argument(
        "--output", type=Path, default=ROOT / "benchmarks" / "results" / "purge-scale.md"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
