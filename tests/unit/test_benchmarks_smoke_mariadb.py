"""The benchmarks' MariaDB paths run end to end (the mariadb pass only).

Seconds, not minutes: one round of one second per statement list, twenty
transactions for the redo log; ``run.py --quick`` (under a minute) for the sections
whose MariaDB paths are its own.
"""

from __future__ import annotations

import pytest
from django.conf import settings

from tests.unit.test_benchmarks_smoke import _database, _run

pytestmark = [pytest.mark.mariadb, pytest.mark.benchmarks]


def test_database_cost_on_mariadb_prints_speed_and_redo():
    result = _run(
        "benchmarks/database_cost.py",
        *("--seconds", "1", "--rounds", "1", "--transactions", "20", "--clients", "2"),
        *("--database", _database("cost")),
        env=_mysql_environment(),
    )
    for heading in ["## Transactions per second", "## What one transaction writes"]:
        assert heading in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("| BEGIN; claim")]
    assert len(rows) == 2  # the protected create, in the table of speed and of redo
    assert "| written once / BEGIN; INSERT; COMMIT |" in result.stdout


def test_quick_benchmark_on_mariadb_runs_every_section(tmp_path):
    # run.py's sections after the HTTP scenarios take MariaDB's own paths (the purge's
    # captured statement explained with ANALYZE, the floor through mysql_floor.py).
    output = tmp_path / "results.md"
    result = _run(
        "benchmarks/run.py",
        *("--quick", "--no-alternatives", "--database", _database("bench")),
        *("--output", str(output)),
        env=_mysql_environment(),
        timeout=300,
    )
    for heading in ["## Ratios", "## First requests", "## Purge and recovery", "## Query plans"]:
        assert heading in result.stdout
    assert "MariaDB" in result.stdout


def test_purge_at_scale_on_mariadb_prints_both_ways(tmp_path):
    output = tmp_path / "purge.md"
    server = _mysql_environment()["BENCH_DATABASE_URL"]
    result = _run(
        "benchmarks/purge_scale.py",
        *("--mariadb", server, "--records", "2000", "--rounds", "2"),
        *("--database", _database("purge"), "--output", str(output)),
    )
    assert "# Purge on MariaDB, against one unbatched DELETE" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0] for row in rows] == [
        "| idempotency.retention.purge(), 0.25 s batches of at most 100,000",
        "| one unbatched DELETE (QuerySet.delete())",
    ]
    for row in rows:  # two rounds each, and batches that deleted rows
        cells = row.split(" | ")
        assert len(cells[1].split(", ")) == 2 and int(cells[4]) >= 1, row
    assert output.read_text() == result.stdout.rstrip("\n") + "\n"


def _mysql_environment() -> dict[str, str]:
    default = settings.DATABASES["default"]
    password = f":{default['PASSWORD']}" if default.get("PASSWORD") else ""
    server = f"{default.get('HOST') or '127.0.0.1'}:{default.get('PORT') or 3306}"
    return {"BENCH_DATABASE_URL": f"mysql://{default.get('USER') or 'root'}{password}@{server}/"}
