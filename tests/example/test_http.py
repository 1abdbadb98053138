"""The example project under gunicorn (several worker processes) on PostgreSQL or MariaDB,
over real HTTP.

``tests/support/example_server.py`` creates its database and serves it; the tests talk to
it with urllib from many threads, as a client would.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.example_server import (
    Server,
    example_project,
    gunicorn,
    in_parallel,
    run_tasks,
)
from tests.support.servers import Reply

pytestmark = pytest.mark.server_db


@pytest.fixture(scope="module")
def project(django_db_blocker: Any) -> Iterator[tuple[str, dict[str, str]]]:
    """The example's database, and the environment its server and task worker run with."""
    with example_project(django_db_blocker) as served:
        yield served


@pytest.fixture(scope="module")
def server(project: tuple[str, dict[str, str]]) -> Iterator[Server]:
    database, env = project
    with gunicorn(env) as url:
        yield Server(url=url, database=database)


# --- the admin, as deployed ---------------------------------------------------------------


def test_the_admin_is_styled_with_debug_off(server):
    page = server.request("GET", "/admin/login/", user=None)
    stylesheets = re.findall(rb'<link[^>]+href="(/static/[^"]+\.css)"', page.body)
    assert page.status == 200
    assert b"/static/admin/css/base.css" in stylesheets
    for path in stylesheets:
        css = server.request("GET", path.decode(), user=None)
        assert css.status == 200, path
        assert css.headers["content-type"].startswith("text/css")
        assert b"{" in css.body  # a stylesheet, not an error page
    compressed = server.request(
        "GET", "/static/admin/css/base.css", user=None, headers={"Accept-Encoding": "gzip"}
    )
    assert compressed.headers.get("content-encoding") == "gzip"  # WhiteNoise's precompressed copy
    missing = server.request("GET", "/static/admin/css/no-such-file.css", user=None)
    assert missing.status == 404


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
    assert server.orders_with_sku("http-1") == 1


def test_the_browsable_api_creates_once_per_page_and_stores_json(server):
    page = server.request("GET", "/api/orders/", headers={"Accept": "text/html"})
    found = re.search(rb'name="_idempotency_key" value="([0-9a-f-]{36})"', page.body)
    assert found is not None, "the browsable API's form carries no key"
    form = f"sku=http-form&quantity=1&_idempotency_key={found[1].decode()}".encode()
    headers = {"Accept": "text/html", "Content-Type": "application/x-www-form-urlencoded"}
    first = server.request("POST", "/api/orders/", form, headers=headers)
    again = server.request("POST", "/api/orders/", form, headers=headers)
    as_json = server.request("POST", "/api/orders/", form, headers={**headers, "Accept": "*/*"})

    assert (first.status, first.replayed) == (201, False)
    assert first.headers["content-type"].startswith("text/html")
    for replay in (again, as_json):
        assert (replay.status, replay.replayed) == (201, True)
        assert replay.headers["content-type"] == "application/json"
        assert b"csrfmiddlewaretoken" not in replay.body
    assert as_json.json()["sku"] == "http-form"
    assert server.orders_with_sku("http-form") == 1


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
    assert server.orders_with_sku("http-no-key") == 0


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
    assert server.records_with("idem_key", "http-anon") == 0


def test_validation_error_then_corrected_retry_with_the_same_key(server):
    rejected = server.create_order({"sku": "http-fix", "quantity": 0}, key="http-fix")
    corrected = server.create_order({"sku": "http-fix", "quantity": 1}, key="http-fix")

    assert rejected.status == 400
    assert corrected.status == 201
    assert not corrected.replayed
    assert server.orders_with_sku("http-fix") == 1


def test_two_users_with_the_same_key_get_their_own_orders(server):
    for_alice = server.create_order({"sku": "http-a", "quantity": 1}, key="http-same")
    for_bob = server.create_order({"sku": "http-b", "quantity": 1}, key="http-same", user="bob")
    bobs_list = server.request("GET", "/api/orders/", user="bob").json()

    assert (for_alice.status, for_bob.status) == (201, 201)
    assert not for_bob.replayed
    assert for_bob.json()["id"] != for_alice.json()["id"]
    assert [order["sku"] for order in bobs_list] == ["http-b"]


