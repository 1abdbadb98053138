"""Database outages under load, over real HTTP: the example project under gunicorn.

While clients create orders (DRF, ninja, async ninja), the database ends the
app's connections: ``pg_terminate_backend`` on PostgreSQL, ``KILL CONNECTION`` on
MariaDB, and a restart of a private PostgreSQL cluster started by the test (never
the shared server). Every answer of 500 or more must be a 503 problem+json with
Retry-After; no key may have two orders; no record may be left PROCESSING; and
one more retry of every key, once the database is back, gives exactly one order.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.support.example_server import (
    Server,
    example_project,
    gunicorn,
    prepare_example,
    server_connection,
)
from tests.support.servers import Reply, free_port

ENDPOINTS = ("/api/orders/", "/ninja/orders", "/ninja/async/orders")
CLIENTS = 8
LOAD_SECONDS = 8.0


@dataclass
class Load:
    """Clients creating orders, one key (and sku) per order, until told to stop."""

    server: Server
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    replies: list[tuple[str, Reply]] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)  # key -> endpoint
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self, number: int) -> None:
        for count in range(10_000):
            if self.stop.is_set():
                return
            key = f"o-{self.run}-{number}-{count}"
            path = ENDPOINTS[count % len(ENDPOINTS)]
            with self.lock:
                self.keys[key] = path
            for _ in range(3):  # a client retries a 503 at once, with the same key
                reply = self.server.create_order({"sku": key, "quantity": 1}, key, path=path)
                with self.lock:
                    self.replies.append((key, reply))
                if reply.status != 503:
                    break

    def during(self, outage: Callable[[threading.Event], int]) -> int:
        """Runs the clients for ``LOAD_SECONDS`` while ``outage`` runs; its count of kills."""
        threads = [threading.Thread(target=self.client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        try:
            return outage(self.stop)
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=120)


def assert_outages_answered(load: Load, orders: dict[str, int], processing: int) -> None:
    failures = [reply for _, reply in load.replies if reply.status >= 500]
    print(f"{len(load.replies)} answers, {len(failures)} of them >= 500, {len(load.keys)} keys")
    assert failures, "the outage never reached a request: the test proved nothing"
    for reply in failures:
        assert reply.status == 503, reply.body[:300]
        assert reply.headers["content-type"] == "application/problem+json", reply.body[:300]
        assert reply.headers["retry-after"].isdigit()
        # A connection ended at the COMMIT leaves the outcome unknown: the other 503 code.
        assert reply.json()["code"] in ("database_unavailable", "outcome_unknown")
        assert "nothing was recorded" not in reply.json()["detail"]
    unexpected = {r.status for _, r in load.replies} - {201, 409, 503}
    assert not unexpected, unexpected
    assert all(count == 1 for count in orders.values()), "a key made two orders"
    assert processing == 0, "records left PROCESSING"


def retry_every_key(load: Load, count_orders: Callable[[], dict[str, int]]) -> None:
    """One more try of every key, the database being back: one order each."""
    for key, path in load.keys.items():
        reply = load.server.create_order({"sku": key, "quantity": 1}, key, path=path)
        assert reply.status == 201, (key, reply.status, reply.body[:300])
        assert reply.json()["sku"] == key
    orders = count_orders()
    assert set(orders) == set(load.keys)
    assert set(orders.values()) == {1}


# --- the test database's server: its app connections killed --------------------------


@pytest.fixture(scope="module")
def served(django_db_blocker: Any) -> Iterator[Server]:
    with example_project(django_db_blocker) as (database, env), gunicorn(env) as url:
        yield Server(url=url, database=database)


def kill_app_connections(database: str) -> Callable[[threading.Event], int]:
    """Every 0.2 s, the server ends every connection of ``database`` but its own."""

    def kill(stop: threading.Event) -> int:
        killed = 0
        deadline = time.monotonic() + LOAD_SECONDS
        with server_connection(None) as server:
            while time.monotonic() < deadline:
                killed += _kill_once(server, database)
                time.sleep(0.2)
        return killed

    return kill


def _kill_once(server: Any, database: str) -> int:
    with server.cursor() as cursor:
        if server.vendor == "postgresql":
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                [database],
            )
            return int(cursor.fetchone()[0])
        cursor.execute(
            "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()",
            [database],
        )
        killed = 0
        for (pid,) in cursor.fetchall():
            try:
                cursor.execute(f"KILL CONNECTION {int(pid)}")
                killed += 1
            except Exception:  # it ended by itself meanwhile
                pass
        return killed


def _counts(server: Server, run: str) -> tuple[dict[str, int], int]:
    with server_connection(server.database) as db, db.cursor() as cursor:
        cursor.execute(
            "SELECT sku, count(*) FROM shop_order WHERE sku LIKE %s GROUP BY sku", [f"o-{run}-%"]
        )
        orders = {sku: int(count) for sku, count in cursor.fetchall()}
        cursor.execute(
            "SELECT count(*) FROM idempotency_idempotencyrecord WHERE status = 'PROCESSING'"
        )
        processing = int(cursor.fetchone()[0])
    return orders, processing


@pytest.mark.server_db
def test_killed_connections_under_load_are_503s_and_retries_make_one_order(served):
    load = Load(served)
    killed = load.during(kill_app_connections(served.database))

    assert killed > 0
    orders, processing = _counts(served, load.run)
    assert_outages_answered(load, orders, processing)
    retry_every_key(load, lambda: _counts(served, load.run)[0])


# --- a private PostgreSQL cluster, restarted under load -------------------------------


@dataclass
class Cluster:
    directory: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/outage_app"

    def ctl(self, *args: str) -> None:
        # -l each time: the server it starts keeps no pipe of ours open (restart too).
        data, log = str(self.directory / "data"), str(self.directory / "log")
        _as_postgres([_binary("pg_ctl"), "-D", data, "-l", log, *args])

    def query(self, sql: str, *params: Any, database: str = "outage_app") -> list[Any]:
        import psycopg

        dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"
        with psycopg.connect(dsn, autocommit=True) as db:
            cursor = db.execute(sql, params or None)
            return cursor.fetchall() if cursor.description else []


def _binary(name: str) -> str:
    installed = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"))
    found = shutil.which(name) or (installed[-1] if installed else None)
    if found is None:
        pytest.fail(f"{name} not found: install PostgreSQL's server binaries (postgresql package)")
    return found


def _as_postgres(command: list[str]) -> None:
    # initdb refuses to run as root: as root, run it as the postgres user.
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run(
        [*prefix, *command],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=60,
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    directory = Path(tempfile.mkdtemp(prefix="idem-outage-pg-"))
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    port = free_port()
    private = Cluster(directory, port)
    data = str(directory / "data")
    _as_postgres([_binary("initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync"])
    options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off"
    private.ctl("-o", options, "-w", "start")
    try:
        private.query("CREATE DATABASE outage_app", database="postgres")
        yield private
    finally:
        private.ctl("-m", "immediate", "-w", "stop")
        shutil.rmtree(directory, ignore_errors=True)


def restart_twice(cluster: Cluster) -> Callable[[threading.Event], int]:
    def restart(stop: threading.Event) -> int:
        for _ in range(2):
            time.sleep(LOAD_SECONDS / 3)
            cluster.ctl("-m", "fast", "-w", "restart")
        time.sleep(LOAD_SECONDS / 3)
        return 2

    return restart


@pytest.mark.postgres
def test_a_postgresql_restart_under_load_is_503s_and_retries_make_one_order(cluster):
    assert connection.vendor == "postgresql"
    env = prepare_example(cluster.url)

    def counts() -> tuple[dict[str, int], int]:
        rows = cluster.query(
            "SELECT sku, count(*) FROM shop_order WHERE sku LIKE %s GROUP BY sku", f"o-{run}-%"
        )
        (processing,) = cluster.query(
            "SELECT count(*) FROM idempotency_idempotencyrecord WHERE status = 'PROCESSING'"
        )[0]
        return {sku: int(count) for sku, count in rows}, int(processing)

    with gunicorn(env) as url:
        load = Load(Server(url=url, database="outage_app"))
        run = load.run
        load.during(restart_twice(cluster))
        orders, processing = counts()
        assert_outages_answered(load, orders, processing)
        retry_every_key(load, lambda: counts()[0])
