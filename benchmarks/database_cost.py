#!/usr/bin/env python
"""What a protected create costs PostgreSQL: ``.venv/bin/python benchmarks/database_cost.py``.

The statements Django and this app send for one create of the example
project (``floor.build_scripts``), replayed by pgbench, side by side in one
run with the unprotected create, ``BEGIN; INSERT; COMMIT``, the protected
create with the record written once (``in_flight="run"``, issue 32: the order's
INSERT and the finished record's, no claim and no finish) and the protected
create as it was before issue 24 (its claim statement, its finish, on a copy
of the table with the indexes of then). Prints:

- the statements each create sends in its transaction;

- transactions per second of each, pgbench's simple protocol and prepared,
  in alternating rounds;
- what each transaction writes, from the write-ahead log itself
  (``pg_walinspect``: only the records of this run's tables and transactions
  count, whatever else the server does): WAL bytes, index entries written,
  heap updates made in place (HOT) or not, dead tuples left
  (``pg_stat_user_tables``);
- ``EXPLAIN (ANALYZE, BUFFERS)`` of the claim, the read of a taken key, the
  replay read, recovery's and purge's batches on a table of ``--rows`` records
  (10^7 by default; filled with ``generate_series``).

Needs PostgreSQL as ``benchmarks/run.py`` does, pgbench on PATH and the
``pg_walinspect`` extension (contrib, PostgreSQL 15+); creates and drops the
database ``idempotency_cost``. The exit status says whether the run worked.

On MariaDB/MySQL (a ``mysql://`` URL in ``BENCH_DATABASE_URL``, the ``mysql``
extra installed) the same measurements where the server has them: the
statements captured there, driven by ``benchmarks/mysql_floor.py`` (text
statements only: no prepared protocol), and what a transaction writes to
InnoDB's redo log in place of WAL. Neither the table before issue 24 nor the
plans (PostgreSQL's ``EXPLAIN``) are made there.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bulk, floor, mysql_floor  # noqa: E402
from benchmarks.cost_plans import plans  # noqa: E402
from benchmarks.server import Database, environment, prepare  # noqa: E402
from benchmarks.stats import rotated  # noqa: E402

BEFORE = "BEGIN; claim; INSERT; finish; COMMIT, as before issue 24"
BEFORE_TABLE = "idempotency_before_24"
# The record's indexes before issue 24: recovery's read status, the admin's too.
BEFORE_INDEXES = (
    'CREATE INDEX ON {t} ("lease_until") WHERE "status" = \'PROCESSING\'',
    'CREATE INDEX ON {t} ("expires_at") WHERE "expires_at" IS NOT NULL',
    'CREATE INDEX ON {t} ("status", "created_at")',
)
ORDER = [floor.UNPROTECTED, floor.TRANSACTION, floor.PROTECTED, floor.WRITTEN_ONCE, BEFORE]


@dataclass
class Work:
    """What one transaction wrote, on average over a run."""

    wal_bytes: list[float] = field(default_factory=list)
    full_page_bytes: list[float] = field(default_factory=list)
    index_entries: list[float] = field(default_factory=list)
    hot_updates: list[float] = field(default_factory=list)
    updates: list[float] = field(default_factory=list)
    dead_tuples: list[float] = field(default_factory=list)
    # Bytes without full-page images, by relation and record type: where the WAL goes.
    parts: dict[str, list[float]] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    database = Database.named(args.database)
    database.recreate()
    try:
        prepare(environment(database, None, uuid.uuid4().hex[:8]))
        bulk.setup_django(database, None)
        if database.mysql:
            _mysql_cost(database, args)
            return 0
        _before_table()
        scripts = floor.build_scripts()
        scripts[BEFORE] = _before_script(scripts[floor.PROTECTED])
        _print_scripts(scripts)
        tps = floor.measure(database, args.rounds, args.seconds, args.clients, scripts)
        print(_tps_table(tps, scripts), end="\n\n", flush=True)
        work = _work(database, scripts, args.rounds, args.transactions)
        print(_work_table(work, args.transactions), end="\n\n", flush=True)
        print(plans(args.rows), flush=True)
    finally:
        if not args.keep_database:
            database.drop()
    return 0


# MariaDB/MySQL: the same statements' speed, and the redo log for WAL


def _mysql_cost(database: Database, args: argparse.Namespace) -> None:
    scripts = mysql_floor.build_scripts()
    print(f"# What a protected create costs the database ({database.version})\n")
    print("The statements, as the driver sent them (one line each):\n")
    for name, script in scripts.items():
        print(f"{name}:\n\n```\n" + "\n".join(script) + "\n```\n")
    tps = mysql_floor.measure(database, args.rounds, args.seconds, args.clients, scripts)
    print(_mysql_tps_table(tps, scripts), end="\n\n", flush=True)
    redo = mysql_floor.redo(database, scripts, args.rounds, args.transactions)
    print(_redo_table(redo, args.transactions), flush=True)


MYSQL_ORDER = [floor.UNPROTECTED, floor.TRANSACTION, floor.PROTECTED, floor.WRITTEN_ONCE]
MYSQL_PAIRS = [
    ("protected / BEGIN; INSERT; COMMIT", floor.PROTECTED, floor.TRANSACTION),
    ("written once / BEGIN; INSERT; COMMIT", floor.WRITTEN_ONCE, floor.TRANSACTION),
    ("written once / protected", floor.WRITTEN_ONCE, floor.PROTECTED),
    ("protected / INSERT alone", floor.PROTECTED, floor.UNPROTECTED),
]


def _mysql_tps_table(result: floor.FloorResult, scripts: dict[str, list[str]]) -> str:
    def simple(name: str) -> str:
        return floor.measurement(name, mysql_floor.PROTOCOL)

    rows = [
        f"## Transactions per second ({result.clients} clients, median of the rounds)",
        "",
        "| statements | sent | text protocol | rounds |",
        "|---|---:|---:|---|",
    ]
    for name in MYSQL_ORDER:
        runs = ", ".join(f"{value:,.0f}" for value in result.tps[simple(name)])
        sent = mysql_floor.statements(scripts[name])
        rows.append(f"| {name} | {sent} | {result.median(simple(name)):,.0f} | {runs} |")
    rows += ["", "| ratio (median of the rounds' ratios, lowest to highest) | text protocol |"]
    rows.append("|---|---:|")
    for label, top, bottom in MYSQL_PAIRS:
        mid, low, high = result.paired(simple(top), simple(bottom))
        rows.append(f"| {label} | {mid:.2f}x ({low:.2f} to {high:.2f}) |")
    return "\n".join(rows)


def _redo_table(redo: mysql_floor.Redo, transactions: int) -> str:
    rows = [
        f"## What one transaction writes (1 client, {transactions:,} transactions a run, "
        "median of the runs)",
        "",
        "InnoDB's redo log, WAL's counterpart: Innodb_lsn_current before and after each "
        "run, the server's whole log (a quiet server is assumed).",
        "",
        "| statements | redo bytes | runs |",
        "|---|---:|---|",
    ]
    for name in MYSQL_ORDER:
        runs = ", ".join(f"{value:,.0f}" for value in redo.bytes_per_transaction[name])
        rows.append(f"| {name} | {redo.median(name):,.0f} | {runs} |")
    ratios = ", ".join(
        f"{label} {redo.median(top) / redo.median(bottom):.2f}x"
        for label, top, bottom in MYSQL_PAIRS
    )
    return "\n".join([*rows, "", f"Redo bytes: {ratios}."])


# The protected create as it was: its table, claim and finish


def _before_table() -> None:
    table = bulk.TABLE
    bulk.execute(f"CREATE TABLE {BEFORE_TABLE} (LIKE {table} INCLUDING ALL)")
    for name in _secondary_indexes(BEFORE_TABLE):
        bulk.execute(f'DROP INDEX "{name}"')
    for statement in BEFORE_INDEXES:
        bulk.execute(statement.format(t=BEFORE_TABLE))


def _secondary_indexes(table: str) -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexrelid::regclass::text FROM pg_index "
            "WHERE indrelid = %s::regclass AND NOT indisunique",
            [table],
        )
        return [row[0] for row in cursor.fetchall()]


def _before_script(protected: str) -> str:
    """The shipped script before issue 24, made from today's (the same literal values)."""
    _set, _begin, claimed, insert, finish, _commit = protected.splitlines()
    claim = claimed.removesuffix("\\gset").strip()
    table = f'"{bulk.TABLE}"'
    columns = claim[claim.index("(") + 1 : claim.index(") VALUES (")]
    values = claim[claim.index(") VALUES (") + len(") VALUES (") : claim.index(") ON CONFLICT")]
    lock = re.search(r"'(\d+ms)' \|\| left", values)
    assert lock is not None, claim
    saved = "set_config('idempotency.lock_timeout', current_setting('lock_timeout'), true)"
    bound = f"set_config('lock_timeout', '{lock.group(1)}' || left({saved}, 0), true)"
    values = values.replace(f" || left({bound}, 0)", "")
    values = re.sub(r", STATEMENT_TIMESTAMP\(\) \+ '[^']*'::interval$", ", NULL", values)
    every = ", ".join(f'"{name}"' for name in _columns())
    scope, key = re.findall(r"VALUES \(('[^']*'), ('[^']*' \|\| :k)", claim)[0]
    old_claim = (
        "WITH previous AS MATERIALIZED (SELECT current_setting('lock_timeout') AS lock_timeout), "
        "bounded AS MATERIALIZED (SELECT lock_timeout, "
        f"set_config('lock_timeout', '{lock.group(1)}', true) FROM previous), "
        f"claimed AS (INSERT INTO {table} ({columns}) SELECT {values} FROM bounded "
        'ON CONFLICT ("scope", "idem_key") DO NOTHING RETURNING "id", "lease_until") '
        'SELECT claimed."id" AS claimed_id, claimed."lease_until" AS claimed_lease_until, '
        "record.*, set_config('lock_timeout', bounded.lock_timeout, true) AS restored "
        "FROM bounded LEFT JOIN claimed ON TRUE LEFT JOIN (SELECT "
        f'{every} FROM {table} WHERE "scope" = {scope} AND "idem_key" = {key}) AS record '
        'ON claimed."id" IS NULL'
    ).replace(table, f'"{BEFORE_TABLE}"')
    expiry = r'CASE WHEN "expires_at" IS NULL THEN STATEMENT_TIMESTAMP\(\) ELSE "created_at" END'
    old_finish = re.sub(expiry, "STATEMENT_TIMESTAMP()", finish)
    old_finish = old_finish.replace('"id" = :id', '"id" = :claimed_id').replace(
        table, f'"{BEFORE_TABLE}"'
    )
    return floor.protected_script(old_claim, insert.rstrip(";"), old_finish.rstrip(";"))