def test_concurrent_duplicates_create_exactly_one_order(server):
    replies = in_parallel(
        24, lambda: server.create_order({"sku": "http-race", "quantity": 1}, key="http-race")
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
    assert server.orders_with_sku("http-race") == 1


def test_duplicates_of_a_long_report_wait_for_its_outcome_in_every_worker(server):
    # Lease mode, IDEMPOTENCY_WAIT_SECONDS=10: the duplicates land on the three
    # worker processes and are woken by the first attempt's finish, wherever it ran
    # (PostgreSQL: its NOTIFY; MariaDB: their bounded polls).
    def create() -> Reply:
        return server.request(
            "POST", "/api/reports/", {"seconds": 2}, headers={"Idempotency-Key": "http-report"}
        )

    replies = in_parallel(8, create)

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
    assert server.records_with("idem_key", "acme:H-1") == 0

    first = server.callback(_trade(order_id))
    repeats = in_parallel(8, lambda: server.callback(_trade(order_id)))
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
    replies = in_parallel(10, lambda: server.callback(_trade(order_id, trade_no="H-race")))

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
    assert server.records_with("idem_key", "acme:H-404") == 0
    assert server.records_with("idem_key", "acme:H-400") == 0


# --- receipts: a protected view that enqueues a protected django.tasks task ----------------


def receipt_tasks(server: Server, status: str) -> int:
    """The server's ``issue_receipt`` tasks in ``status`` (``READY``, ``SUCCESSFUL``, ...)."""
    return server.count(
        "SELECT count(*) FROM django_tasks_database_dbtaskresult "
        "WHERE task_path = 'example_project.shop.tasks.issue_receipt' AND status = %s",
        status,
    )


def test_receipt_asked_for_at_once_and_again_is_one_task_and_one_receipt(server, project):
    order = server.create_order({"sku": "http-receipt", "quantity": 1}, key="http-receipt")
    path = f"/api/orders/{order.json()['id']}/receipt/"

    def ask(key: str) -> Reply:
        return server.request("POST", path, headers={"Idempotency-Key": key})

    replies = in_parallel(8, lambda: ask("http-receipt-1"))
    again = ask("http-receipt-1")

    assert {reply.status for reply in replies} <= {202, 409}
    originals = [reply for reply in replies if reply.status == 202 and not reply.replayed]
    assert len(originals) == 1
    assert (again.status, again.replayed, again.body) == (202, True, originals[0].body)
    assert receipt_tasks(server, "READY") == 1  # the duplicates enqueued nothing
    assert server.request("GET", path).status == 404  # no worker has run it yet

    run_tasks(project[1])  # a db_worker process, on the server's database
    issued = server.request("GET", path)
    assert issued.status == 200 and issued.json()["order"] == order.json()["id"]

    # A new key is a new request, and a task of its own: it finds the receipt issued.
    assert ask("http-receipt-2").status == 202
    run_tasks(project[1])
    assert receipt_tasks(server, "SUCCESSFUL") == 2
    assert receipt_tasks(server, "READY") == receipt_tasks(server, "FAILED") == 0
    receipts = "SELECT count(*) FROM shop_receipt WHERE order_id = %s"
    assert server.count(receipts, order.json()["id"]) == 1
    assert server.request("GET", path).body == issued.body


# --- bad input over HTTP ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/orders/", "/ninja/orders", "/ninja/async/orders"])
def test_deep_json_is_a_400_problem_and_leaves_the_key_free(server, path):
    deep = b'{"sku": "http-deep", "quantity": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    key = f"http-deep{path.replace('/', '-')}"
    refused = server.create_order(deep, key=key, path=path)
    corrected = server.create_order({"sku": "http-deep", "quantity": 1}, key=key, path=path)

    assert refused.status == 400
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["code"] == "idempotency_request_invalid"
    assert (corrected.status, corrected.replayed) == (201, False)
    assert server.records_with("idem_key", key) == 1


def test_numbers_that_differ_are_refused_not_replayed(server):
    first = server.create_order(b'{"sku": "Infinity", "quantity": 1}', key="http-inf")
    other = server.create_order(b'{"sku": 1e400, "quantity": 1}', key="http-inf")

    assert first.status == 201
    assert (other.status, other.replayed) == (422, False)
    assert other.json()["code"] == "idempotency_key_reused"
    assert server.orders_with_sku("Infinity") == 1


def test_a_nul_character_or_a_non_json_media_type_never_reaches_the_database(server):
    nul = json.dumps({"sku": "a\x00b", "quantity": 1}).encode()
    as_text = {"Idempotency-Key": "http-text", "Content-Type": "text/plain"}
    replies = [
        server.create_order(nul, key="http-nul", path="/ninja/orders"),
        server.create_order(nul, key="http-nul", path="/api/orders/"),
        server.request("POST", "/ninja/orders", b'{"sku": "t", "quantity": 1}', headers=as_text),
        server.request("POST", "/api/orders/", b'{"sku": "t", "quantity": 1}', headers=as_text),
    ]

    assert [reply.status for reply in replies] == [422, 400, 415, 415]
    assert server.records_with("idem_key", "http-nul") == 0
    assert server.records_with("idem_key", "http-text") == 0
