#!/usr/bin/env python
"""Where a request's time goes: ``.venv/bin/python benchmarks/inprocess.py``.

Serves the benchmark project's order create through Django's test client in
this process (no HTTP, no gunicorn, no load generator) and measures, per
request, the CPU time of this process and of its PostgreSQL backend (read from
``/proc``, so the server must run on this machine), in alternating rounds:
the unprotected create, the protected create, and replays of recorded keys,
each on a connection as Django makes it by default and on one that prepares
its statements (``OPTIONS`` ``server_side_binding`` and ``prepare_threshold``,
Django's statements and this app's alike; the connection is made again for
each round). Prints a markdown table. Needs PostgreSQL as
``benchmarks/run.py`` does; creates and drops the database
``idempotency_inprocess``.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.server import PASSWORD, USER, Database  # noqa: E402
from benchmarks.stats import rotated  # noqa: E402

BODY = b'{"sku": "bench", "quantity": 1}'
PREPARING = {"server_side_binding": True, "prepare_threshold": 0}


@dataclass
class Cost:
    """Seconds spent over ``requests`` requests."""

    requests: int = 0
    process: float = 0.0
    backend: float | None = 0.0
    wall: float = 0.0

    def per_request_ms(self, seconds: float | None) -> str:
        if seconds is None or not self.requests:
            return "-"
        return f"{seconds / self.requests * 1000:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    database = Database.named(args.database)
    database.recreate()
    try:
        costs = _measure(database, args.rounds, args.requests)
    finally:
        database.drop()
    print(_table(costs))
    return 0


def requests_of(database: Database) -> dict[str, Callable[[], None]]:
    """Django set up on ``database`` (migrated, the benchmark user made, warmed up).

    Returns one callable per variant, each serving one request through the test
    client: ``unprotected``, ``idempotency (atomic)`` (a new key), ``replays``
    (a key recorded by an earlier protected create), the placed order
    (``benchmarks/views.py``: a create as a real endpoint does it) without and
    with protection, and ``idempotency (atomic), the twin`` (the unprotected
    view with the mixin, routed alike).
    """
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["DATABASE_URL"] = database.url
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    get_user_model().objects.create_user(USER, password=PASSWORD)
    client = Client(HTTP_HOST="127.0.0.1")
    credentials = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    recorded: list[str] = []

    def post(path: str, key: str | None) -> None:
        headers = {"HTTP_AUTHORIZATION": f"Basic {credentials}"}
        if key is not None:
            headers["HTTP_IDEMPOTENCY_KEY"] = key
        response = client.post(path, BODY, content_type="application/json", **headers)
        if response.status_code != 201:
            raise RuntimeError(f"{path}: {response.status_code} {response.content[:300]!r}")

    def unprotected() -> None:
        post("/bench/orders/plain/", None)

    def protected() -> None:
        recorded.append(str(uuid.uuid4()))
        post("/api/orders/", recorded[-1])

    def protected_twin() -> None:
        post("/bench/orders/protected/", str(uuid.uuid4()))

    def replay() -> None:
        post("/api/orders/", recorded[len(recorded) // 2])

    def placed() -> None:
        post("/bench/orders/placed/", None)

    def placed_protected() -> None:
        post("/bench/orders/placed-protected/", str(uuid.uuid4()))

    for _ in range(20):  # warm up: imports, caches, the first keys to replay
        unprotected()
        protected()
        placed()
        placed_protected()
        protected_twin()
    return {
        "unprotected": unprotected,
        "idempotency (atomic)": protected,
        "replays": replay,
        "placed order, unprotected": placed,
        "placed order, idempotency (atomic)": placed_protected,
        "idempotency (atomic), the twin": protected_twin,
    }


def _measure(database: Database, rounds: int, requests: int) -> dict[str, Cost]:
    from django.db import connection

    work = requests_of(database)
    variants: dict[str, tuple[Callable[[], None], bool]] = {
        "unprotected": (work["unprotected"], False),
        "unprotected, prepared": (work["unprotected"], True),
        "idempotency (atomic)": (work["idempotency (atomic)"], False),
        "idempotency (atomic), prepared": (work["idempotency (atomic)"], True),
        "replays": (work["replays"], False),
        "replays, prepared": (work["replays"], True),
        "placed order, unprotected": (work["placed order, unprotected"], False),
        "placed order, idempotency (atomic)": (work["placed order, idempotency (atomic)"], False),
    }
    options = {
        name: value
        for name, value in connection.settings_dict["OPTIONS"].items()
        if name not in PREPARING
    }
    costs = {name: Cost() for name in variants}
    for round_ in range(rounds):
        for name in rotated(list(variants), round_):
            work_, prepared = variants[name]
            connection.close()  # psycopg reads the options when it connects
            connection.settings_dict["OPTIONS"] = options | (PREPARING if prepared else {})
            connection.ensure_connection()
            _run(costs[name], work_, requests, _backend_cpu(connection))
    return costs


def _run(
    cost: Cost, work: Callable[[], None], requests: int, backend: Callable[[], float | None]
) -> None:
    backend_before = backend()
    process_before, wall_before = time.process_time(), time.perf_counter()
    for _ in range(requests):
        work()
    cost.wall += time.perf_counter() - wall_before
    cost.process += time.process_time() - process_before
    backend_after = backend()
    if cost.backend is None or backend_before is None or backend_after is None:
        cost.backend = None
    else:
        cost.backend += backend_after - backend_before
    cost.requests += requests


def _backend_cpu(connection: object) -> Callable[[], float | None]:
    """User and system CPU seconds of this connection's PostgreSQL backend, or None."""
    with connection.cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    ticks = os.sysconf("SC_CLK_TCK")

    def read() -> float | None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # another machine, or another user's process
            return None
        return (int(fields[11]) + int(fields[12])) / ticks

    return read


def _table(costs: dict[str, Cost]) -> str:
    rows = [
        "| variant | requests | this process, CPU ms | PostgreSQL backend, CPU ms | wall ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, cost in costs.items():
        rows.append(
            f"| {name} | {cost.requests} | {cost.per_request_ms(cost.process)} "
            f"| {cost.per_request_ms(cost.backend)} | {cost.per_request_ms(cost.wall)} |"
        )
    return "\n".join(rows)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=300, help="per variant and round")
    parser.add_argument(
        "--database", default=os.environ.get("BENCH_INPROCESS_DATABASE", "idempotency_inprocess")
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
