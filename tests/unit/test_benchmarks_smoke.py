"""The benchmark's quick mode runs end to end, so it cannot rot.

It never judges speed: the run must work and print its tables, whatever the
ratios say (on a shared machine they say little about a change).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

pytestmark = [pytest.mark.postgres, pytest.mark.benchmarks]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120


def test_quick_benchmark_runs_and_prints_its_tables(tmp_path):
    output = tmp_path / "results.md"
    result = _run(
        "benchmarks/run.py", "--quick", "--database", _database("bench"), "--output", str(output)
    )
    for heading in [
        "## Ratios",
        "## First requests",
        "## Replays",
        "## Hot key",
        "## Purge and recovery",
        "## Query plans",
    ]:
        assert heading in result.stdout
    assert "| comparison | ratio | rounds | target | |" in result.stdout
    assert "| unprotected |" in result.stdout
    assert "| idempotency (atomic) |" in result.stdout
    # the second server, whose connections prepare statements
    assert "| unprotected (prepared statements) |" in result.stdout
    assert "| idempotency (atomic) (prepared statements) |" in result.stdout
    # the hot key of a 2 s lease-mode job whose duplicates wait for its outcome
    assert "| idempotency (lease, 2 s job, duplicates wait) |" in result.stdout
    # the third server, with the replay cache in Redis
    assert "| idempotency (atomic) (replay cache), replays |" in result.stdout
    assert "| replays / fresh creates, throughput (replay cache) |" in result.stdout
    # the floor of a replay's own stack: an order's GET through the same view set
    assert "| an order's GET (the same view set) (replay cache server) |" in result.stdout
    assert "| cost: a replay / an order's GET (replay cache) |" in result.stdout
    # a create as a real endpoint does it, with and without protection
    assert "| placed order, unprotected |" in result.stdout
    assert "| placed order, idempotency (atomic), replays |" in result.stdout
    # the two atomic-mode protocols on one view: the default and the record written once
    for protocol in (
        "idempotency (atomic), the twin",
        "idempotency (atomic, written once), the twin",
    ):
        assert f"| {protocol} |" in result.stdout.split("## Replays")[0]  # first requests
        assert f"| {protocol}, fresh keys |" in result.stdout
        assert f"| {protocol}, replays |" in result.stdout
        assert f"| {protocol} |" in result.stdout.split("## Hot key")[1]  # duplicates
    assert "| replays / fresh creates, throughput: written once |" in result.stdout
    assert "| first requests, throughput: written once / default protocol |" in result.stdout
    assert "| hot key, written once: share answered with the outcome, one effect |" in result.stdout
    assert "written once / BEGIN; INSERT; COMMIT" in result.stdout  # the floor's ratios
    assert output.read_text() == result.stdout.rstrip("\n") + "\n"
    assert output.with_suffix(".svg").read_text().startswith("<svg ")  # the ratios' chart


def test_purge_at_scale_runs_and_prints_its_tables(tmp_path):
    output = tmp_path / "purge.md"
    result = _run(
        "benchmarks/purge_scale.py",
        *("--records", "3000", "--retry-every", "10", "--baseline-seconds", "1"),
        *("--database", _database("purge"), "--output", str(output)),
    )
    for heading in [
        "## Creates while purging",
        "## Late retries while purging",
        "## Table size (with its indexes) and VACUUM",
        "## Side by side",
    ]:
        assert heading in result.stdout
    creates = result.stdout.split("## Creates while purging")[1].split("##")[0]
    rows = [line.split(" | ") for line in creates.splitlines() if line.startswith("| ")][1:]
    assert [re.sub(r"[0-9,]+ \(", "N (", row[0]) for row in rows] == [
        "| idempotency.retention.purge(), 0.25 s batches of at most 100,000",
        "| raw batched DELETE, batches of N (the purge's median)",  # sized by time: any
        "| the purge before (batches of 1,000 by id, locked first)",
        "| one unbatched DELETE (as drf-idempotency, drf-idempotencykey)",
    ]
    # Every way deleted the expired records, but for those a late retry took over first:
    # past its expiry a key is new, whether or not the purge has reached its record yet.
    for row in rows:
        assert 2_700 <= int(row[1].replace(",", "")) <= 3_000, row
    assert output.read_text() == result.stdout.rstrip("\n") + "\n"


def test_in_process_breakdown_runs_and_prints_its_table():
    result = _run(
        "benchmarks/inprocess.py",
        *("--rounds", "1", "--requests", "5", "--database", _database("inprocess")),
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("| variant | requests | this process, CPU ms")
    assert [line.split(" | ")[1] for line in lines[2:]] == ["5"] * 8  # every variant ran
    assert any(line.startswith("| placed order, idempotency (atomic) |") for line in lines)


def test_profile_runs_and_prints_its_tables():
    result = _run(
        "benchmarks/profiling.py",
        *("--rounds", "1", "--requests", "5", "--top", "3", "--database", _database("profile")),
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("| variant | requests | calls per request")
    assert [line.split(" | ")[0] for line in lines[2:6]] == [
        "| unprotected",
        "| idempotency (atomic)",
        "| replays",
        "| an order's GET (the same view set)",
    ]
    assert "### idempotency (atomic): top 3 functions by own time" in result.stdout


def test_hot_update_measurement_runs_and_prints_its_table():
    result = _run(
        "benchmarks/hot_update.py",
        *("--records", "2000", "--creates", "20", "--database", _database("hot")),
    )
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 4  # the header and every configuration
    assert "| as shipped (fillfactor 100, every index) |" in result.stdout


def test_record_layouts_measurement_runs_and_prints_its_table():
    result = _run(
        "benchmarks/record_layouts.py",
        *("--transactions", "20", "--rounds", "1", "--database", _database("layouts")),
    )
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 5  # the header and every layout
    assert "| as shipped | " in result.stdout and "| 1.00x |" in result.stdout
    assert "Heap HOT_UPDATE" in result.stdout  # the finish, read from the WAL


def test_migration_cost_measurement_runs_and_prints_its_table():
    result = _run(
        "benchmarks/migration_cost.py", *("--rows", "2000", "--database", _database("migration"))
    )
    assert "| table and indexes before | after | migrate idempotency 0006 |" in result.stdout


def test_database_cost_measurement_runs_and_prints_its_tables():
    result = _run(
        "benchmarks/database_cost.py",
        *("--rows", "2000", "--seconds", "1", "--rounds", "1", "--transactions", "20"),
        *("--clients", "2", "--database", _database("cost")),
    )
    for heading in ["## Transactions per second", "## What one transaction writes", "## Plans"]:
        assert heading in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("| BEGIN; claim")]
    # the protected creates, now and before issue 24, in the tables of speed and of writes
    assert [row.count("|") for row in rows] == [6, 6, 8, 8]
    # the record written once (issue 32) beside them, its statements counted: four
    once = [line for line in result.stdout.splitlines() if line.startswith("| BEGIN; INSERT; rec")]
    assert [row.count("|") for row in once] == [6, 8]
    assert once[0].split(" | ")[1] == "4"
    assert "| written once / BEGIN; INSERT; COMMIT |" in result.stdout
    assert "written once / protected" in result.stdout.split("## What one transaction writes")[1]


def _run(
    script: str, *args: str, timeout: float | None = TIMEOUT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a benchmark script as a user would; it must succeed. ``env`` overrides the default."""
    result = subprocess.run(
        [sys.executable, script, *args],
        cwd=ROOT,
        env={**_environment(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _database(suffix: str) -> str:
    """A database of the script's own beside the test database, created and dropped by it."""
    return f"{settings.DATABASES['default']['NAME']}_{suffix}"


def _environment() -> dict[str, str]:
    default = settings.DATABASES["default"]
    password = f":{default['PASSWORD']}" if default.get("PASSWORD") else ""
    server = f"{default.get('HOST') or '127.0.0.1'}:{default.get('PORT') or 5432}"
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"DATABASE_URL", "TEST_DATABASE_NAME", "DJANGO_SETTINGS_MODULE"}
    }
    env["BENCH_DATABASE_URL"] = (
        f"postgres://{default.get('USER') or 'postgres'}{password}@{server}/postgres"
    )
    return env


def test_instruction_count_runs_and_prints_its_table():
    # Under callgrind a process runs some fifty times as slowly, and how long depends on
    # what else the machine runs: the work is bounded instead (one request of each
    # variant, one round), and the clock is not.
    result = _run(
        "benchmarks/instructions.py",
        *("--rounds", "1", "--requests", "1", "--baseline", "2.0"),
        *("--database", _database("instructions")),
        timeout=None,
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("| variant | instructions per request, millions |")
    assert [line.split(" | ")[0] for line in lines[2:9]] == [
        "| unprotected",
        "| idempotency (atomic)",
        "| idempotency (atomic), the twin",
        "| replays",
        "| replays, read first",
        "| placed order, unprotected",
        "| placed order, idempotency (atomic)",
    ]
    assert "The app's own cost per protected create:" in result.stdout
    assert "On the unprotected create's own view:" in result.stdout
    assert "Against 2.000 million before:" in result.stdout
