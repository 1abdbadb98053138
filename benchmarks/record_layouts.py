#!/usr/bin/env python
"""What the record's layout costs in WAL: ``.venv/bin/python benchmarks/record_layouts.py``.

Issue 40 asked for a protected create that writes at most three times the WAL of
the unprotected one. The claim's ``INSERT ... ON CONFLICT`` and the finish's
``UPDATE`` are most of it. This script asks what other layouts of the same record
would write: it migrates a database (the table as shipped), then makes copies of
the table that differ in one respect each, and runs ``--transactions`` claims and
finishes on each, one transaction per create, in alternating rounds:

- *as shipped*: the columns in the order the migrations made them;
- *changed columns last*: what a finish leaves alone first and what it changes
  last, so that PostgreSQL's prefix compression of an in-place (HOT) update
  logs only the changed end of the row;
- *and one timestamp per transaction*: ``created_at``, ``updated_at`` and
  ``completed_at`` from the transaction's start, so that the finish changes two
  fewer columns (atomic mode only: a lease-mode finish is another transaction);
- *no surrogate key*: ``(scope, idem_key)`` as the primary key, with no ``id``
  and no second unique index (Django's admin does not support a composite
  primary key, and the steps, the finish and ``purge --older-than`` use ``id``);
- both: changed columns last and no surrogate key.

The statements have the store's shape (the same columns and values as the claim
and finish that ``benchmarks/database_cost.py`` prints, the order's ``INSERT``
left out: it is the same in every layout). What each writes is read from the WAL
itself (``pg_walinspect``: the records of the table and its indexes, and the
commits), without full-page images. Prints bytes per create by layout and by
kind of WAL record. Creates and drops the database ``idempotency_layouts``.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bulk  # noqa: E402

SHIPPED = bulk.TABLE
# What an atomic-mode finish leaves alone, then what it changes.
UNCHANGED_FIRST = [
    "id",
    "scope",
    "idem_key",
    "operation",
    "request_hash",
    "request_method",
    "request_path",
    "owner_token",
    "attempts",
    "recovery_attempts",
    "created_at",
    "expires_at",
    "lease_until",
]
CHANGED_LAST = [
    "status",
    "version",
    "updated_at",
    "completed_at",
    "response_status",
    "resource_id",
    "response_headers",
    "response_body",
]
BODY = b'{"id": 1, "sku": "bench", "quantity": 1, "status": "PENDING"}'


@dataclass(frozen=True)
class Layout:
    name: str
    table: str
    reordered: bool = False
    surrogate_key: bool = True
    clock: str = "STATEMENT_TIMESTAMP()"


LAYOUTS = (
    Layout("as shipped", "layout_shipped"),
    Layout("changed columns last", "layout_reordered", reordered=True),
    Layout(
        "changed columns last, one timestamp per transaction",
        "layout_one_clock",
        reordered=True,
        clock="TRANSACTION_TIMESTAMP()",
    ),
    Layout("no surrogate key", "layout_natural_key", surrogate_key=False),
    Layout(
        "changed columns last, no surrogate key",
        "layout_both",
        reordered=True,
        surrogate_key=False,
    ),
)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    with bulk.migrated(args.database):
        bulk.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        columns = _shipped_columns()
        for layout in LAYOUTS:
            _create(layout, columns)
        measured: dict[str, list[dict[str, float]]] = {layout.name: [] for layout in LAYOUTS}
        for _ in range(args.rounds):
            for layout in LAYOUTS:
                measured[layout.name].append(_measure(layout, args.transactions))
    print(_report(measured, args))
    return 0


def _shipped_columns() -> dict[str, str]:
    """The shipped table's columns, in their order: name -> type and nullability."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            [SHIPPED],
        )
        return {
            name: f"{kind} {'NOT NULL' if not_null else 'NULL'}"
            for name, kind, not_null in cursor.fetchall()
        }


def _create(layout: Layout, columns: dict[str, str]) -> None:
    order = list(columns)
    if layout.reordered:
        assert sorted(order) == sorted(UNCHANGED_FIRST + CHANGED_LAST), order
        order = UNCHANGED_FIRST + CHANGED_LAST
    if not layout.surrogate_key:
        order.remove("id")
    definitions = [f'"{name}" {columns[name]}' for name in order]
    bulk.execute(f"CREATE TABLE {layout.table} ({', '.join(definitions)})")
    if layout.surrogate_key:
        bulk.execute(
            f"ALTER TABLE {layout.table} ALTER id ADD GENERATED BY DEFAULT AS IDENTITY, "
            "ADD PRIMARY KEY (id), ADD UNIQUE (scope, idem_key)"
        )
    else:
        bulk.execute(f"ALTER TABLE {layout.table} ADD PRIMARY KEY (scope, idem_key)")
    # The shipped secondary indexes: the purge's and recovery's.
    bulk.execute(f"CREATE INDEX ON {layout.table} (expires_at)")
    bulk.execute(f"CREATE INDEX ON {layout.table} (lease_until) WHERE lease_until IS NOT NULL")


