"""The example project's ninja API over real HTTP on PostgreSQL: the sync operation under
gunicorn (worker processes), the async one under uvicorn (one event loop), with
concurrent duplicates; then both servers' OpenAPI schemas, as a client fetches them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openapi_spec_validator import validate

from tests.support.example_server import Server, example_project, gunicorn, in_parallel, uvicorn

pytestmark = pytest.mark.server_db

ORDER = {"sku": "ninja-1", "quantity": 2}


@pytest.fixture(scope="module")
def project(django_db_blocker: Any) -> Iterator[tuple[str, dict[str, str]]]:
    with example_project(django_db_blocker) as database_and_env:
        yield database_and_env


@pytest.fixture(scope="module")
def wsgi(project) -> Iterator[Server]:
    database, env = project
    with gunicorn(env) as url:
        yield Server(url=url, database=database)


@pytest.fixture(scope="module")
def asgi(project) -> Iterator[Server]:
    database, env = project
    with uvicorn(env) as url:
        yield Server(url=url, database=database)


@pytest.mark.parametrize(
    ("served_by", "path", "operation"),
    [
        ("wsgi", "/ninja/orders", "ninja.orders.create"),
        ("asgi", "/ninja/async/orders", "ninja.orders.create-async"),
        ("wsgi", "/ninja/async/orders", "ninja.orders.create-async"),
        ("asgi", "/ninja/orders", "ninja.orders.create"),
    ],
)
def test_first_replay_reuse_and_errors(request, served_by, path, operation):
    server: Server = request.getfixturevalue(served_by)
    sku = f"{served_by}{path}"
    body = {**ORDER, "sku": sku}
    first = server.create_order(body, key=f"k-{sku}", path=path)
    replay = server.create_order(body, key=f"k-{sku}", path=path)
    reused = server.create_order({**body, "quantity": 3}, key=f"k-{sku}", path=path)
    missing = server.create_order(body, key=None, path=path)
    anonymous = server.request(
        "POST", path, body, user=None, headers={"Idempotency-Key": f"anon-{sku}"}
    )

    assert first.status == 201 and not first.replayed
    assert {k: first.json()[k] for k in ("sku", "quantity", "status")} == {
        **body,
        "status": "PENDING",
    }
    assert (replay.status, replay.body, replay.replayed) == (201, first.body, True)
    assert replay.headers["content-type"] == first.headers["content-type"]
    assert (reused.status, reused.json()["code"]) == (422, "idempotency_key_reused")
    assert (missing.status, missing.json()["code"]) == (400, "idempotency_key_missing")
    assert missing.headers["content-type"] == "application/problem+json"
    assert anonymous.status in (401, 403)  # no credentials, or session auth without CSRF
    assert server.orders_with_sku(sku) == 1
    assert server.records_with("operation", operation) >= 1


@pytest.mark.parametrize(
    ("served_by", "path"), [("wsgi", "/ninja/orders"), ("asgi", "/ninja/async/orders")]
)
def test_concurrent_duplicates_create_exactly_one_order(request, served_by, path):
    server: Server = request.getfixturevalue(served_by)
    sku = f"race-{served_by}"
    replies = in_parallel(
        12, lambda: server.create_order({**ORDER, "sku": sku}, key=f"race-{sku}", path=path)
    )

    assert {reply.status for reply in replies} <= {201, 409}, [r.status for r in replies]
    originals = [reply for reply in replies if reply.status == 201 and not reply.replayed]
    assert len(originals) == 1
    for reply in replies:
        if reply.status == 201:
            assert reply.body == originals[0].body
        else:
            assert reply.json()["code"] == "idempotency_key_in_use"
            assert reply.headers["retry-after"].isdigit()
    assert server.orders_with_sku(sku) == 1


def test_two_users_with_one_key_get_their_own_orders(asgi):
    alice = asgi.create_order({**ORDER, "sku": "two-a"}, key="shared", path="/ninja/async/orders")
    bob = asgi.create_order(
        {**ORDER, "sku": "two-b"}, key="shared", user="bob", path="/ninja/async/orders"
    )

    assert (alice.status, bob.status, bob.replayed) == (201, 201, False)
    assert [order["sku"] for order in asgi.request("GET", "/ninja/orders", user="bob").json()] == [
        "two-b"
    ]


@pytest.mark.parametrize("served_by", ["wsgi", "asgi"])
def test_schemas_served_are_valid_and_document_protected_operations(request, served_by):
    server: Server = request.getfixturevalue(served_by)
    ninja = server.request("GET", "/ninja/openapi.json", user=None)
    drf = server.request("GET", "/api/schema/?format=json", user=None)

    assert (ninja.status, drf.status) == (200, 200)
    validate(ninja.json())
    validate(drf.json())
    paths = ninja.json()["paths"]
    for path in ("/ninja/orders", "/ninja/async/orders"):
        operation = paths[path]["post"]
        assert "Idempotency-Key" in [p["name"] for p in operation["parameters"]]
        assert {"201", "400", "409", "422"} <= set(operation["responses"])
        assert "Idempotent-Replayed" in operation["responses"]["201"]["headers"]
    listing = paths["/ninja/orders"]["get"]
    assert listing["parameters"] == [] and set(listing["responses"]) == {"200"}
    assert "Idempotency-Key" in [
        p["name"] for p in drf.json()["paths"]["/api/orders/"]["post"]["parameters"]
    ]
