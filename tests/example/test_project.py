"""The example project's endpoints, through DRF's test client (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from example_project.shop.models import Order, Payment
from idempotency import KeyReused
from idempotency.models import IdempotencyRecord, Status
from tests.example.conftest import basic, sign

pytestmark = pytest.mark.django_db

ORDERS = "/api/orders/"
CALLBACK = "/api/payments/callback/"


@pytest.fixture
def bob() -> User:
    return User.objects.create_user("bob", password="bob-password")


@pytest.fixture
def client(alice: User) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=basic("alice", "alice-password"))
    return api


def _order(client: APIClient, body: Any, key: str | None = "key-1", **extra: Any):
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
    if key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(ORDERS, raw, content_type="application/json", **extra)


def _callback(body: Any, *, signature: str | None = "valid"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers: dict[str, Any] = {}
    if signature == "valid":
        headers["HTTP_X_SIGNATURE"] = sign(raw)
    elif signature is not None:
        headers["HTTP_X_SIGNATURE"] = signature
    return APIClient().post(CALLBACK, raw, content_type="application/json", **headers)


def _trade(order: Order, **changes: Any) -> dict[str, Any]:
    return {
        "provider": "acme",
        "trade_no": "T-1001",
        "order_id": order.pk,
        "amount": "19.90",
        **changes,
    }


def _problem_code(response) -> str:
    assert response["Content-Type"] == "application/problem+json"
    return response.json()["code"]


# --- the root -----------------------------------------------------------------


def test_root_lists_the_endpoints_to_anyone():
    response = APIClient().get("/")

    assert response.status_code == 200
    urls = [entry["url"] for entry in response.json().values()]
    assert "http://testserver/api/orders/" in urls
    assert "http://testserver/api/payments/callback/" in urls


def test_admin_is_mounted():
    assert APIClient().get("/admin/login/").status_code == 200


# --- orders ---------------------------------------------------------------------


def test_create_order_answers_201_with_the_order_owned_by_the_caller(client, alice):
    response = _order(client, {"sku": "BOOK-1", "quantity": 2})

    assert response.status_code == 201
    body = response.json()
    assert {k: body[k] for k in ("sku", "quantity", "status")} == {
        "sku": "BOOK-1",
        "quantity": 2,
        "status": "PENDING",
    }
    order = Order.objects.get()
    assert body["id"] == order.pk
    assert order.owner == alice
    assert response["Location"] == f"http://testserver/api/orders/{order.pk}/"
    assert "Idempotent-Replayed" not in response


def test_replay_returns_the_first_response_without_a_second_order(client):
    first = _order(client, {"sku": "BOOK-1", "quantity": 2})
    # Same intent, other key order and whitespace: the canonical fingerprint matches.
    again = _order(client, '{ "quantity": 2,\n "sku": "BOOK-1" }')

    assert again.status_code == 201
    assert again.content == first.content
    assert again["Content-Type"] == first["Content-Type"]
    assert again["Location"] == first["Location"]
    assert again["Idempotent-Replayed"] == "true"
    assert Order.objects.count() == 1


def test_structured_field_string_key_equals_the_bare_key(client):
    _order(client, {"sku": "BOOK-1", "quantity": 2}, key="abc-123")

    again = _order(client, {"sku": "BOOK-1", "quantity": 2}, key='"abc-123"')

    assert again["Idempotent-Replayed"] == "true"
    assert Order.objects.count() == 1


def test_same_key_with_another_body_is_422_and_changes_nothing(client):
    _order(client, {"sku": "BOOK-1", "quantity": 2})

    response = _order(client, {"sku": "BOOK-1", "quantity": 3})

    assert response.status_code == 422
    assert _problem_code(response) == "idempotency_key_reused"
    assert list(Order.objects.values_list("quantity", flat=True)) == [2]


def test_missing_key_is_400_and_records_nothing(client):
    response = _order(client, {"sku": "BOOK-1", "quantity": 2}, key=None)

    assert response.status_code == 400
    assert _problem_code(response) == "idempotency_key_missing"
    assert not Order.objects.exists()
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "comma,key", "caf\u00e9"])
def test_malformed_key_is_400_and_records_nothing(client, key):
    response = _order(client, {"sku": "BOOK-1", "quantity": 2}, key=key)

    assert response.status_code == 400
    assert _problem_code(response) == "idempotency_key_invalid"
    assert not Order.objects.exists()
    assert not IdempotencyRecord.objects.exists()


def test_two_users_with_the_same_key_are_independent(client, bob):
    bobs = APIClient()
    bobs.credentials(HTTP_AUTHORIZATION=basic("bob", "bob-password"))

    for_alice = _order(client, {"sku": "BOOK-1", "quantity": 2}, key="shared")
    for_bob = _order(bobs, {"sku": "PEN-9", "quantity": 5}, key="shared")

    assert for_alice.status_code == for_bob.status_code == 201
    assert "Idempotent-Replayed" not in for_bob
    assert for_bob.json()["sku"] == "PEN-9"
    assert Order.objects.get(pk=for_bob.json()["id"]).owner == bob
    assert Order.objects.count() == 2


def test_list_shows_only_the_callers_orders(client, bob):
    mine = Order.objects.create(owner=User.objects.get(username="alice"), sku="A", quantity=1)
    theirs = Order.objects.create(owner=bob, sku="B", quantity=1)

    listed = client.get(ORDERS)

    assert listed.status_code == 200
    assert [order["id"] for order in listed.json()] == [mine.pk]
    assert client.get(f"{ORDERS}{theirs.pk}/").status_code == 404


@pytest.mark.parametrize("method", ["get", "post"])
def test_anonymous_callers_are_refused_before_any_record(method):
    response = getattr(APIClient(), method)(
        ORDERS, {"sku": "A", "quantity": 1}, format="json", HTTP_IDEMPOTENCY_KEY="anon"
    )

    assert response.status_code in (401, 403)
    assert not IdempotencyRecord.objects.exists()
    assert not Order.objects.exists()


def test_wrong_password_is_401(alice):
    intruder = APIClient()
    intruder.credentials(HTTP_AUTHORIZATION=basic("alice", "wrong"))

    response = _order(intruder, {"sku": "A", "quantity": 1})

    assert response.status_code == 401
    assert not IdempotencyRecord.objects.exists()


def test_session_authentication_works_and_enforces_csrf(alice):
    browser = APIClient(enforce_csrf_checks=True)
    assert browser.login(username="alice", password="alice-password")

    refused = _order(browser, {"sku": "A", "quantity": 1})
    browser.cookies["csrftoken"] = "a" * 32
    accepted = _order(browser, {"sku": "A", "quantity": 1}, HTTP_X_CSRFTOKEN="a" * 32)

    assert refused.status_code == 403
    assert accepted.status_code == 201
    assert Order.objects.count() == 1


@pytest.mark.parametrize(
    "invalid",
    [
        {"sku": "BOOK-1", "quantity": 0},
        {"sku": "BOOK-1", "quantity": -3},
        {"sku": "BOOK-1", "quantity": "many"},
        {"sku": "", "quantity": 1},
        {"quantity": 1},
    ],
)
def test_validation_error_is_not_recorded_and_a_corrected_retry_succeeds(client, invalid):
    rejected = _order(client, invalid, key="fix-me")

    assert rejected.status_code == 400
    assert not IdempotencyRecord.objects.exists()

    corrected = _order(client, {"sku": "BOOK-1", "quantity": 1}, key="fix-me")

    assert corrected.status_code == 201
    assert "Idempotent-Replayed" not in corrected
    assert Order.objects.count() == 1


def test_malformed_json_is_400_and_not_recorded(client):
    response = _order(client, b'{"sku": "BOOK-1", "quantity":')

    assert response.status_code == 400
    assert not IdempotencyRecord.objects.exists()


def test_the_list_url_without_its_slash_also_creates(client):
    response = client.post(
        "/api/orders", {"sku": "A", "quantity": 1}, format="json", HTTP_IDEMPOTENCY_KEY="k"
    )

    assert response.status_code == 201
    assert Order.objects.count() == 1


def test_a_paid_order_cannot_be_deleted_but_a_pending_one_can(client, alice):
    paid = Order.objects.create(owner=alice, sku="A", quantity=1, status=Order.Status.PAID)
    pending = Order.objects.create(owner=alice, sku="B", quantity=1)

    assert client.delete(f"{ORDERS}{paid.pk}/").status_code == 409
    assert client.delete(f"{ORDERS}{pending.pk}/").status_code == 204
    assert list(Order.objects.values_list("pk", flat=True)) == [paid.pk]


# --- payment callback -----------------------------------------------------------------


@pytest.fixture
def order(alice: User) -> Order:
    return Order.objects.create(owner=alice, sku="BOOK-1", quantity=1)


def test_valid_callback_marks_the_order_paid(order):
    response = _callback(_trade(order))

    assert response.status_code == 200
    assert response.json() == {"order_id": order.pk, "status": "PAID"}
    order.refresh_from_db()
    assert order.status == Order.Status.PAID
    payment = Payment.objects.get()
    assert (payment.order, payment.provider, payment.trade_no) == (order, "acme", "T-1001")
    assert payment.amount == Decimal("19.90")
    record = IdempotencyRecord.objects.get()
    assert (record.scope, record.idem_key, record.status) == (
        "payments:acme",
        "acme:T-1001",
        Status.SUCCEEDED,
    )


def test_repeated_callback_is_replayed_and_pays_once(order):
    first = _callback(_trade(order))
    order.refresh_from_db()
    paid_at = order.paid_at

    repeats = [_callback(_trade(order)) for _ in range(3)]
    # The provider may serialise the same trade differently; it is the same intent.
    reordered = _callback(
        b'{"amount": "19.90", "order_id": %d, "trade_no": "T-1001", "provider": "acme"}' % order.pk
    )

    for repeat in [*repeats, reordered]:
        assert repeat.status_code == 200
        assert repeat.content == first.content
        assert repeat["Idempotent-Replayed"] == "true"
    assert Payment.objects.count() == 1
    order.refresh_from_db()
    assert order.paid_at == paid_at


def test_same_trade_with_another_amount_is_422(order):
    _callback(_trade(order))

    response = _callback(_trade(order, amount="1.00"))

    assert response.status_code == 422
    assert _problem_code(response) == "idempotency_key_reused"
    assert Payment.objects.get().amount == Decimal("19.90")


@pytest.mark.parametrize(
    "signature",
    [None, "", "deadbeef", "caf\u00e9", "sign-other-secret", "sign-other-body"],
)
def test_bad_signature_is_401_and_writes_no_record(order, signature):
    body = json.dumps(_trade(order)).encode()
    if signature == "sign-other-secret":
        signature = sign(body, secret="not-the-secret")
    elif signature == "sign-other-body":
        signature = sign(json.dumps(_trade(order, amount="0.01")).encode())

    response = _callback(body, signature=signature)

    assert response.status_code == 401
    assert not IdempotencyRecord.objects.exists()
    assert not Payment.objects.exists()
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING


def test_a_badly_signed_retry_does_not_disturb_the_recorded_trade(order):
    _callback(_trade(order))

    forged = _callback(_trade(order, amount="1.00"), signature="0" * 64)

    assert forged.status_code == 401
    assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED


@pytest.mark.parametrize("form", [str.upper, lambda digest: f"sha256={digest}"])
def test_signature_is_accepted_in_upper_case_and_prefixed(order, form):
    body = json.dumps(_trade(order)).encode()

    assert _callback(body, signature=form(sign(body))).status_code == 200


def test_callback_url_without_its_slash_also_works(order):
    body = json.dumps(_trade(order)).encode()

    response = APIClient().post(
        CALLBACK.rstrip("/"), body, content_type="application/json", HTTP_X_SIGNATURE=sign(body)
    )

    assert response.status_code == 200
    assert Payment.objects.count() == 1


def test_unknown_order_is_404_and_not_recorded(order):
    response = _callback(_trade(order, order_id=order.pk + 1000))

    assert response.status_code == 404
    assert not IdempotencyRecord.objects.exists()
    assert not Payment.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        b'{"provider": "acme", "trade_no": ',
        b"[1, 2, 3]",
        b'"just a string"',
        b"",
    ],
)
def test_malformed_callback_body_is_400_and_not_recorded(body):
    response = _callback(body)

    assert response.status_code == 400
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize(
    "changes",
    [
        {"provider": None},
        {"trade_no": ""},
        {"provider": "not a slug"},
        {"order_id": "seven"},
        {"order_id": 10**20},
        {"amount": "-5"},
        {"amount": "lots"},
        {"amount": "0"},
    ],
)
def test_invalid_callback_is_400_then_a_corrected_retry_is_paid(order, changes):
    invalid = {key: value for key, value in _trade(order, **changes).items() if value is not None}

    rejected = _callback(invalid)

    assert rejected.status_code == 400
    assert not IdempotencyRecord.objects.exists()
    assert not Payment.objects.exists()
    assert _callback(_trade(order)).status_code == 200
    assert Payment.objects.count() == 1


def test_trade_number_that_cannot_be_a_key_is_400(order):
    response = _callback(_trade(order, trade_no="T 1001"))

    assert response.status_code == 400
    assert _problem_code(response) == "idempotency_key_invalid"
    assert not Payment.objects.exists()


def test_unknown_order_then_the_right_order_with_the_same_trade(order):
    _callback(_trade(order, order_id=order.pk + 1000))

    assert _callback(_trade(order)).status_code == 200
    assert Payment.objects.get().order == order


def test_the_same_trade_number_at_two_providers_is_two_payments(alice, order):
    other = Order.objects.create(owner=alice, sku="PEN", quantity=1)

    first = _callback(_trade(order, provider="acme"))
    second = _callback(_trade(other, provider="globex"))

    assert first.status_code == second.status_code == 200
    assert "Idempotent-Replayed" not in second
    assert set(IdempotencyRecord.objects.values_list("scope", flat=True)) == {
        "payments:acme",
        "payments:globex",
    }
    assert Payment.objects.count() == 2


def test_a_second_trade_for_a_paid_order_keeps_the_first_payment_time(order):
    _callback(_trade(order))
    order.refresh_from_db()
    paid_at = order.paid_at

    response = _callback(_trade(order, trade_no="T-2002"))

    assert response.json() == {"order_id": order.pk, "status": "PAID"}
    order.refresh_from_db()
    assert order.paid_at == paid_at
    assert Payment.objects.count() == 2


def test_after_the_record_is_purged_the_payment_row_still_guards_the_trade(order):
    _callback(_trade(order))
    IdempotencyRecord.objects.all().delete()

    resent = _callback(_trade(order))
    IdempotencyRecord.objects.all().delete()
    changed = _callback(_trade(order, amount="5.00"))

    assert resent.status_code == 200
    assert changed.status_code == 422
    assert changed.json()["detail"] == (
        "This trade was already recorded for another order or amount."
    )
    assert Payment.objects.get().amount == Decimal("19.90")


# --- payment events from a queue (example_project/shop/tasks.py) ----------------------


def test_a_payment_event_delivered_again_is_recorded_once(order):
    from example_project.shop.tasks import record_payment_event

    event = {**_trade(order), "delivered_at": "2026-01-01T09:00:00Z"}
    first = record_payment_event(event)
    again = record_payment_event({**event, "delivered_at": "2026-01-01T09:05:00Z"})

    assert first == again == {"order_id": order.pk, "status": "PAID"}
    assert Payment.objects.count() == 1
    with pytest.raises(KeyReused):
        record_payment_event({**event, "amount": "1.00"})
    assert Payment.objects.get().amount == Decimal("19.90")