def _columns() -> list[str]:
    from idempotency.models import IdempotencyRecord

    return [str(field.column) for field in IdempotencyRecord._meta.concrete_fields]


def _print_scripts(scripts: dict[str, str]) -> None:
    print("# What a protected create costs the database\n")
    print("The pgbench scripts (one line per statement):\n")
    for name, script in scripts.items():
        print(f"{name}:\n\n```\n{script}```\n")


# What each transaction writes


def _work(
    database: Database, scripts: dict[str, str], rounds: int, transactions: int
) -> dict[str, Work]:
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        raise RuntimeError("pgbench was not found on PATH")
    bulk.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    # Keeps the WAL of the runs until it is read (a checkpoint may recycle it meanwhile);
    # temporary: it goes with this session.
    bulk.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", [database.name])
    for table in ("shop_order", bulk.TABLE, BEFORE_TABLE):  # dead tuples stay countable
        bulk.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    relations = _relations()
    work = {name: Work() for name in scripts}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(rounds):
            for name in rotated(ORDER, round_):
                path = Path(folder) / f"{ORDER.index(name)}.sql"
                path.write_text(scripts[name])
                _one_run(pgbench, database, path, transactions, relations, work[name])
    return work


def _one_run(
    pgbench: str,
    database: Database,
    script: Path,
    transactions: int,
    relations: dict[int, str],
    work: Work,
) -> None:
    before, start = _table_statistics(), _lsn("pg_current_wal_insert_lsn()")
    _pgbench(pgbench, database, script, transactions)
    end = _lsn("pg_current_wal_flush_lsn()")
    time.sleep(1.0)  # pgbench's backend has exited: its statistics are in the shared view
    after = _table_statistics()
    wal, full_pages, entries, parts = _wal(start, end, relations)
    work.wal_bytes.append(wal / transactions)
    for part, size in parts.items():
        work.parts.setdefault(part, []).append(size / transactions)
    work.full_page_bytes.append(full_pages / transactions)
    work.index_entries.append(entries / transactions)
    for name in ("hot_updates", "updates", "dead_tuples"):
        getattr(work, name).append((after[name] - before[name]) / transactions)


