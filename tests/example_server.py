"""The example project served for real (gunicorn or uvicorn) on a PostgreSQL database of its own.

A database named ``<test database>_http`` is created and migrated with ``manage.py``,
the demo users are added, and the server runs from it on a free port; the tests talk
to it over HTTP as clients would, and read the database with their own connection.
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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from tests.servers import Reply, free_port, send, wait_until_up

ROOT = Path(__file__).resolve().parent.parent
SECRET = "http-test-webhook-secret"
USERS = {"alice": "alice-password", "bob": "bob-password"}
TIMEOUT = 20.0


def basic_auth(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{USERS[user]}".encode()).decode()


@dataclass(frozen=True)
class Server:
    url: str
    database: dict[str, Any]

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

    def count(self, sql: str, *params: Any) -> int:
        with psycopg.connect(**self.database) as db:
            row = db.execute(sql, params).fetchone()
        assert row is not None
        return int(row[0])


def json_bytes(body: Any) -> bytes:
    return json.dumps(body).encode()


@contextmanager
def example_project() -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """A migrated database with the demo users; yields its parameters and the server's env."""
    if connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL: run it with DATABASE_URL=postgres://...")
    database = _connection_params()
    _recreate_database(database)
    env = _environment(database)
    try:
        _manage(env, "migrate", "--noinput", "-v", "0")
        _manage(env, "shell", "-c", _create_users_code())
        yield database, env
    finally:
        _drop_database(database)


def _connection_params() -> dict[str, Any]:
    default = settings.DATABASES["default"]
    params = {
        "host": default.get("HOST") or "127.0.0.1",
        "port": int(default.get("PORT") or 5432),
        "user": default.get("USER") or "postgres",
        "dbname": f"{default['NAME']}_http",
    }
    if default.get("PASSWORD"):
        params["password"] = default["PASSWORD"]
    return params


def _admin_connection(database: dict[str, Any]) -> psycopg.Connection[Any]:
    return psycopg.connect(**{**database, "dbname": "postgres"}, autocommit=True)


def _recreate_database(database: dict[str, Any]) -> None:
    name = psycopg.sql.Identifier(database["dbname"])
    with _admin_connection(database) as admin:
        admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(name))


def _drop_database(database: dict[str, Any]) -> None:
    name = psycopg.sql.Identifier(database["dbname"])
    with _admin_connection(database) as admin:
        admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


def _environment(database: dict[str, Any]) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"TEST_DATABASE_NAME", "REQUIRE_POSTGRES"}
    }
    password = f":{database['password']}" if "password" in database else ""
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        DATABASE_URL=(
            f"postgres://{database['user']}{password}@{database['host']}:{database['port']}"
            f"/{database['dbname']}"
        ),
        SECRET_KEY="http-test-secret-key",
        DEBUG="False",
        ALLOWED_HOSTS="127.0.0.1",
        PAYMENT_WEBHOOK_SECRET=SECRET,
        # Each request logs in with HTTP Basic: a slow hasher would make them seconds.
        PASSWORD_HASHERS="django.contrib.auth.hashers.MD5PasswordHasher",
        PYTHONUNBUFFERED="1",
    )
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
    port = free_port()
    command = [
        *(sys.executable, "-m", "gunicorn", "example_project.wsgi:application"),
        *("--bind", f"127.0.0.1:{port}", "--workers", "3", "--threads", "4"),
        *("--timeout", "30", "--graceful-timeout", "5"),
        *_no_control_socket(),
    ]
    with _serving(command, env, port, "gunicorn") as url:
        yield url


@contextmanager
def uvicorn(env: dict[str, str]) -> Iterator[str]:
    """Serves the example project under ASGI (one event loop) for the ``with`` block."""
    port = free_port()
    command = [
        *(sys.executable, "-m", "uvicorn", "example_project.asgi:application"),
        *("--host", "127.0.0.1", "--port", str(port), "--no-access-log"),
    ]
    with _serving(command, env, port, "uvicorn") as url:
        yield url


@contextmanager
def _serving(command: list[str], env: dict[str, str], port: int, name: str) -> Iterator[str]:
    """Runs ``command`` until the block ends; always stops it and prints its log."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(process, url + "/", name)
            yield url
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
