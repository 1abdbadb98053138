"""The example project served for real (gunicorn or uvicorn) on a database of its own.

A database named ``<test database>_http`` is created, on the test database's server
(PostgreSQL or MariaDB), and migrated with ``manage.py``; the demo users are added,
and the server runs from it on a free port. The tests talk to it over HTTP as clients
would, and read the database with connections of their own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from tests.support.processes import database_url
from tests.support.servers import Reply, free_port, send, wait_until_up

ROOT = Path(__file__).resolve().parents[2]
SECRET = "http-test-webhook-secret"
USERS = {"alice": "alice-password", "bob": "bob-password"}
# Per request. Generous: Basic auth hashes a password per request, and 24 of them at once
# on a loaded 2-core machine queue for the CPU (not for the key: that wait is LOCK_TIMEOUT).
TIMEOUT = 60.0


def basic_auth(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{USERS[user]}".encode()).decode()


@dataclass(frozen=True)
class Server:
    url: str
    database: str

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        user: str | None = "alice",
        headers: dict[str, str] | None = None,
    ) -> Reply:
        all_headers = dict(headers or {})
        if user is not None:
            all_headers["Authorization"] = basic_auth(user)
        return send(self.url + path, method, body, all_headers, timeout=TIMEOUT)

    def create_order(
        self, body: Any, key: str | None, user: str = "alice", path: str = "/api/orders/"
    ) -> Reply:
        headers = {} if key is None else {"Idempotency-Key": key}
        return self.request("POST", path, body, user=user, headers=headers)

    def callback(self, body: Any, signature: str | None = "valid") -> Reply:
        raw = body if isinstance(body, bytes) else json_bytes(body)
        headers = {}
        if signature == "valid":
            headers["X-Signature"] = hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
        elif signature is not None:
            headers["X-Signature"] = signature
        return self.request("POST", "/api/payments/callback/", raw, user=None, headers=headers)

    def orders_with_sku(self, sku: str) -> int:
        return self.count("SELECT count(*) FROM shop_order WHERE sku = %s", sku)

    def records_with(self, column: str, value: str) -> int:
        """Records whose ``column`` (``idem_key``, ``operation``, ...) is ``value``."""
        table = "idempotency_idempotencyrecord"
        return self.count(f"SELECT count(*) FROM {table} WHERE {column} = %s", value)

    def count(self, sql: str, *params: Any) -> int:
        with server_connection(self.database) as db, db.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        assert row is not None
        return int(row[0])


def json_bytes(body: Any) -> bytes:
    return json.dumps(body).encode()


@contextmanager
def example_project(django_db_blocker: Any) -> Iterator[tuple[str, dict[str, str]]]:
    """A migrated database with the demo users; yields its name and the server's env.

    Its connections are not the test database's: the block runs with database access
    unblocked (pass pytest-django's ``django_db_blocker``).
    """
    database = f"{connection.settings_dict['NAME']}_http"
    with django_db_blocker.unblock():
        _recreate_database(database)
        env = _environment(database)
        try:
            _manage(env, "migrate", "--noinput", "-v", "0")
            _manage(env, "shell", "-c", _create_users_code())
            with tempfile.TemporaryDirectory(prefix="example-static-") as static:
                collect_static(env, Path(static))
                yield database, env
        finally:
            _drop_database(database)


def prepare_example(url: str) -> dict[str, str]:
    """Migrates the (empty) database at ``url``, adds the demo users; the server's env.

    For a database server of a test's own (a private PostgreSQL cluster).
    """
    env = {**_environment("unused"), "DATABASE_URL": url}
    _manage(env, "migrate", "--noinput", "-v", "0")
    _manage(env, "shell", "-c", _create_users_code())
    return env


def run_tasks(env: dict[str, str]) -> None:
    """``manage.py db_worker`` on the example's database, a process of its own as deployed:
    every task ready, then back."""
    _manage(env, "db_worker", "--batch", "--no-startup-delay", "-v", "0")


def collect_static(env: dict[str, str], root: Path) -> None:
    """``collectstatic`` into ``root``, set as the server's ``STATIC_ROOT`` in ``env``.

    As deployed: with DEBUG off, WhiteNoise serves what was collected, nothing else.
    """
    env["STATIC_ROOT"] = str(root)
    _manage(env, "collectstatic", "--noinput", "-v", "0")


@contextmanager
def server_connection(name: str | None) -> Iterator[BaseDatabaseWrapper]:
    """A connection of its own to database ``name`` on the test database's server
    (``None``: to the server itself, to create or drop databases)."""
    default = connections[DEFAULT_DB_ALIAS]
    other = type(default)({**default.settings_dict, "NAME": name})
    try:
        yield other
    finally:
        other.close()


def _recreate_database(name: str) -> None:
    _drop_database(name)
    with server_connection(None) as server, server.cursor() as cursor:
        suffix = connection.creation.sql_table_creation_suffix()  # encoding, collation
        cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)} {suffix}")


def _drop_database(name: str) -> None:
    # PostgreSQL refuses while a connection is open; FORCE ends what a killed worker left.
    force = " WITH (FORCE)" if connection.vendor == "postgresql" else ""
    with server_connection(None) as server, server.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(name)}{force}")


def _environment(database: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"TEST_DATABASE_NAME", "REQUIRE_POSTGRES", "REQUIRE_MARIADB"}
    }
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        DATABASE_URL=database_url(database),
        SECRET_KEY="http-test-secret-key",
        DEBUG="False",
        ALLOWED_HOSTS="127.0.0.1",
        PAYMENT_WEBHOOK_SECRET=SECRET,
        # Duplicates of a report being generated wait for it (lease mode, WAIT_SECONDS).
        IDEMPOTENCY_WAIT_SECONDS="10",
        # Each request logs in with HTTP Basic: a slow hasher would make them seconds.
        PASSWORD_HASHERS="django.contrib.auth.hashers.MD5PasswordHasher",
        PYTHONUNBUFFERED="1",
    )
    if os.environ.get("PGBOUNCER"):  # the test database is behind scripts/pgbouncer.sh
        env["DATABASE_TRANSACTION_POOLING"] = "True"
    return env


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )


def _create_users_code() -> str:
    return "from django.contrib.auth.models import User\n" + "".join(
        f"User.objects.create_user({name!r}, password={password!r})\n"
        for name, password in USERS.items()
    )


@contextmanager
def gunicorn(env: dict[str, str]) -> Iterator[str]:
    """Serves the example project (WSGI, several workers) for the ``with`` block."""
    with gunicorn_instance(env) as (url, _process):
        yield url


@contextmanager
def gunicorn_instance(env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``gunicorn``, and its master process: its own process group, which a test may kill."""
    port = free_port()
    command = [
        *(sys.executable, "-m", "gunicorn", "example_project.wsgi:application"),
        *("--bind", f"127.0.0.1:{port}", "--workers", "3", "--threads", "4"),
        *("--timeout", "30", "--graceful-timeout", "5"),
        *_no_control_socket(),
    ]
    with _serving(command, env, port, "gunicorn") as served:
        yield served


@contextmanager
def uvicorn(env: dict[str, str]) -> Iterator[str]:
    """Serves the example project under ASGI (one event loop) for the ``with`` block."""
    port = free_port()
    command = [
        *(sys.executable, "-m", "uvicorn", "example_project.asgi:application"),
        *("--host", "127.0.0.1", "--port", str(port), "--no-access-log"),
    ]
    with _serving(command, env, port, "uvicorn") as (url, _process):
        yield url


@contextmanager
def _serving(
    command: list[str], env: dict[str, str], port: int, name: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Runs ``command`` until the block ends; always stops it and prints its log."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers with it, in a group of their own
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(process, url + "/", name)
            yield url, process
        finally:
            _stop(process)
            log.seek(0)
            print(log.read().decode(errors="replace")[-5000:])


def _no_control_socket() -> list[str]:
    # Newer gunicorns open a control socket at one fixed path per user; parallel
    # test runs would fight over it.
    from gunicorn.config import KNOWN_SETTINGS

    if any(setting.name == "control_socket" for setting in KNOWN_SETTINGS):
        return ["--no-control-socket"]
    return []


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def in_parallel(count: int, call: Callable[[], Reply]) -> list[Reply]:
    """``count`` calls released together by a barrier, each on its own thread."""
    barrier = threading.Barrier(count, timeout=TIMEOUT)

    def one(_: int) -> Reply:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count), timeout=TIMEOUT * 3))


class HeldTable:
    """A transaction of the test's own holding a table lock on the server's database."""

    def __init__(self, db: BaseDatabaseWrapper, database: str) -> None:
        self.db, self.database = db, database

    def wait_for_a_blocked_insert(self, timeout: float = 30.0) -> None:
        """Until a session of the server waits for a lock (an attempt's order insert)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.db.cursor() as cursor:
                # Inside a transaction, statistics views keep their first snapshot unless cleared.
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = %s AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
                    [self.database],
                )
                if cursor.fetchone()[0]:
                    return
            time.sleep(0.05)
        raise AssertionError("no attempt reached the orders table")


@contextmanager
def orders_held(server: Server) -> Iterator[HeldTable]:
    """PostgreSQL: inserts into ``shop_order`` wait until the block ends.

    An attempt that claimed its key then stays in flight, holding its record's row
    lock, for as long as the test needs: its duplicates meet a real in-flight attempt.
    """
    with server_connection(server.database) as db:
        db.set_autocommit(False)
        with db.cursor() as cursor:
            cursor.execute("LOCK TABLE shop_order IN EXCLUSIVE MODE")
        try:
            yield HeldTable(db, server.database)
        finally:
            db.rollback()