def _relations() -> dict[int, str]:
    """The file node of each table of the run and of its indexes: what WAL records name."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relfilenode, c.relname FROM pg_class c "
            "LEFT JOIN pg_index i ON i.indexrelid = c.oid "
            "WHERE c.oid = ANY(%s::regclass[]) OR i.indrelid = ANY(%s::regclass[])",
            [["shop_order", bulk.TABLE, BEFORE_TABLE]] * 2,
        )
        return {int(node): str(name) for node, name in cursor.fetchall()}


def _wal(start: str, end: str, relations: dict[int, str]) -> tuple[int, int, int, dict[str, int]]:
    """WAL bytes of this run's transactions, of which full-page images, index entries, and
    the bytes without full-page images by relation and record type."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xid::text::bigint, resource_manager, record_type, record_length, "
            "fpi_length, block_ref FROM pg_get_wal_records_info(%s, %s)",
            [start, end],
        )
        records = cursor.fetchall()
    ours = [_nodes(row[5]) & relations.keys() for row in records]
    xids = {row[0] for row, nodes in zip(records, ours, strict=True) if nodes and row[0]}
    counted = [
        (row, nodes) for row, nodes in zip(records, ours, strict=True) if nodes or row[0] in xids
    ]
    entries = sum(
        1
        for row, nodes in counted
        if row[1] == "Btree" and row[2] in ("INSERT_LEAF", "INSERT_POST")
    )
    parts: dict[str, int] = {}
    for row, nodes in counted:
        named = ", ".join(sorted(relations[node] for node in nodes)) or "-"
        part = f"{named}: {row[1]} {row[2]}"
        parts[part] = parts.get(part, 0) + row[3] - row[4]
    wal, full_pages = sum(row[3] for row, _ in counted), sum(row[4] for row, _ in counted)
    return wal, full_pages, entries, parts


