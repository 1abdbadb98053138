"""The app installed, ``migrate idempotency`` not run: a server error that says so, never a 503.

A 503 with ``Retry-After`` would tell clients to retry what no retry mends. On
every database and through every adapter, a protected request is a 500, nothing
ran, and the ``idempotency`` logger says what to run.
"""

from __future__ import annotations

import base64

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection

from idempotency import idempotent_function
from tests.protocol.test_outage import ADAPTERS
from tests.support.factories import UserFactory
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def post(client):
    """POSTs an order with a key, logged in (session) and with HTTP Basic (ninja's auth)."""
    user = UserFactory()
    user.set_password("unmigrated-password")
    user.save()
    client.force_login(user)
    basic = base64.b64encode(f"{user.username}:unmigrated-password".encode()).decode()

    def send(path: str, key: str):
        return client.post(
            path,
            {"sku": "unmigrated", "quantity": 1},
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
            HTTP_AUTHORIZATION=f"Basic {basic}",
        )

    return send


def said_to_migrate(caplog: pytest.LogCaptureFixture) -> bool:
    return any(
        "manage.py migrate idempotency" in record.getMessage()
        for record in caplog.records
        if record.name == "idempotency"
    )


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_protected_request_is_a_500_that_says_to_migrate(
    unmigrated, client, post, adapter, caplog
):
    client.raise_request_exception = False
    response = post(ADAPTERS[adapter], "k-unmigrated")

    assert response.status_code == 500, response.content[:300]
    assert "Retry-After" not in response
    assert b"database_unavailable" not in response.content
    assert Order.objects.count() == 0  # the view never ran
    assert said_to_migrate(caplog)


def test_the_error_names_the_command(unmigrated, client, post):
    with pytest.raises(ImproperlyConfigured, match=r"manage.py migrate idempotency") as caught:
        post(ADAPTERS["plain"], "k-unmigrated")
    assert isinstance(caught.value.__cause__, DatabaseError)  # the database's own, kept


def test_a_table_dropped_behind_the_migrations_back_too(
    records_table_dropped, client, post, caplog
):
    client.raise_request_exception = False
    response = post(ADAPTERS["drf-mixin"], "k-dropped")
    assert response.status_code == 500
    assert said_to_migrate(caplog)


def test_an_idempotent_function_raises_it_and_is_not_retried(unmigrated):
    calls: list[str] = []

    @idempotent_function(scope="unmigrated", key=lambda order: order)
    def charge(order: str) -> str:
        calls.append(order)
        return order

    with pytest.raises(ImproperlyConfigured, match="migrate idempotency"):
        charge("o-1")
    assert calls == []


def test_the_views_own_missing_table_stays_the_databases_error(client, post, caplog):
    # The records are migrated: the 500 is the view's, and nothing blames the records.
    with connection.schema_editor() as editor:
        editor.delete_model(Order)
    try:
        with pytest.raises(DatabaseError):
            post(ADAPTERS["drf-mixin"], "k-view-table")
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(Order)
    assert not said_to_migrate(caplog)
