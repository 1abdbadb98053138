"""The database cost measurement's MariaDB path runs end to end (the mariadb pass only).

Seconds, not minutes: one round of one second per statement list, twenty
transactions for the redo log. ``run.py`` on MariaDB shares everything with it
but the HTTP scenarios, which the postgres pass's smoke test runs.
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


def _mysql_environment() -> dict[str, str]:
    default = settings.DATABASES["default"]
    password = f":{default['PASSWORD']}" if default.get("PASSWORD") else ""
    server = f"{default.get('HOST') or '127.0.0.1'}:{default.get('PORT') or 3306}"
    return {"BENCH_DATABASE_URL": f"mysql://{default.get('USER') or 'root'}{password}@{server}/"}
