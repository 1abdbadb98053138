"""The example project under gunicorn (several worker processes) on PostgreSQL, over real HTTP.

A database of its own (``<test database>_http``) is created and migrated with
``manage.py``; gunicorn serves ``example_project.wsgi:application`` from it and
the tests talk to it with urllib from many threads, as a client would.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parent.parent
SECRET = "http-test-webhook-secret"
USERS = {"alice": "alice-password", "bob": "bob-password"}
TIMEOUT = 20.0


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotent-replayed") == "true"


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
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if user is not None:
            token = base64.b64encode(f"{user}:{USERS[user]}".encode()).decode()
            all_headers["Authorization"] = f"Basic {token}"
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers=all_headers
        )
        try:
            with _OPENER.open(request, timeout=TIMEOUT) as response:
                return _reply(response.status, response.headers, response.read())
        except urllib.error.HTTPError as error:
            return _reply(error.code, error.headers, error.read())

    def create_order(self, body: Any, key: str | None, user: str = "alice") -> Reply:
        headers = {} if key is None else {"Idempotency-Key": key}
        return self.request("POST", "/api/orders/", body, user=user, headers=headers)

    def callback(self, body: Any, signature: str | None = "valid") -> Reply:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
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


# No proxy from the environment may stand between the tests and 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _reply(status: int, headers: Any, body: bytes) -> Reply:
    return Reply(status, {name.lower(): value for name, value in headers.items()}, body)


# --- the server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    if connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL: run it with DATABASE_URL=postgres://...")
    database = _connection_params()
    _recreate_database(database)
    env = _environment(database)
    try:
        _manage(env, "migrate", "--noinput", "-v", "0")
        _manage(env, "shell", "-c", _create_users_code())
        with _gunicorn(env) as url:
            yield Server(url=url, database=database)
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
        IDEMPOTENCY_WAIT_SECONDS="10",
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def _gunicorn(env: dict[str, str]) -> Iterator[str]:
    """Serves the example project for the ``with`` block; always stops it and prints its log."""
    port = _free_port()
    command = [
        *(sys.executable, "-m", "gunicorn", "example_project.wsgi:application"),
        *("--bind", f"127.0.0.1:{port}", "--workers", "3", "--threads", "4"),
        *("--timeout", "30", "--graceful-timeout", "5"),
        *_no_control_socket(),
    ]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_until_up(process, url)
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


def _wait_until_up(process: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"gunicorn exited with {process.returncode}")
        try:
            with _OPENER.open(url + "/", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    pytest.fail("gunicorn did not answer within 30 s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def _in_parallel(count: int, call: Any) -> list[Reply]:
    """``count`` calls released together by a barrier, each on its own thread."""
    barrier = threading.Barrier(count, timeout=TIMEOUT)

    def one(_: int) -> Reply:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count), timeout=TIMEOUT * 3))


def _orders_with_sku(server: Server, sku: str) -> int:
    return server.count("SELECT count(*) FROM shop_order WHERE sku = %s", sku)


def _records_with_key(server: Server, key: str) -> int:
    return server.count(
        "SELECT count(*) FROM idempotency_idempotencyrecord WHERE idem_key = %s", key
    )


# --- orders -------------------------------------------------------------------------------


def test_root_answers_200(server):
    reply = server.request("GET", "/", user=None)

    assert reply.status == 200
    assert "order-list" in reply.json()


def test_first_request_then_replay_then_reuse_with_another_body(server):
    first = server.create_order({"sku": "http-1", "quantity": 2}, key="http-k1")
    replay = server.create_order({"quantity": 2, "sku": "http-1"}, key="http-k1")
    reused = server.create_order({"sku": "http-1", "quantity": 3}, key="http-k1")

    assert first.status == 201
    assert {k: first.json()[k] for k in ("sku", "quantity")} == {"sku": "http-1", "quantity": 2}
    assert not first.replayed
    assert (replay.status, replay.body, replay.replayed) == (201, first.body, True)
    assert replay.headers["location"] == first.headers["location"]
    assert reused.status == 422
    assert reused.headers["content-type"] == "application/problem+json"
    assert reused.json()["code"] == "idempotency_key_reused"
    assert _orders_with_sku(server, "http-1") == 1


@pytest.mark.parametrize(
    ("key", "code"),
    [
        (None, "idempotency_key_missing"),
        ("bad key", "idempotency_key_invalid"),
        ("k" * 300, "idempotency_key_invalid"),
    ],
)
def test_missing_or_malformed_key_is_400(server, key, code):
    reply = server.create_order({"sku": "http-no-key", "quantity": 1}, key=key)

    assert reply.status == 400
    assert reply.json()["code"] == code
    assert _orders_with_sku(server, "http-no-key") == 0


def test_anonymous_callers_are_refused_and_leave_no_record(server):
    create = server.request(
        "POST",
        "/api/orders/",
        {"sku": "anon", "quantity": 1},
        user=None,
        headers={"Idempotency-Key": "http-anon"},
    )
    listing = server.request("GET", "/api/orders/", user=None)

    assert create.status in (401, 403)
    assert listing.status in (401, 403)
    assert _records_with_key(server, "http-anon") == 0


def test_validation_error_then_corrected_retry_with_the_same_key(server):
    rejected = server.create_order({"sku": "http-fix", "quantity": 0}, key="http-fix")
    corrected = server.create_order({"sku": "http-fix", "quantity": 1}, key="http-fix")

    assert rejected.status == 400
    assert corrected.status == 201
    assert not corrected.replayed
    assert _orders_with_sku(server, "http-fix") == 1


def test_two_users_with_the_same_key_get_their_own_orders(server):
    for_alice = server.create_order({"sku": "http-a", "quantity": 1}, key="http-same")
    for_bob = server.create_order({"sku": "http-b", "quantity": 1}, key="http-same", user="bob")
    bobs_list = server.request("GET", "/api/orders/", user="bob").json()

    assert (for_alice.status, for_bob.status) == (201, 201)
    assert not for_bob.replayed
    assert for_bob.json()["id"] != for_alice.json()["id"]
    assert [order["sku"] for order in bobs_list] == ["http-b"]


def test_concurrent_duplicates_create_exactly_one_order(server):
    replies = _in_parallel(
        20, lambda: server.create_order({"sku": "http-race", "quantity": 1}, key="http-race")
    )

    statuses = sorted(reply.status for reply in replies)
    assert set(statuses) <= {201, 409}, statuses
    originals = [reply for reply in replies if reply.status == 201 and not reply.replayed]
    assert len(originals) == 1
    for reply in replies:
        if reply.status == 201:
            assert reply.body == originals[0].body
        else:
            assert reply.headers["retry-after"].isdigit()
            assert reply.json()["code"] == "idempotency_key_in_use"
    assert _orders_with_sku(server, "http-race") == 1


def test_duplicates_of_a_long_report_wait_for_its_outcome_in_every_worker(server):
    # Lease mode, IDEMPOTENCY_WAIT_SECONDS=10: the duplicates land on the three
    # worker processes and are woken by the first attempt's NOTIFY, wherever it ran.
    def create() -> Reply:
        return server.request(
            "POST", "/api/reports/", {"seconds": 2}, headers={"Idempotency-Key": "http-report"}
        )

    replies = _in_parallel(8, create)

    assert [reply.status for reply in replies] == [201] * 8  # without waiting: 409s
    originals = [reply for reply in replies if not reply.replayed]
    assert len(originals) == 1
    assert {reply.body for reply in replies} == {originals[0].body}
    made = "SELECT count(*) FROM reports_report WHERE idempotency_key = %s"
    assert server.count(made, "http-report") == 1


# --- payment callbacks --------------------------------------------------------------------


@pytest.fixture(scope="module")
def order_id(server: Server) -> int:
    reply = server.create_order({"sku": "http-pay", "quantity": 1}, key="http-pay")
    assert reply.status == 201
    return int(reply.json()["id"])


def _trade(order_id: int, **changes: Any) -> dict[str, Any]:
    return {
        "provider": "acme",
        "trade_no": "H-1",
        "order_id": order_id,
        "amount": "12.50",
        **changes,
    }


def test_callback_repeated_changed_and_badly_signed(server, order_id):
    unsigned = server.callback(_trade(order_id), signature=None)
    forged = server.callback(_trade(order_id), signature="0" * 64)
    assert (unsigned.status, forged.status) == (401, 401)
    assert _records_with_key(server, "acme:H-1") == 0

    first = server.callback(_trade(order_id))
    repeats = _in_parallel(8, lambda: server.callback(_trade(order_id)))
    changed = server.callback(_trade(order_id, amount="99.00"))

    assert (first.status, first.json()) == (200, {"order_id": order_id, "status": "PAID"})
    assert all(reply.status == 200 and reply.replayed for reply in repeats)
    assert all(reply.body == first.body for reply in repeats)
    assert changed.status == 422
    assert changed.json()["code"] == "idempotency_key_reused"
    assert server.count("SELECT count(*) FROM shop_payment WHERE trade_no = 'H-1'") == 1
    assert (
        server.count("SELECT count(*) FROM shop_order WHERE id = %s AND status = 'PAID'", order_id)
        == 1
    )


def test_concurrent_first_callbacks_pay_once(server, order_id):
    replies = _in_parallel(10, lambda: server.callback(_trade(order_id, trade_no="H-race")))

    assert {reply.status for reply in replies} <= {200, 409}
    assert len([reply for reply in replies if reply.status == 200 and not reply.replayed]) == 1
    assert server.count("SELECT count(*) FROM shop_payment WHERE trade_no = 'H-race'") == 1


def test_callback_for_an_unknown_order_or_malformed_body(server, order_id):
    unknown = server.callback(_trade(order_id + 10_000, trade_no="H-404"))
    malformed = server.callback(b'{"provider": "acme", "trade_no": ')
    invalid = server.callback(_trade(order_id, trade_no="H-400", amount="-1"))

    assert unknown.status == 404
    assert malformed.status == 400
    assert invalid.status == 400
    assert _records_with_key(server, "acme:H-404") == 0
    assert _records_with_key(server, "acme:H-400") == 0
