#!/usr/bin/env python
"""What migration 0006 (the lean record) costs an existing table: ``benchmarks/migration_cost.py``.

Creates a database (``BENCH_DATABASE_URL``'s server, as the other scripts; a
``mysql://`` URL for MariaDB), migrates it to 0005, fills the records table with
``--rows`` finished records written as a preview wrote them (SHA-256's
hexadecimal fingerprint, a 32-character token; a response, the indexes of then),
then times ``migrate idempotency 0006`` and prints a table: the rows, the table's
size before and after, the time. The exit status says whether the run worked.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bulk  # noqa: E402
from benchmarks.server import Database  # noqa: E402

FILL_POSTGRES = f"""
INSERT INTO {bulk.TABLE} (
    scope, idem_key, operation, request_hash, request_method, request_path, status,
    owner_token, response_status, response_headers, response_body, resource_id, attempts,
    recovery_attempts, version, created_at, updated_at, completed_at, expires_at
)
SELECT
    'user:' || (g %% 1000) || ':bench.migration', 'key-' || g, 'bench.migration',
    md5(g::text) || md5('again' || g), 'POST', '/api/orders/', 'SUCCEEDED', md5('owner' || g),
    201, '[["Content-Type", "application/json"]]'::jsonb,
    convert_to('{{"id": ' || g || ', "sku": "bench", "quantity": 1}}', 'UTF8'), g::text,
    1, 0, 2, now(), now(), now(), now() + interval '1 day'
FROM generate_series(%(first)s, %(last)s) AS g
"""
FILL_MYSQL = f"""
INSERT INTO {bulk.TABLE} (
    scope, idem_key, operation, request_hash, request_method, request_path, status,
    owner_token, response_status, response_headers, response_body, resource_id, attempts,
    recovery_attempts, version, created_at, updated_at, completed_at, expires_at
)
SELECT
    CONCAT('user:', seq %% 1000, ':bench.migration'), CONCAT('key-', seq), 'bench.migration',
    SHA2(seq, 256), 'POST', '/api/orders/', 'SUCCEEDED', MD5(CONCAT('owner', seq)),
    201, '[["Content-Type", "application/json"]]',
    CONCAT('{{"id": ', seq, ', "sku": "bench", "quantity": 1}}'), seq,
    1, 0, 2, NOW(6), NOW(6), NOW(6), NOW(6) + INTERVAL 1 DAY
FROM seq_%(first)s_to_%(last)s
"""
CHUNK = 1_000_000


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    with bulk.migrated(args.database, "idempotency", "0005", keep=args.keep_database) as database:
        from django.core.management import call_command

        began = time.perf_counter()
        _fill(args.rows)
        filled = time.perf_counter() - began
        before = _size()
        began = time.perf_counter()
        call_command("migrate", "idempotency", "0006", verbosity=0)
        migrated = time.perf_counter() - began
        print(_table(database, args.rows, filled, before, _size(), migrated))
    return 0


def _fill(rows: int) -> None:
    for first in range(1, rows + 1, CHUNK):
        last = min(rows, first + CHUNK - 1)
        if bulk.mysql():  # MariaDB's sequence tables take literal bounds
            bulk.execute(FILL_MYSQL % {"first": first, "last": last})
        else:
            bulk.execute(FILL_POSTGRES, {"first": first, "last": last})


def _size() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        if bulk.mysql():
            cursor.execute(f"ANALYZE TABLE {bulk.TABLE}")
            cursor.fetchall()
            cursor.execute(
                "SELECT data_length + index_length FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [bulk.TABLE],
            )
        else:
            cursor.execute("SELECT pg_total_relation_size(%s)", [bulk.TABLE])
        return int(cursor.fetchone()[0])


def _table(
    database: Database, rows: int, filled: float, before: int, after: int, migrated: float
) -> str:
    mib = 1024 * 1024
    return "\n".join(
        [
            f"# Migration 0006 on {database.version}, {rows:,} records",
            "",
            f"Filled in {filled:.0f} s.",
            "",
            "| table and indexes before | after | migrate idempotency 0006 |",
            "|---:|---:|---:|",
            f"| {before / mib:,.0f} MiB | {after / mib:,.0f} MiB | {migrated:,.1f} s |",
        ]
    )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--database", default="idempotency_migration")
    parser.add_argument("--keep-database", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
