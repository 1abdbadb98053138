#!/usr/bin/env python
"""Measure what idempotency costs, side by side: ``.venv/bin/python benchmarks/run.py``.

Creates a PostgreSQL database (or a MariaDB/MySQL one: a ``mysql://`` URL in
``BENCH_DATABASE_URL``; there the peers, prepared statements and the recovery
scan are left out), migrates it, serves the example project with
the benchmark twins (``benchmarks/settings.py``) under gunicorn and drives it
over HTTP from this process, alternating the variants round by round. Then
purge and recovery run here on bulk data. Prints one markdown document (the
tables, the ratios, the query plans) and writes it to ``--output``, with the
ratios drawn as an SVG chart beside it (``latest.svg``).

``--quick`` is a smoke run of seconds. The exit status says whether the run
worked, never whether a target was met.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bulk, floor, http_scenarios, mysql_floor  # noqa: E402
from benchmarks.alternatives import ensure_installed  # noqa: E402
from benchmarks.chart import write_chart  # noqa: E402
from benchmarks.http_scenarios import (  # noqa: E402
    ALTERNATIVES,
    LEASE,
    LEASE_SLOW,
    LEASE_SLOW_WAITING,
    ORDER_GET,
    ORDER_GET_CACHED,
    ORDER_GET_PREPARED,
    OURS,
    OURS_CACHED,
    OURS_PREPARED,
    PLACED,
    PLACED_OURS,
    PLAIN,
    PLAIN_ATOMIC,
    PLAIN_PREPARED,
    TWIN,
    WRITTEN_ONCE,
    Servers,
    Target,
)
from benchmarks.report import Results, _ratios, render  # noqa: E402
from benchmarks.server import Database, environment, gunicorn, prepare  # noqa: E402


@dataclass(frozen=True)
class Plan:
    rounds: int  # alternating rounds per HTTP scenario
    requests: int  # per variant and round
    concurrency: int  # client connections
    hot_trials: int  # bursts per variant
    hot_size: int  # simultaneous duplicates per burst
    rows: int  # records for purge and for the recovery scan
    floor_rounds: int  # alternating pgbench rounds per script
    floor_seconds: int  # per script and round
    purge_rounds: int  # fills per side
    expired_leases: int
    workers: int
    threads: int


FULL = Plan(
    rounds=10,
    requests=300,
    concurrency=8,
    hot_trials=5,
    hot_size=50,
    rows=1_000_000,
    floor_rounds=3,
    floor_seconds=5,
    purge_rounds=2,
    expired_leases=100,
    workers=4,
    threads=2,
)
QUICK = replace(
    FULL,
    rounds=2,
    requests=60,
    hot_trials=1,
    rows=10_000,
    floor_rounds=1,
    floor_seconds=1,
    purge_rounds=1,
)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    plan = _plan(args)
    database = Database.named(args.database)
    # The peers' bulk fills are PostgreSQL's SQL: on MariaDB this app runs alone.
    skipped = args.no_alternatives or database.mysql
    alternatives = None if skipped else ensure_installed()
    database.recreate()
    try:
        results = Results(setup=_setup(plan, database, args))
        results.alternatives = list(ALTERNATIVES) if alternatives else []
        results.unsupported = _unsupported(results.alternatives, alternatives is None)
        if database.mysql:
            results.unsupported[0] = (
                "The alternatives are measured on PostgreSQL only: their bulk fills for the "
                "purge are its SQL."
            )
        if "django-idempotency-key" in results.alternatives and not _redis_answers():
            results.alternatives.remove("django-idempotency-key")
            results.unsupported.append(
                "django-idempotency-key was left out: it needs Redis (BENCH_REDIS_URL) "
                "and none answered."
            )
        env = environment(database, alternatives, run_id=uuid.uuid4().hex[:12])
        prepare(env)
        if not _redis_answers():
            results.unsupported.append(
                "The replay cache was left out: it is measured in Redis (BENCH_REDIS_URL) "
                "and none answered."
            )
        _http(results, plan, database, env, args.output.parent / "gunicorn.log")
        _bulk(results, plan, database, alternatives)
    finally:
        if not args.keep_database:
            database.drop()
    document = render(results)
    print(document)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(document)
    # The ratios as a chart beside the report (latest.svg): what docs/performance.md shows.
    chart = write_chart(_ratios(results), args.output.with_suffix(".svg"))
    print(f"(written to {args.output} and {chart})", file=sys.stderr)
    return 0


def _http(results: Results, plan: Plan, database: Database, env: dict[str, str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    alternatives = [ALTERNATIVES[name] for name in results.alternatives]
    # Prepared statements are psycopg's (server_side_binding): none on MariaDB.
    prepared = [] if database.mysql else [PLAIN_PREPARED, OURS_PREPARED]
    cached = [OURS_CACHED] if _redis_answers() else []
    with (
        gunicorn(env, plan.workers, plan.threads, log) as port,
        _server({**env, "BENCH_PREPARED": "1"}, plan, log, bool(prepared)) as prepared_port,
        _server({**env, "BENCH_REPLAY_CACHE": "1"}, plan, log, bool(cached)) as cached_port,
    ):
        servers = Servers(
            Target("127.0.0.1", port),
            Target("127.0.0.1", prepared_port or port),
            Target("127.0.0.1", cached_port) if cached_port else None,
        )
        variants = [PLAIN, PLAIN_ATOMIC, OURS, *cached, *prepared, LEASE]
        variants += [PLACED, PLACED_OURS, TWIN, WRITTEN_ONCE]
        variants += alternatives
        _step("warming up")
        http_scenarios.warm_up(servers, variants, plan.concurrency)
        _step("first requests")
        results.first, keys = http_scenarios.first_requests(
            servers, variants, plan.rounds, plan.requests, plan.concurrency
        )
        _step("replays, and an order's GET beside them")
        reads = [ORDER_GET]
        reads += [ORDER_GET_CACHED] if cached else []
        reads += [ORDER_GET_PREPARED] if prepared else []
        replayed = [OURS, *cached, *prepared[1:], PLACED_OURS, TWIN, WRITTEN_ONCE, *alternatives]
        results.replays = http_scenarios.replays(
            servers,
            replayed,
            keys,
            plan.rounds,
            plan.requests,
            plan.concurrency,
            reads,
            order=int(database.scalar("SELECT MIN(id) FROM shop_order")),
        )
        _step("hot key")
        results.hot = http_scenarios.hot_keys(
            servers,
            database,
            [OURS, TWIN, WRITTEN_ONCE, LEASE, LEASE_SLOW, LEASE_SLOW_WAITING, *alternatives],
            plan.hot_trials,
            plan.hot_size,
        )


@contextmanager
def _server(env: dict[str, str], plan: Plan, log: Path, wanted: bool) -> Iterator[int | None]:
    """A further server (prepared statements, the replay cache) when its variants run."""
    if not wanted:
        yield None
        return
    with gunicorn(env, plan.workers, plan.threads, log) as port:
        yield port


def _bulk(results: Results, plan: Plan, database: Database, alternatives: Path | None) -> None:
    bulk.setup_django(database, alternatives)
    from idempotency.conf import idempotency_settings

    _step(f"purge of {plan.rows:,} expired records vs a raw batched DELETE")
    deleters = bulk.deleters(idempotency_settings.PURGE_BATCH_SIZE, results.alternatives)
    results.purge = bulk.purge_side_by_side(plan.rows, plan.purge_rounds, deleters)
    if database.mysql:
        results.unsupported.append(
            "On MariaDB/MySQL the recovery scan is not measured (its bulk leases are "
            "PostgreSQL's SQL), nor prepared statements (mysqlclient has none)."
        )
        _step("database floor: the same statements, one process per client (mysql_floor)")
        results.floor = mysql_floor.measure(
            database, plan.floor_rounds, plan.floor_seconds, plan.concurrency
        )
        return
    _step(f"recovery scan: {plan.rows:,} finished records, {plan.expired_leases} expired leases")
    results.recovery = bulk.recovery_scan(plan.rows, plan.expired_leases)
    _step("database floor: the same statements under pgbench")
    results.floor = floor.measure(database, plan.floor_rounds, plan.floor_seconds, plan.concurrency)


def _redis_answers() -> bool:
    parts = urlsplit(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 2):
            return True
    except OSError:
        return False


def _unsupported(alternatives: list[str], skipped: bool) -> list[str]:
    if skipped:
        return ["The alternatives were not installed (--no-alternatives, or pip failed)."]
    lines = [
        "Lease mode, the recovery of lost leases and its scan exist in none of the "
        "alternatives; they are measured for this app alone.",
    ]
    if "django-idempotency-key" in alternatives:
        lines.append(
            "django-idempotency-key keeps responses in a cache (Redis here), not in the "
            "database: it has no purge to compare (the cache expires entries itself)."
        )
    lines.append(
        "drf-idempotencykey and drf-idempotency clean up with one unbatched DELETE "
        "(their management commands): compared as they are."
    )
    return lines


def _setup(plan: Plan, database: Database, args: argparse.Namespace) -> list[str]:
    cpu = _cpu_model()
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    version = database.version
    import django
    import gunicorn as gunicorn_package

    return [
        f"Machine: {os.cpu_count()} cores ({cpu}), {_memory()}, load average at start {load}; "
        "shared with other work, so only ratios from one run are compared.",
        f"{version} on {database.host}:{database.port}; Python "
        f"{platform.python_version()}, Django {django.get_version()}, "
        f"gunicorn {gunicorn_package.__version__}.",
        f"Server: gunicorn, {plan.workers} gthread workers x {plan.threads} threads, "
        "persistent database connections, DEBUG off; served as Django connects by default, "
        + (
            ""
            if database.mysql
            else "with prepared statements (server_side_binding, prepare_threshold 5), "
        )
        + "and as by default with REPLAY_CACHE in Redis, for the variants marked so.",
        f"Client: this process, {plan.concurrency} keep-alive connections, "
        f"{plan.rounds} alternating rounds of {plan.requests} requests per variant"
        + (
            " (--quick: a smoke run, too few requests for its ratios to mean much)"
            if args.quick
            else ""
        )
        + ".",
        f"Hot key: {plan.hot_trials} burst(s) of {plan.hot_size} simultaneous requests "
        f"per variant; bulk: {plan.rows:,} records.",
    ]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB RAM"
    except OSError:
        pass
    return "unknown RAM"


def _step(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _plan(args: argparse.Namespace) -> Plan:
    plan = QUICK if args.quick else FULL
    overrides = {
        name: getattr(args, name)
        for name in ("rounds", "requests", "concurrency", "rows", "workers", "threads")
        if getattr(args, name) is not None
    }
    return replace(plan, **overrides)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of seconds")
    parser.add_argument(
        "--database",
        default=os.environ.get("BENCH_DATABASE", "idempotency_bench"),
        help="database to create (and drop) on the server of BENCH_DATABASE_URL",
    )
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--no-alternatives", action="store_true")
    parser.add_argument(
        "--output", type=Path, default=ROOT / "benchmarks" / "results" / "latest.md"
    )
    for name in ("rounds", "requests", "concurrency", "rows", "workers", "threads"):
        parser.add_argument(f"--{name}", type=int)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
