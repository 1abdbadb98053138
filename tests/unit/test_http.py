"""Every row of docs/http.md's answers through DRF's test client (``tests/support/urls.py``).

What an answer holds (the outcome policy, the stored headers, the size bound, the replay
marker, the error formats) is ``test_response.py``'s.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from idempotency.models import IdempotencyRecord, Status
from tests.support.api import (
    ORDER,
    authenticated,
    basic,
    is_replay,
    pending_order,
    post,
    post_raw,
    problem,
    state,
    stored,
)
from tests.support.factories import UserFactory
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db


@pytest.fixture
def user():
    return UserFactory()


@pytest.fixture
def client(user) -> APIClient:
    return authenticated(user)


class TestMissingKey:
    @pytest.mark.parametrize("path", ["/orders/", "/charge/", "/flaky/"])
    def test_400_and_nothing_written(self, client, path):
        response = post(client, path, {"amount": 5, **ORDER}, key=None)
        assert response.status_code == 400
        assert problem(response)["code"] == "idempotency_key_missing"
        assert Order.objects.count() == 0
        assert IdempotencyRecord.objects.count() == 0

    def test_error_names_the_header(self, client):
        body = problem(post(client, "/orders/", ORDER, key=None))
        assert body["title"] == "Idempotency key missing"
        assert "idempotency key" in body["detail"]


class TestInvalidKey:
    @pytest.mark.parametrize(
        "key",
        [
            pytest.param("", id="empty"),
            pytest.param("k" * 256, id="too-long"),
            pytest.param("a\x01b", id="control"),
            pytest.param("a\x7fb", id="del"),
            pytest.param("caf\u00e9", id="non-ascii"),
            pytest.param("a,b", id="comma"),
            pytest.param("a b", id="space"),
            pytest.param('"a', id="unbalanced-quote"),
        ],
    )
    def test_400_and_nothing_written(self, client, key):
        response = post(client, "/orders/", ORDER, key=key)
        assert response.status_code == 400
        assert problem(response)["code"] == "idempotency_key_invalid"
        assert Order.objects.count() == 0
        assert IdempotencyRecord.objects.count() == 0

    @override_settings(IDEMPOTENCY={"MAX_KEY_LENGTH": 8})
    def test_max_key_length_setting(self, client):
        assert post(client, "/orders/", ORDER, key="k" * 9).status_code == 400
        assert post(client, "/orders/", ORDER, key="k" * 8).status_code == 201


class TestFirstRequest:
    def test_runs_and_is_recorded(self, client, user):
        response = post(client, "/orders/", ORDER)
        assert response.status_code == 201
        order = Order.objects.get()
        assert response.json() == {"id": order.pk, "sku": "book", "quantity": 2, "paid": False}
        assert response["Location"] == f"/orders/{order.pk}/"
        assert not is_replay(response)
        record = stored()
        assert record.status == Status.SUCCEEDED
        assert record.scope == f"user:{user.pk}:tests.testapp.views.OrderViewSet.create"
        assert record.resource_id == str(order.pk)
        assert (record.request_method, record.request_path) == ("POST", "/orders/")
        assert record.response_status == 201
        assert json.loads(bytes(record.response_body)) == response.json()


class TestReplay:
    def test_same_status_body_content_type_and_location(self, client):
        first = post(client, "/orders/", ORDER)
        second = post(client, "/orders/", ORDER)
        assert second.status_code == first.status_code == 201
        assert second.content == first.content
        assert second["Content-Type"] == first["Content-Type"] == "application/json"
        assert second["Location"] == first["Location"]
        assert is_replay(second)

    def test_view_does_not_run(self, client):
        for _ in range(3):
            post(client, "/orders/", ORDER)
        assert Order.objects.count() == 1
        assert stored().attempts == 1

    def test_quoted_key_is_the_same_key(self, client):
        post(client, "/orders/", ORDER, key="k-1")
        assert is_replay(post(client, "/orders/", ORDER, key='"k-1"'))
        assert Order.objects.count() == 1

    def test_other_key_runs_again(self, client):
        post(client, "/orders/", ORDER, key="k-1")
        assert post(client, "/orders/", ORDER, key="k-2").status_code == 201
        assert Order.objects.count() == 2

    def test_json_layout_is_not_a_different_request(self, client):
        first = post_raw(client, "/orders/", '{"sku":"book","quantity":2}', "application/json")
        second = post_raw(
            client, "/orders/", '{\n  "quantity" : 2.0,\n  "sku" : "book"\n}', "application/json"
        )
        assert second.status_code == 201
        assert is_replay(second)
        assert second.content == first.content
        assert Order.objects.count() == 1

    def test_replay_of_200(self, client):
        first = client.post(
            "/webhook/", {"provider": "acme", "ref": "t1", "order_id": 1}, format="json"
        )
        second = client.post(
            "/webhook/", {"provider": "acme", "ref": "t1", "order_id": 1}, format="json"
        )
        assert first.status_code == second.status_code == 200
        assert is_replay(second)


class TestInFlight:
    @pytest.mark.parametrize("mode", ["lease", "atomic"])
    def test_409_with_retry_after_and_nothing_runs(self, client, user, mode):
        record = pending_order(user, ORDER, in_flight=True)  # lease live for 60 s
        before = state(record)
        with override_settings(IDEMPOTENCY={"MODE": mode}):
            response = post(client, "/orders/", ORDER)
        assert response.status_code == 409
        assert problem(response)["code"] == "idempotency_key_in_use"
        assert response["Retry-After"] == "1"  # RETRY_AFTER, not the 60 s of lease left
        assert Order.objects.count() == 0
        assert state(record) == before

    @override_settings(IDEMPOTENCY={"RETRY_AFTER": 3})
    def test_needs_review_is_its_own_409_without_retry_after(self, client, user):
        pending_order(user, ORDER, needs_review=True)
        response = post(client, "/orders/", ORDER)
        assert response.status_code == 409
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "idempotency_key_under_review"
        assert "operator" in response.json()["detail"]
        # No invitation to poll: the answer changes when an operator acts, not with time.
        assert not response.has_header("Retry-After")
        assert Order.objects.count() == 0

    def test_in_flight_with_another_body_is_reused(self, client, user):
        pending_order(user, ORDER, in_flight=True)
        response = post(client, "/orders/", {**ORDER, "quantity": 3})
        assert response.status_code == 422

    def test_failed_retryable_is_run_again(self, client, user):
        pending_order(user, ORDER, failed_retryable=True)
        response = post(client, "/orders/", ORDER)
        assert response.status_code == 201
        assert not is_replay(response)
        assert stored().status == Status.SUCCEEDED
        assert stored().attempts == 2
        assert Order.objects.count() == 1


class TestKeyReused:
    def test_422_and_nothing_changes(self, client):
        first = post(client, "/orders/", ORDER)
        before = state(stored())
        response = post(client, "/orders/", {**ORDER, "quantity": 3})
        assert response.status_code == 422
        assert problem(response)["code"] == "idempotency_key_reused"
        assert Order.objects.get().quantity == 2
        assert state(stored()) == before
        # The original request still replays.
        assert post(client, "/orders/", ORDER).content == first.content

    def test_other_query_string_is_another_request(self, client):
        post(client, "/orders/", ORDER)
        response = post(client, "/orders/?sleep=0", ORDER)
        assert response.status_code == 422
        assert Order.objects.count() == 1

    def test_form_body_that_differs_is_reused(self, client):
        post_raw(client, "/orders/", "sku=book&quantity=2", "application/x-www-form-urlencoded")
        response = post_raw(
            client, "/orders/", "sku=book&quantity=5", "application/x-www-form-urlencoded"
        )
        assert response.status_code == 422


class TestScopes:
    def test_same_key_for_another_user_is_independent(self, client, user):
        other = UserFactory()
        other_client = APIClient()
        other_client.force_authenticate(other)
        mine = post(client, "/orders/", ORDER)
        theirs = post(other_client, "/orders/", {**ORDER, "quantity": 9})
        assert theirs.status_code == 201
        assert not is_replay(theirs)
        assert theirs.json()["id"] != mine.json()["id"]
        assert Order.objects.filter(owner=user).count() == 1
        assert Order.objects.filter(owner=other, quantity=9).count() == 1
        assert IdempotencyRecord.objects.filter(idem_key="k-1").count() == 2
        # Each user's repeat replays its own response.
        assert post(other_client, "/orders/", {**ORDER, "quantity": 9}).content == theirs.content
        assert post(client, "/orders/", ORDER).content == mine.content

    def test_same_key_on_another_operation_is_independent(self, client):
        post(client, "/orders/", ORDER)
        response = post(client, "/charge/", {"amount": 5})
        assert response.status_code == 201
        assert not is_replay(response)


class TestAnonymous:
    @pytest.mark.parametrize("path", ["/orders/", "/charge/", "/big/"])
    def test_drf_views_reject_before_any_record(self, path):
        response = post(APIClient(), path, ORDER)
        assert response.status_code in (401, 403)
        assert IdempotencyRecord.objects.count() == 0
        assert Order.objects.count() == 0

    def test_wrong_password_is_rejected_before_any_record(self, user):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=basic(user.username, "wrong"))
        assert post(client, "/orders/", ORDER).status_code == 401
        assert IdempotencyRecord.objects.count() == 0

    def test_plain_view_refuses_anonymous_with_problem(self):
        response = post(APIClient(), "/plain/", {"sku": "x"})
        assert response.status_code == 403
        assert problem(response)["code"] == "idempotency_scope_unavailable"
        assert IdempotencyRecord.objects.count() == 0
        assert Order.objects.count() == 0

    def test_http_basic_caller_is_scoped_like_any_user(self, user):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=basic(user.username, "secret"))
        assert post(client, "/orders/", ORDER).status_code == 201
        assert is_replay(post(client, "/orders/", ORDER))
        assert stored().scope.startswith(f"user:{user.pk}:")


class TestPlainView:
    @pytest.fixture
    def client(self, user) -> APIClient:
        client = APIClient()
        client.force_login(user)
        return client

    def test_first_replay_and_reuse(self, client):
        first = post(client, "/plain/", {"sku": "p"})
        assert first.status_code == 201
        second = post(client, "/plain/", {"sku": "p"})
        assert (second.status_code, second.content) == (201, first.content)
        assert is_replay(second)
        assert second["Content-Type"] == "application/json"
        reused = post(client, "/plain/", {"sku": "q"})
        assert reused.status_code == 422
        assert problem(reused)["code"] == "idempotency_key_reused"
        assert Order.objects.count() == 1

    def test_json_layout_does_not_matter(self, client):
        post_raw(client, "/plain/", '{"sku": "p", "n": 1}', "application/json")
        second = post_raw(client, "/plain/", '{"n":1.0,"sku":"p"}', "application/json")
        assert is_replay(second)

    def test_invalid_key(self, client):
        response = post(client, "/plain/", {"sku": "p"}, key="\u00e9")
        assert problem(response)["code"] == "idempotency_key_invalid"


class TestKeyFromBody:
    def callback(self, client: APIClient, **changes: Any):
        body = {"provider": "acme", "ref": "tx-1", "order_id": self.order.pk, **changes}
        return client.post("/webhook/", body, format="json")

    @pytest.fixture(autouse=True)
    def order(self, user):
        self.order = Order.objects.create(owner=user, sku="o", quantity=1)

    def test_anonymous_provider_callback_runs_once(self):
        client = APIClient()
        first = self.callback(client)
        assert first.status_code == 200
        assert first.json() == {"ok": True}
        self.order.refresh_from_db()
        assert self.order.paid
        record = stored("acme:tx-1")
        assert record.scope == "provider:acme"
        Order.objects.update(paid=False)
        second = self.callback(client)
        assert is_replay(second)
        self.order.refresh_from_db()
        assert not self.order.paid  # the view did not run again

    def test_same_trade_with_another_body_is_reused(self):
        client = APIClient()
        self.callback(client)
        assert self.callback(client, order_id=self.order.pk + 1).status_code == 422

    def test_other_provider_is_independent(self):
        client = APIClient()
        self.callback(client)
        response = self.callback(client, provider="other")
        assert response.status_code == 200
        assert not is_replay(response)
        assert IdempotencyRecord.objects.count() == 2

    def test_header_is_not_needed_nor_used(self):
        client = APIClient()
        self.callback(client)
        response = client.post(
            "/webhook/",
            {"provider": "acme", "ref": "tx-1", "order_id": self.order.pk},
            format="json",
            headers={"Idempotency-Key": "unrelated"},
        )
        assert is_replay(response)


class TestSafeMethods:
    @pytest.mark.parametrize("method", ["get", "head", "options"])
    def test_plain_view_serves_safe_methods_without_key_or_record(self, client, user, method):
        client.force_login(user)
        response = getattr(client, method)("/plain/")
        assert response.status_code == 201  # the view ran, unprotected
        assert IdempotencyRecord.objects.count() == 0

    def test_list_of_a_protected_viewset_needs_no_key(self, client):
        post(client, "/orders/", ORDER)
        response = client.get("/orders/")
        assert response.status_code == 200
        assert len(response.json()) == 1


class TestOptionalKey:
    def test_without_key_runs_unprotected(self, client):
        first = post(client, "/optional-orders/", ORDER, key=None)
        second = post(client, "/optional-orders/", ORDER, key=None)
        assert first.status_code == second.status_code == 201
        assert not is_replay(second)
        assert Order.objects.count() == 2
        assert IdempotencyRecord.objects.count() == 0

    def test_with_key_is_protected(self, client):
        post(client, "/optional-orders/", ORDER)
        assert is_replay(post(client, "/optional-orders/", ORDER))
        assert Order.objects.count() == 1

    def test_invalid_key_is_still_rejected(self, client):
        response = post(client, "/optional-orders/", ORDER, key="")
        assert response.status_code == 400
        assert Order.objects.count() == 0

    @override_settings(IDEMPOTENCY={"REQUIRE_KEY": False})
    def test_require_key_setting(self, client):
        assert post(client, "/orders/", ORDER, key=None).status_code == 201
        assert IdempotencyRecord.objects.count() == 0


class TestFormBodies:
    def test_urlencoded_first_and_replay_in_any_field_order(self, client):
        first = post_raw(
            client, "/orders/", "sku=book&quantity=2", "application/x-www-form-urlencoded"
        )
        second = post_raw(
            client, "/orders/", "quantity=2&sku=book", "application/x-www-form-urlencoded"
        )
        assert first.status_code == 201
        assert is_replay(second)
        assert second.content == first.content
        assert Order.objects.count() == 1

    def test_multipart(self, client):
        first = post(client, "/orders/", ORDER, format="multipart")
        second = post(client, "/orders/", ORDER, format="multipart")
        assert first.status_code == 201
        assert is_replay(second)
        changed = post(client, "/orders/", {**ORDER, "quantity": 4}, format="multipart")
        assert changed.status_code == 422