def _claim(layout: Layout) -> str:
    now = layout.clock
    returned = "id" if layout.surrogate_key else "idem_key"
    return (
        f"INSERT INTO {layout.table} (scope, idem_key, operation, request_hash, request_method, "
        "request_path, owner_token, status, response_headers, resource_id, attempts, "
        "recovery_attempts, version, created_at, updated_at, expires_at) "
        "VALUES ('bench-floor', %s, 'bench.floor', %s, 'POST', '', %s, 'PROCESSING', "
        f"'[]'::jsonb, '', 1, 0, 1, {now}, {now}, {now} + interval '1 day') "
        f"ON CONFLICT (scope, idem_key) DO NOTHING RETURNING {returned}"
    )


def _finish(layout: Layout) -> str:
    now = layout.clock
    where = "id = %s" if layout.surrogate_key else "scope = 'bench-floor' AND idem_key = %s"
    return (
        f"UPDATE {layout.table} SET status = 'SUCCEEDED', response_status = 201, "
        """response_headers = '[["Content-Type", "application/json"]]'::jsonb, """
        f"response_body = %s, resource_id = '1', lease_until = NULL, completed_at = {now}, "
        f"updated_at = {now}, version = version + 1, expires_at = CASE WHEN expires_at IS NULL "
        f"THEN {now} ELSE created_at END + interval '1 day' "
        f"WHERE {where} AND owner_token = %s AND status = 'PROCESSING'"
    )


def _measure(layout: Layout, transactions: int) -> dict[str, float]:
    """WAL bytes per create (without full-page images), by kind of record and in all."""
    from django.db import connection, transaction

    claim, finish = _claim(layout), _finish(layout)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_relation_filenode(oid) FROM pg_class WHERE relname LIKE %s",
            [f"{layout.table}%"],
        )
        files = {str(node) for (node,) in cursor.fetchall() if node}
        cursor.execute("SELECT pg_current_wal_insert_lsn()")
        (start,) = cursor.fetchone()
        token, fingerprint = secrets.token_bytes(16), secrets.token_bytes(16)
        for _ in range(transactions):
            key = f"floor-{secrets.randbelow(10**12)}"
            with transaction.atomic():
                cursor.execute(claim, [key, fingerprint, token])
                (claimed,) = cursor.fetchone()
                cursor.execute(finish, [BODY, claimed, token])
        cursor.execute("SELECT pg_current_wal_insert_lsn()")
        (end,) = cursor.fetchone()
        cursor.execute(
            "SELECT resource_manager, record_type, record_length - fpi_length, block_ref "
            "FROM pg_get_wal_records_info(%s, %s)",
            [start, end],
        )
        records = cursor.fetchall()
    kinds: dict[str, float] = {}
    for manager, kind, length, blocks in records:
        ours = any(node in files for node in re.findall(r"rel \d+/\d+/(\d+)", blocks or ""))
        if ours or (manager, kind) == ("Transaction", "COMMIT"):
            name = f"{manager} {kind}"
            kinds[name] = kinds.get(name, 0) + length / transactions
    kinds["all"] = sum(kinds.values())
    return kinds


def _report(measured: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> str:
    def median(name: str, kind: str) -> float:
        return statistics.median(run.get(kind, 0.0) for run in measured[name])

    shipped = LAYOUTS[0].name
    kinds = sorted(
        {kind for runs in measured.values() for run in runs for kind in run if kind != "all"},
        key=lambda kind: -median(shipped, kind),
    )
    kinds = [kind for kind in kinds if any(median(name, kind) >= 1 for name in measured)]
    lines = [
        "# WAL per claim and finish, by layout of the record",
        "",
        f"{args.transactions:,} creates a round, {args.rounds} rounds, median; bytes per create "
        "without full-page images (the order's INSERT, the same in every layout, left out)",
        "",
        "| layout | WAL bytes | / as shipped | " + " | ".join(kinds) + " |",
        "|---|---:|---:|" + "---:|" * len(kinds),
    ]
    base = median(shipped, "all")
    for name in measured:
        total = median(name, "all")
        cells = " | ".join(f"{median(name, kind):.0f}" for kind in kinds)
        lines.append(f"| {name} | {total:,.0f} | {total / base:.2f}x | {cells} |")
    return "\n".join(lines)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--database", default=os.environ.get("BENCH_LAYOUTS_DATABASE", "idempotency_layouts")
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
