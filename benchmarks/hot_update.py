#!/usr/bin/env python
"""Can the finish be a HOT update? ``.venv/bin/python benchmarks/hot_update.py``.

PostgreSQL updates a row in place (a heap-only tuple, HOT: no new index
entries, pruned without VACUUM) only when no indexed column changes and the
new version fits in the same page. Since migration 0004 no index reads a
column an atomic-mode finish changes (docs/performance.md, "What a protected
create costs the database"), so the second condition decides. This script
measures it: over ``--records`` finished records (10^6 by
default) it runs ``--creates`` protected creates through ``core.execute``
(this app's real claim and finish statements) on the table as shipped, with a
lower ``fillfactor``, and with the secondary indexes dropped (for comparison:
recovery and purge read them), and prints per
configuration the creates per second, the share of HOT updates
(``pg_stat_user_tables``), what the table and its indexes grew by, and how
long a ``VACUUM`` of the table then took. Autovacuum is off for the table
during each run, so the growth is what the creates left behind. Needs
PostgreSQL as ``benchmarks/run.py`` does; creates and drops the database
``idempotency_hot``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bulk  # noqa: E402

TABLE = bulk.TABLE
# The secondary indexes: recovery's, purge's and the admin's (since migration 0004
# none reads a column an atomic-mode finish changes).
TOUCHED = ("idempotency_leased_idx", "idempotency_expires_idx", "idempotency_created_idx")


@dataclass(frozen=True)
class Configuration:
    name: str
    fillfactor: int
    drop_touched: bool = False


CONFIGURATIONS = (
    Configuration("as shipped (fillfactor 100, every index)", 100),
    Configuration("fillfactor 90, every index", 90),
    Configuration("fillfactor 70, every index", 70),
    Configuration("fillfactor 90, without the 3 secondary indexes", 90, True),
)


@dataclass
class Measured:
    creates_per_second: float
    updates: int
    hot_updates: int
    heap_growth: int
    index_growth: int
    vacuum_seconds: float


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    with bulk.migrated(args.database):
        definitions = _index_definitions()
        results = {
            configuration.name: _measure(configuration, definitions, args.records, args.creates)
            for configuration in CONFIGURATIONS
        }
    print(_table(results, args.records, args.creates))
    return 0


def _index_definitions() -> dict[str, str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes "
            "WHERE tablename = %s AND indexname = ANY(%s)",
            [TABLE, list(TOUCHED)],
        )
        return dict(cursor.fetchall())


def _measure(
    configuration: Configuration, definitions: dict[str, str], records: int, creates: int
) -> Measured:
    bulk.execute(f"TRUNCATE {TABLE} CASCADE")  # its steps reference it
    for name, definition in definitions.items():
        bulk.execute(f'DROP INDEX IF EXISTS "{name}"')
        if not configuration.drop_touched:
            bulk.execute(definition)
    bulk.execute(
        f"ALTER TABLE {TABLE} SET (fillfactor = {configuration.fillfactor}, "
        "autovacuum_enabled = false)"
    )
    bulk.fill(records, bulk.LIVE, tag=uuid.uuid4().hex[:8])
    bulk.execute(f"VACUUM (ANALYZE) {TABLE}")  # a settled table: every page visible and frozen
    before = _statistics()
    started = time.perf_counter()
    _creates(creates)
    elapsed = time.perf_counter() - started
    after = _statistics()
    vacuum_started = time.perf_counter()
    bulk.execute(f"VACUUM {TABLE}")
    vacuum_seconds = time.perf_counter() - vacuum_started
    bulk.execute(f"ALTER TABLE {TABLE} RESET (fillfactor, autovacuum_enabled)")
    return Measured(
        creates_per_second=creates / elapsed,
        updates=after["updates"] - before["updates"],
        hot_updates=after["hot"] - before["hot"],
        heap_growth=after["heap"] - before["heap"],
        index_growth=after["indexes"] - before["indexes"],
        vacuum_seconds=vacuum_seconds,
    )


def _creates(count: int) -> None:
    from idempotency.models import Status
    from idempotency.outcomes import Outcome, StoredResponse
    from idempotency.protocol import Operation
    from idempotency.protocol.execute import execute

    body = b'{"id": 1, "sku": "bench", "quantity": 1, "status": "PENDING"}'
    response = StoredResponse(201, [("Content-Type", "application/json")], body)

    def decide(value: Any, attempt: Any) -> Outcome:
        return Outcome(Status.SUCCEEDED, response, resource_id="1")

    for number in range(count):
        operation = Operation(
            scope=f"user:{number % 1000}:bench.hot",
            key=uuid.uuid4().hex,
            request_hash=uuid.uuid4().hex * 2,
            name="bench.hot",
            method="POST",
            path="/api/orders/",
        )
        execute(operation, lambda attempt: None, decide=decide, replay=lambda record: None)


def _statistics() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.6)  # the statistics of this backend reach the shared view
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd, pg_relation_size(relid), pg_indexes_size(relid) "
            "FROM pg_stat_user_tables WHERE relname = %s",
            [TABLE],
        )
        updates, hot, heap, indexes = cursor.fetchone()
    return {"updates": updates, "hot": hot, "heap": heap, "indexes": indexes}


def _table(results: dict[str, Measured], records: int, creates: int) -> str:
    rows = [
        f"{creates:,} protected creates over {records:,} finished records, per configuration:",
        "",
        "| table | creates/s | HOT share of the finishes | heap grew, MiB | indexes grew, MiB "
        "| VACUUM afterwards, s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        share = result.hot_updates / result.updates if result.updates else 0.0
        rows.append(
            f"| {name} | {result.creates_per_second:.0f} | {share:.0%} "
            f"| {result.heap_growth / 2**20:.1f} | {result.index_growth / 2**20:.1f} "
            f"| {result.vacuum_seconds:.2f} |"
        )
    return "\n".join(rows)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--creates", type=int, default=5_000)
    parser.add_argument(
        "--database", default=os.environ.get("BENCH_HOT_DATABASE", "idempotency_hot")
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
