"""``@idempotent`` on async views: through Django's AsyncClient, then under uvicorn over real
HTTP on PostgreSQL, with concurrent duplicates.

The views are in ``tests/testapp/async_views.py``; each writes an ``Order`` with the async
ORM before answering, so a test can tell whether that write shared the claim's transaction.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Awaitable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from idempotency.models import IdempotencyRecord, Status
from tests.support.factories import UserFactory
from tests.support.servers import ORDER, AsgiServer, send, uvicorn
from tests.testapp.async_views import AsyncOrderView, async_order
from tests.testapp.models import Order


def problem_code(body: bytes) -> str:
    return str(json.loads(body)["code"])


def run(request: Awaitable[Any]) -> Any:
    """Await an ``AsyncClient`` request from a sync test (its sync calls come back here)."""

    async def wait() -> Any:
        return await request

    return async_to_sync(wait)()


def test_the_decorated_view_and_method_stay_coroutine_functions():
    # Django serves a view as async only if it is one.
    assert inspect.iscoroutinefunction(async_order)
    assert inspect.iscoroutinefunction(AsyncOrderView.post)
    assert AsyncOrderView.view_is_async


# --- in process: Django's AsyncClient -------------------------------------------------------


@pytest.mark.django_db
class TestAsyncClient:
    @pytest.fixture
    def user(self):
        return UserFactory()

    @pytest.fixture
    def client(self, user) -> AsyncClient:
        client = AsyncClient()
        client.force_login(user)
        return client

    def post(
        self, client: AsyncClient, path: str, body: Any = ORDER, key: str | None = "k-1", **headers
    ):
        if key is not None:
            headers["Idempotency-Key"] = key
        return run(client.post(path, body, content_type="application/json", headers=headers))

    @pytest.mark.parametrize("path", ["/async/orders/", "/async/class-orders/"])
    def test_first_then_replay(self, client, path):
        first = self.post(client, path)
        second = self.post(client, path)
        assert first.status_code == second.status_code == 201
        assert second.content == first.content
        assert second["Idempotent-Replayed"] == "true"
        assert "Idempotent-Replayed" not in first
        assert Order.objects.count() == 1
        assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED

    def test_missing_invalid_and_reused_keys(self, client):
        missing = self.post(client, "/async/orders/", key=None)
        assert (missing.status_code, problem_code(missing.content)) == (
            400,
            "idempotency_key_missing",
        )
        invalid = self.post(client, "/async/orders/", key="a b")
        assert (invalid.status_code, problem_code(invalid.content)) == (
            400,
            "idempotency_key_invalid",
        )
        self.post(client, "/async/orders/")
        reused = self.post(client, "/async/orders/", {**ORDER, "quantity": 3})
        assert (reused.status_code, problem_code(reused.content)) == (422, "idempotency_key_reused")
        assert Order.objects.count() == 1

    def test_anonymous_caller_is_refused_before_any_write(self):
        response = self.post(AsyncClient(), "/async/orders/")
        assert response.status_code == 403
        assert problem_code(response.content) == "idempotency_scope_unavailable"
        assert IdempotencyRecord.objects.count() == 0

    def test_a_returned_4xx_rolls_back_the_views_async_write(self, client):
        # The view's ``acreate`` ran on the claim's connection, in its transaction.
        rejected = self.post(client, "/async/orders/", **{"X-Status": "400"})
        assert rejected.status_code == 400
        assert Order.objects.count() == 0
        assert IdempotencyRecord.objects.count() == 0
        fixed = self.post(client, "/async/orders/")
        assert fixed.status_code == 201
        assert "Idempotent-Replayed" not in fixed

    def test_an_exception_rolls_back_the_views_async_write(self, client):
        with pytest.raises(RuntimeError, match="business failure"):
            self.post(client, "/async/orders/", **{"X-Fail": "1"})
        assert Order.objects.count() == 0
        assert IdempotencyRecord.objects.count() == 0

    def test_lease_mode_keeps_the_write_and_releases_a_4xx(self, client):
        # No transaction spans the work in lease mode: the write stays, the key is freed.
        rejected = self.post(client, "/async/lease-orders/", **{"X-Status": "400"})
        assert rejected.status_code == 400
        assert Order.objects.count() == 1
        assert IdempotencyRecord.objects.count() == 0
        first = self.post(client, "/async/lease-orders/")
        assert self.post(client, "/async/lease-orders/").content == first.content
        assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED

    def test_lease_mode_exception_leaves_the_key_retryable(self, client):
        with pytest.raises(RuntimeError):
            self.post(client, "/async/lease-orders/", **{"X-Fail": "1"})
        assert IdempotencyRecord.objects.get().status == Status.FAILED_RETRYABLE

    def test_safe_methods_pass_through(self, client):
        response = run(client.get("/async/class-orders/"))
        assert response.status_code == 200
        assert IdempotencyRecord.objects.count() == 0


# --- under uvicorn, over real HTTP, on PostgreSQL --------------------------------------------


@pytest.fixture
def uvicorn_server() -> Iterator[AsgiServer]:
    with uvicorn("tests.settings", "/async/class-orders/") as server:
        yield server


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
class TestUnderUvicorn:
    def test_concurrent_duplicates_make_one_order(self, uvicorn_server):
        replies = uvicorn_server.together([{"path": "/async/orders/", "X-Sleep": "1"}] * 8)
        assert Order.objects.count() == 1
        first = [r for r in replies if r.status == 201 and not r.replayed]
        assert len(first) == 1
        for other in replies:
            assert other.status in (201, 409)
            if other.status == 201:
                assert other.body == first[0].body
            else:
                assert problem_code(other.body) == "idempotency_key_in_use"
                assert int(other.headers["retry-after"]) >= 1
        assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED
        assert uvicorn_server.post("/async/orders/").replayed

    def test_concurrent_duplicates_in_lease_mode_make_one_order(self, uvicorn_server):
        replies = uvicorn_server.together([{"path": "/async/lease-orders/", "X-Sleep": "1"}] * 6)
        assert Order.objects.count() == 1
        assert sorted(r.status for r in replies) == [201] + [409] * 5
        busy = [r for r in replies if r.status == 409]
        assert all(problem_code(r.body) == "idempotency_key_in_use" for r in busy)
        # A short poll (RETRY_AFTER: this server has seen no duration yet), not the 30 s lease.
        assert all(r.headers["retry-after"] == "1" for r in busy)
        replay = uvicorn_server.post("/async/lease-orders/")
        assert replay.replayed
        assert replay.body == next(r.body for r in replies if r.status == 201)

    def test_atomic_mode_rolls_back_the_async_write_of_an_unrecorded_outcome(self, uvicorn_server):
        assert uvicorn_server.post("/async/orders/", **{"X-Status": "400"}).status == 400
        assert uvicorn_server.post("/async/orders/", **{"X-Fail": "1"}).status == 500
        assert Order.objects.count() == 0
        assert IdempotencyRecord.objects.count() == 0
        fixed = uvicorn_server.post("/async/orders/")
        assert (fixed.status, fixed.replayed) == (201, False)
        assert Order.objects.count() == 1

    def test_errors(self, uvicorn_server):
        missing = uvicorn_server.post("/async/orders/", key=None)
        invalid = uvicorn_server.post("/async/orders/", key="a,b")
        uvicorn_server.post("/async/orders/")
        reused = uvicorn_server.post("/async/orders/", {**ORDER, "quantity": 9})
        assert (missing.status, problem_code(missing.body)) == (400, "idempotency_key_missing")
        assert (invalid.status, problem_code(invalid.body)) == (400, "idempotency_key_invalid")
        assert (reused.status, problem_code(reused.body)) == (422, "idempotency_key_reused")
        for error in (missing, invalid, reused):
            assert error.headers["content-type"] == "application/problem+json"
        anonymous = send(
            uvicorn_server.url + "/async/orders/", "POST", ORDER, {"Idempotency-Key": "a"}
        )
        assert anonymous.status == 403
        assert Order.objects.count() == 1

    def test_class_based_view(self, uvicorn_server):
        first = uvicorn_server.post("/async/class-orders/")
        second = uvicorn_server.post("/async/class-orders/")
        assert (first.status, second.status, second.replayed) == (201, 201, True)
        assert second.body == first.body
        listing = send(
            uvicorn_server.url + "/async/class-orders/", headers={"Cookie": uvicorn_server.cookie}
        )
        assert listing.json() == {"orders": 1}

    def test_requests_with_different_keys_do_not_wait_for_each_other(self, uvicorn_server):
        # Each request's protocol runs in a sync thread of its own, not one shared thread.
        started = time.monotonic()
        replies = uvicorn_server.together(
            [{"path": "/async/orders/", "key": f"k-{n}", "X-Sleep": "1.5"} for n in range(4)]
        )
        elapsed = time.monotonic() - started
        assert [r.status for r in replies] == [201] * 4
        assert Order.objects.count() == 4
        assert elapsed < 4.5, f"4 requests of 1.5 s took {elapsed:.1f} s: serialised"
