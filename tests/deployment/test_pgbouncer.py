"""Behind a real PgBouncer in transaction pooling mode (scripts/pgbouncer.sh, PGBOUNCER=1).

Each transaction may run on another server connection there, so what outlives a
transaction cannot be relied on: a duplicate that waits for an in-flight
attempt polls instead of ``LISTEN``-ing, and still gets the one outcome, within
its bound. The rest of the protocol is tested through the same pooler by the
pass that runs the concurrency, transaction, HTTP and Celery tests behind it
(scripts/test.sh).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from idempotency.stores import transaction_pooled
from tests.protocol.test_waiting import (
    URL,
    WAITING_URL,
    done,
    during_first,
    in_flight,
    orders,
    send,
    until,
)

pytestmark = [pytest.mark.postgres, pytest.mark.pgbouncer, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def behind_pgbouncer() -> None:
    """Fail, never skip, unless the test database is behind PgBouncer in transaction mode."""
    if not os.environ.get("PGBOUNCER"):
        pytest.fail("run it through scripts/pgbouncer.sh with PGBOUNCER=1 (scripts/test.sh does)")
    import psycopg  # the PostgreSQL driver: not installed where only SQLite runs

    settings = connection.settings_dict
    # Its console (the pseudo-database "pgbouncer") speaks only SHOW and friends:
    # psycopg itself, not a Django connection, which sets its time zone first.
    with psycopg.connect(
        host=settings["HOST"], port=settings["PORT"], user=settings["USER"], dbname="pgbouncer"
    ) as console:
        console.autocommit = True
        rows = console.execute("SHOW CONFIG").fetchall()
    config = {row[0]: row[1] for row in rows}
    assert config["pool_mode"] == "transaction"
    assert str(connection.settings_dict["PORT"]) == config["listen_port"]


@pytest.fixture
def alice() -> Any:
    from tests.support.factories import UserFactory

    return UserFactory(username="alice")


def test_the_pooled_database_is_detected_from_djangos_own_setting():
    assert connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert transaction_pooled("default")


def test_a_waiting_duplicate_polls_and_gets_the_one_outcome(alice):
    first, duplicate = during_first(alice, WAITING_URL, "pooled-1", **{"X-Sleep": "1.5"})
    assert first.error is None and duplicate.error is None
    assert (first.status, duplicate.status, duplicate.replayed) == (201, 201, True)
    assert duplicate.body == first.body
    assert orders("pooled-1") == 1
    # A LISTEN would stay on whichever server connection ran it; none is sent.
    assert not [sql for sql in duplicate.queries if "LISTEN" in sql.upper()], duplicate.queries
    # Bounded polling (50 ms doubling to 1 s): a handful of reads, not a busy loop.
    assert len([sql for sql in duplicate.queries if "SELECT" in sql.upper()]) <= 20


def test_the_first_finishing_wakes_no_one_it_cannot_reach_and_nothing_hangs(alice):
    with override_settings(IDEMPOTENCY={"WAIT_SECONDS": 1}):
        first_thread, first = send(alice, URL, "pooled-2", **{"X-Sleep": "3"})
        until(lambda: in_flight("pooled-2"))
        duplicate_thread, duplicate = send(alice, URL, "pooled-2")
        done(duplicate_thread)
        done(first_thread)
    # Past its bound the duplicate is told to retry, at the bound; one effect.
    assert duplicate.status == 409, duplicate.body
    assert duplicate.body["code"] == "idempotency_key_in_use"
    assert 0.9 <= duplicate.seconds < 2.9, duplicate.seconds
    assert first.status == 201
    assert orders("pooled-2") == 1


def test_with_pooling_switched_off_the_wait_would_listen(alice):
    # What the detection changes: the same wait, told there is no pooler, LISTENs
    # (and so would leave a listening server connection in PgBouncer's pool).
    with override_settings(IDEMPOTENCY={"TRANSACTION_POOLING": False}):
        first, duplicate = during_first(alice, WAITING_URL, "pooled-3", **{"X-Sleep": "1.5"})
    assert (first.status, duplicate.status) == (201, 201)
    assert [sql for sql in duplicate.queries if sql.upper().startswith("LISTEN")]
    assert orders("pooled-3") == 1