def _nodes(block_ref: str | None) -> set[int]:
    return {int(node) for node in re.findall(r"rel \d+/\d+/(\d+)", block_ref or "")}


def _table_statistics() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(n_tup_hot_upd), 0), coalesce(sum(n_tup_upd), 0), "
            "coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [["shop_order", bulk.TABLE, BEFORE_TABLE]],
        )
        hot, updates, dead = cursor.fetchone()
    return {"hot_updates": int(hot), "updates": int(updates), "dead_tuples": int(dead)}


def _lsn(function: str) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}::text")
        return str(cursor.fetchone()[0])


def _pgbench(pgbench: str, database: Database, script: Path, transactions: int) -> None:
    command = [pgbench, "--no-vacuum", "--protocol=simple", "--client=1"]
    command += [f"--transactions={transactions}", f"--file={script}"]
    command += [f"--host={database.host}", f"--port={database.port}"]
    command += [f"--username={database.user}", database.name]
    environment = {"PATH": os.environ.get("PATH", "")}
    if database.password:
        environment["PGPASSWORD"] = database.password
    completed = subprocess.run(command, capture_output=True, text=True, env=environment)
    if completed.returncode != 0:
        raise RuntimeError(f"pgbench failed:\n{completed.stdout}\n{completed.stderr}")


# The report


