"""Bad input at the example project's endpoints, through the test client (SQLite and
PostgreSQL): never a 500, never a half-written record, never a replay of another request.

Each protected endpoint: DRF's orders, ninja's sync and async orders, the lease-mode
reports, the signed payment callback; and the plain Django view of tests/testapp.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from example_project.reports.models import Report
from example_project.shop.models import Order, Payment
from idempotency.models import IdempotencyRecord
from tests.example.conftest import basic, sign

pytestmark = pytest.mark.django_db

Send = Callable[..., Any]


def _post(path: str) -> Send:
    def send(raw: bytes, key: str = "k-1", content_type: str = "application/json") -> Any:
        return Client().post(
            path,
            raw,
            content_type=content_type,
            HTTP_AUTHORIZATION=basic(),
            HTTP_IDEMPOTENCY_KEY=key,
        )

    return send


def _callback(raw: bytes, key: str = "", content_type: str = "application/json") -> Any:
    signature = sign(raw)
    return Client().post(
        "/api/payments/callback/", raw, content_type=content_type, HTTP_X_SIGNATURE=signature
    )


def _order() -> dict[str, Any]:
    return {"sku": "deep", "quantity": 1}


def _trade() -> dict[str, Any]:
    owner = User.objects.get(username="alice")
    order = Order.objects.create(owner=owner, sku="to-pay", quantity=1)
    return {"provider": "acme", "trade_no": "T-1", "order_id": order.pk, "amount": "19.90"}


# (name, send, a valid body, how many business rows exist)
ENDPOINTS: dict[str, tuple[Send, Callable[[], dict[str, Any]], Callable[[], int]]] = {
    "drf": (_post("/api/orders/"), _order, lambda: Order.objects.count()),
    "ninja": (_post("/ninja/orders"), _order, lambda: Order.objects.count()),
    "ninja-async": (_post("/ninja/async/orders"), _order, lambda: Order.objects.count()),
    "lease": (_post("/api/reports/"), lambda: {"seconds": 0}, lambda: Report.objects.count()),
    "callback": (_callback, _trade, lambda: Payment.objects.count()),
}


def _nested(body: dict[str, Any], depth: int) -> bytes:
    """``body`` with one more field holding lists nested ``depth`` levels deep."""
    inner = json.dumps(body)[1:-1]
    return b'{"extra": ' + b"[" * depth + b"]" * depth + b", " + inner.encode() + b"}"


def _problem(response: Any, code: str) -> None:
    assert response["Content-Type"] == "application/problem+json", response.content[:300]
    assert response.json()["code"] == code


@pytest.mark.parametrize("depth", [300, 1_000, 100_000])
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_deeply_nested_json_is_a_400_problem_and_the_key_stays_free(alice, endpoint, depth):
    send, valid, effects = ENDPOINTS[endpoint]
    body = valid()
    before = effects()

    response = send(_nested(body, depth))

    assert response.status_code == 400
    _problem(response, "idempotency_request_invalid")
    assert "100 levels" in response.json()["detail"]
    assert not IdempotencyRecord.objects.exists()
    assert effects() == before
    corrected = send(json.dumps(body).encode())  # the same key, a body that can be read
    assert corrected.status_code in (200, 201), corrected.content[:300]
    assert effects() == before + 1


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_json_within_the_depth_bound_is_served(alice, endpoint):
    send, valid, effects = ENDPOINTS[endpoint]
    response = send(_nested(valid(), 99))  # with the object around it: 100 levels
    assert response.status_code in (200, 201), response.content[:300]


@override_settings(IDEMPOTENCY={"MAX_BODY_DEPTH": 400})
def test_the_depth_bound_is_a_setting(alice):
    send, valid, _ = ENDPOINTS["drf"]
    assert send(_nested(valid(), 300)).status_code == 201
    response = send(_nested(valid(), 500), key="k-2")
    assert response.status_code == 400
    assert "400 levels" in response.json()["detail"]


@override_settings(ROOT_URLCONF="tests.support.urls")
@pytest.mark.parametrize("depth", [300, 100_000])
def test_deeply_nested_json_at_a_plain_django_view(alice, depth):
    client = Client()
    client.force_login(alice)
    raw = b'{"sku": "plain", "x": ' + b"[" * depth + b"]" * depth + b"}"
    response = client.post(
        "/plain/", raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert response.status_code == 400
    _problem(response, "idempotency_request_invalid")
    assert not IdempotencyRecord.objects.exists() and not Order.objects.exists()


# -- bytes that are not UTF-8 ------------------------------------------------------------

# An encoded surrogate (which json.loads on bytes lets through), a lone continuation
# byte, a truncated sequence, an overlong encoding: in a field no view reads.
BAD_BYTES = [b"\xed\xa0\x80", b"\x80", b"\xe2\x82", b"\xc0\xaf"]


def _with_note(body: dict[str, Any], note: bytes) -> bytes:
    return json.dumps(body)[:-1].encode() + b', "note": "' + note + b'"}'


@pytest.mark.parametrize("bad", BAD_BYTES)
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_invalid_utf8_is_a_400_problem_and_the_key_stays_free(alice, endpoint, bad):
    send, valid, effects = ENDPOINTS[endpoint]
    body = valid()
    before = effects()

    response = send(_with_note(body, bad))

    assert response.status_code == 400, response.content[:300]
    _problem(response, "idempotency_request_invalid")
    assert "not valid UTF-8" in response.json()["detail"]
    assert not IdempotencyRecord.objects.exists()
    assert effects() == before
    corrected = send(json.dumps(body).encode())  # the same key, text that is UTF-8
    assert corrected.status_code in (200, 201), corrected.content[:300]
    assert effects() == before + 1


@override_settings(ROOT_URLCONF="tests.support.urls")
@pytest.mark.parametrize("bad", BAD_BYTES)
def test_invalid_utf8_at_a_plain_django_view(alice, bad):
    client = Client()
    client.force_login(alice)

    def send(raw: bytes) -> Any:
        return client.post(
            "/plain/", raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1"
        )

    response = send(_with_note({"sku": "plain"}, bad))
    assert response.status_code == 400
    _problem(response, "idempotency_request_invalid")
    assert not IdempotencyRecord.objects.exists() and not Order.objects.exists()
    assert send(b'{"sku": "plain", "note": "\xc3\xa9"}').status_code == 201  # the key is free


# -- numbers that are not each other ------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (b'"Infinity"', b"1e400"),
        (b"1e400", b'"Infinity"'),
        (b'"-Infinity"', b"-1e400"),
        (b"1e400", b"1e401"),
        (b"-1e400", b"-1e401"),
        (b'"1e400"', b"1e400"),
    ],
)
def test_number_spellings_that_differ_are_not_replayed_for_each_other(alice, first, second):
    # DRF's CharField takes a number too: each first request creates an order.
    send = _post("/api/orders/")
    created = send(b'{"quantity": 1, "sku": ' + first + b"}")
    assert created.status_code == 201, created.content
    other = send(b'{"quantity": 1, "sku": ' + second + b"}")

    assert other.status_code == 422
    _problem(other, "idempotency_key_reused")
    assert "Idempotent-Replayed" not in other
    assert Order.objects.count() == 1


@pytest.mark.parametrize("endpoint", ["drf", "ninja", "callback"])
def test_a_number_out_of_any_range_is_a_400_problem(alice, endpoint):
    send, valid, effects = ENDPOINTS[endpoint]
    body = json.dumps(valid())[:-1].encode() + b', "extra": 1e9999999999999999999999}'
    response = send(body)
    assert response.status_code == 400
    _problem(response, "idempotency_request_invalid")
    assert not IdempotencyRecord.objects.exists()


def test_equal_numbers_are_still_one_request(alice):
    send = _post("/api/orders/")
    assert send(b'{"sku": "n", "quantity": 2}').status_code == 201
    replay = send(b'{"quantity": 2.0e0, "sku": "n"}')
    assert (replay.status_code, replay["Idempotent-Replayed"]) == (201, "true")


@pytest.mark.parametrize("path", ["/ninja/orders", "/ninja/async/orders"])
def test_ninja_nan_is_not_the_string_nan(alice, path):
    send = _post(path)
    assert send(b'{"sku": "NaN", "quantity": 1}').status_code == 201
    literal = send(b'{"sku": NaN, "quantity": 1}')
    assert literal.status_code == 422
    assert "Idempotent-Replayed" not in literal
    assert Order.objects.count() == 1


# -- NUL characters and media types -------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status"),
    [("/api/orders/", 400), ("/ninja/orders", 422), ("/ninja/async/orders", 422)],
)
def test_a_nul_character_is_refused_before_the_database(alice, path, status):
    response = _post(path)(json.dumps({"sku": "a\x00b", "quantity": 1}).encode())
    assert response.status_code == status
    assert "Null characters are not allowed." in response.content.decode()
    assert not IdempotencyRecord.objects.exists() and not Order.objects.exists()


@pytest.mark.parametrize("content_type", ["text/plain", "application/octet-stream"])
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_json_sent_as_another_media_type_is_415(alice, endpoint, content_type):
    send, valid, effects = ENDPOINTS[endpoint]
    before = effects()
    response = send(json.dumps(valid()).encode(), content_type=content_type)
    assert response.status_code == 415, response.content[:300]
    assert "Unsupported media type" in response.json()["detail"]
    assert not IdempotencyRecord.objects.exists()
    assert effects() == before
