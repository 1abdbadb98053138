"""A database that fails under a protected request: 503 problem+json, nothing half-written.

The connection is killed by the database server itself, at the point named by
``X-Break`` (see tests/testapp/outage_views.py): in authentication, before or
after the view's write. Every adapter answers the same, and the next request
on the same thread finds a working connection.
"""

from __future__ import annotations

import base64
import logging

import pytest
from django.db import connection
from django.test import override_settings

from idempotency.models import IdempotencyRecord, Status
from tests.support.factories import UserFactory
from tests.testapp.models import Order

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]

ADAPTERS = {
    "drf-mixin": "/outage/orders/",
    "drf-api-view": "/outage/charge/",
    "plain": "/outage/plain/",
    "async": "/outage/async/",
    "ninja": "/outage/ninja/orders",
    "ninja-async": "/outage/ninja/async/orders",
}
PASSWORD = "outage-password"


@pytest.fixture
def user():
    user = UserFactory()
    user.set_password(PASSWORD)
    user.save()
    return user


@pytest.fixture
def post(client, user):
    client.force_login(user)
    basic = base64.b64encode(f"{user.username}:{PASSWORD}".encode()).decode()

    def send(path, key, broken_at=None, body=None):
        headers = {"HTTP_IDEMPOTENCY_KEY": key, "HTTP_AUTHORIZATION": f"Basic {basic}"}
        if broken_at:
            headers["HTTP_X_BREAK"] = broken_at
        body = body or {"sku": "outage", "quantity": 1}
        return client.post(path, body, content_type="application/json", **headers)

    return send


def assert_unavailable(response):
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response["Retry-After"].isdigit() and int(response["Retry-After"]) >= 1
    body = response.json()
    assert body["code"] == "database_unavailable"
    assert body["status"] == 503


@pytest.mark.parametrize("broken_at", ["before", "after", "timeout-after"])
@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_every_adapter_answers_503_and_rolls_back(post, adapter, broken_at):
    failed = post(ADAPTERS[adapter], "k-outage", broken_at)

    assert_unavailable(failed)
    assert Order.objects.count() == 0  # the write after the claim rolled back with it
    assert IdempotencyRecord.objects.count() == 0
    retried = post(ADAPTERS[adapter], "k-outage")  # same thread: a fresh connection
    again = post(ADAPTERS[adapter], "k-outage")
    assert retried.status_code == 201, retried.content
    assert (again.status_code, again["Idempotent-Replayed"]) == (201, "true")
    assert Order.objects.count() == 1


@pytest.mark.parametrize("adapter", ["drf-mixin", "ninja", "ninja-async"])
def test_an_outage_in_authentication_is_a_503_too(post, adapter):
    failed = post(ADAPTERS[adapter], "k-auth", "auth")

    assert_unavailable(failed)
    assert IdempotencyRecord.objects.count() == 0
    assert post(ADAPTERS[adapter], "k-auth").status_code == 201


def test_unprotected_reads_answer_503_with_the_handlers(client, user):
    # Reads are not protected: the DRF mixin's views and ninja's answer_outages answer them.
    basic = base64.b64encode(f"{user.username}:{PASSWORD}".encode()).decode()
    headers = {"HTTP_AUTHORIZATION": f"Basic {basic}", "HTTP_X_BREAK": "auth"}
    drf_list = client.get("/outage/orders/", **headers)  # the mixin's views: by themselves
    ninja_list = client.get("/outage/ninja-handled/orders", **headers)

    assert_unavailable(drf_list)
    assert_unavailable(ninja_list)
    assert (
        client.get("/outage/ninja-handled/orders", HTTP_AUTHORIZATION=f"Basic {basic}").status_code
        == 200
    )


def test_api_view_authentication_needs_the_exception_handler(post):
    # @api_view authenticates before @idempotent runs: DRF's handler is the place.
    drf = {"EXCEPTION_HANDLER": "idempotency.drf.exception_handler"}
    with override_settings(REST_FRAMEWORK=drf):
        failed = post("/outage/orders/", "k-handler", "auth")
    assert_unavailable(failed)


def test_drf_error_format_keeps_the_code_and_retry_after(post):
    with override_settings(IDEMPOTENCY={"ERROR_FORMAT": "drf", "RETRY_AFTER": 3}):
        in_view = post("/outage/orders/", "k-drf", "after")
        in_auth = post("/outage/orders/", "k-drf", "auth")
    for failed in (in_view, in_auth):
        assert failed.status_code == 503
        assert failed.json()["code"] == "database_unavailable"
        assert failed["Retry-After"] == "3"


def test_logged_once_by_the_idempotency_logger(post, caplog):
    with caplog.at_level(logging.INFO):
        post("/outage/orders/", "k-log", "after")
        post("/outage/orders/", "k-log-auth", "auth")

    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert [record.name for record in errors] == ["idempotency", "idempotency"]
    assert {getattr(record, "event", None) for record in errors} == {
        "idempotency.database_unavailable"
    }
    assert all(record.exc_info for record in errors)


def test_lease_mode_releases_the_record_over_a_fresh_connection(post):
    failed = post("/outage/lease-orders/", "k-lease", "before")

    assert_unavailable(failed)
    record = IdempotencyRecord.objects.get()
    assert record.status == Status.FAILED_RETRYABLE  # not stuck: the retry re-claims it
    assert post("/outage/lease-orders/", "k-lease").status_code == 201
    assert Order.objects.count() == 1


def test_the_connection_is_usable_after_the_answer(post):
    post("/outage/plain/", "k-usable", "after")

    assert connection.connection is None or connection.is_usable()
    assert Order.objects.count() == 0