def _tps_table(result: floor.FloorResult, scripts: dict[str, str]) -> str:
    sent = {name: floor.statements(script) for name, script in scripts.items()}
    rows = [
        f"## Transactions per second ({result.clients} clients, median of the rounds)",
        "",
        "| statements | sent | simple protocol | prepared | prepared / simple |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ORDER:
        simple, prepared = (result.median(floor.measurement(name, p)) for p in floor.PROTOCOLS)
        rows.append(
            f"| {name} | {sent[name]} | {simple:,.0f} | {prepared:,.0f} | {prepared / simple:.2f} |"
        )
    rows += [
        "",
        "| ratio (median of the rounds' ratios, lowest to highest) | simple | prepared |",
        "|---|---:|---:|",
    ]
    pairs = [
        ("protected / BEGIN; INSERT; COMMIT", floor.PROTECTED, floor.TRANSACTION),
        ("written once / BEGIN; INSERT; COMMIT", floor.WRITTEN_ONCE, floor.TRANSACTION),
        ("written once / protected", floor.WRITTEN_ONCE, floor.PROTECTED),
        ("protected / INSERT alone", floor.PROTECTED, floor.UNPROTECTED),
        ("before issue 24 / BEGIN; INSERT; COMMIT", BEFORE, floor.TRANSACTION),
        ("protected / before issue 24", floor.PROTECTED, BEFORE),
    ]
    for label, top, bottom in pairs:
        cells = [
            result.paired(floor.measurement(top, p), floor.measurement(bottom, p))
            for p in floor.PROTOCOLS
        ]
        rows.append(
            f"| {label} | "
            + " | ".join(f"{mid:.2f}x ({low:.2f} to {high:.2f})" for mid, low, high in cells)
            + " |"
        )
    return "\n".join(rows)


def _work_table(work: dict[str, Work], transactions: int) -> str:
    rows = [
        f"## What one transaction writes (1 client, {transactions:,} transactions a run, "
        "median of the runs)",
        "",
        "| statements | WAL bytes | without full-page images | index entries "
        "| heap updates in place (HOT) | other heap updates | dead tuples left |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ORDER:
        measured = work[name]
        hot, updates = _median(measured.hot_updates), _median(measured.updates)
        rows.append(
            f"| {name} | {_median(measured.wal_bytes):,.0f} "
            f"| {_median(measured.wal_bytes) - _median(measured.full_page_bytes):,.0f} "
            f"| {_median(measured.index_entries):.2f} "
            f"| {hot:.2f} | {updates - hot:.2f} | {_median(measured.dead_tuples):.2f} |"
        )
    wal = {name: _median(work[name].wal_bytes) for name in ORDER}
    ours = wal[floor.PROTECTED]
    bare = _bare(work, floor.WRITTEN_ONCE) / _bare(work, floor.PROTECTED)
    rows += [
        "",
        f"WAL bytes: protected / INSERT alone {ours / wal[floor.UNPROTECTED]:.2f}x, "
        f"protected / BEGIN; INSERT; COMMIT {ours / wal[floor.TRANSACTION]:.2f}x, "
        f"protected / before issue 24 {ours / wal[BEFORE]:.2f}x, "
        f"written once / protected {wal[floor.WRITTEN_ONCE] / ours:.2f}x "
        f"(without full-page images {bare:.2f}x).",
        "",
        *_parts_table(work[floor.PROTECTED]),
    ]
    return "\n".join(rows)


def _parts_table(measured: Work) -> list[str]:
    """Where the protected create's WAL goes: per transaction, full-page images left out."""
    parts = {part: _median(sizes) for part, sizes in measured.parts.items()}
    rows = [
        "Where the protected create's WAL goes (bytes per transaction, without full-page "
        "images; a part under 1 byte left out):",
        "",
        "| relation: record | bytes |",
        "|---|---:|",
    ]
    for part, size in sorted(parts.items(), key=lambda item: -item[1]):
        if size >= 1:
            rows.append(f"| {part} | {size:,.0f} |")
    return rows


def _bare(work: dict[str, Work], name: str) -> float:
    """WAL bytes without full-page images: what checkpoints falling inside a run do not move."""
    return _median(work[name].wal_bytes) - _median(work[name].full_page_bytes)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="records for the plans")
    parser.add_argument("--seconds", type=int, default=5, help="pgbench per script and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--transactions", type=int, default=2000, help="per run, for the WAL")
    default = os.environ.get("BENCH_COST_DATABASE", "idempotency_cost")
    parser.add_argument("--database", default=default)
    parser.add_argument("--keep-database", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
