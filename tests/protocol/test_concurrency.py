"""Concurrent duplicates on PostgreSQL: real threads, each on its own connection."""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIRequestFactory, force_authenticate

from idempotency import signals
from idempotency.models import IdempotencyRecord, Status
from tests.support.factories import UserFactory
from tests.support.threads import JOIN_TIMEOUT, Call, run_in_threads
from tests.testapp.models import Order
from tests.testapp.views import OrderViewSet

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]

THREADS = 24
ORDER = {"sku": "book", "quantity": 1}
create_order = OrderViewSet.as_view({"post": "create"})


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]

    @property
    def replayed(self) -> bool:
        return self.headers.get("Idempotent-Replayed") == "true"


def post_order(user: Any, key: str, data: dict[str, Any] = ORDER, query: str = "") -> Answer:
    request = APIRequestFactory().post(
        f"/orders/{query}", data, format="json", headers={"Idempotency-Key": key}
    )
    force_authenticate(request, user=user)
    response = create_order(request)
    if hasattr(response, "render"):
        response.render()
    return Answer(response.status_code, response.content, dict(response.items()))


class Claimed:
    """Set once a request has claimed its record (inside its transaction in atomic mode)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __enter__(self) -> threading.Event:
        signals.record_claimed.connect(self._receive, weak=False)
        return self.event

    def __exit__(self, *exc_info: object) -> None:
        signals.record_claimed.disconnect(self._receive)

    def _receive(self, **kwargs: Any) -> None:
        self.event.set()


@pytest.fixture
def user():
    return UserFactory()


@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_simultaneous_duplicates_execute_once(user, mode):
    # The first request sleeps a little so the others arrive while it is in flight.
    settings = {"MODE": mode, "LOCK_TIMEOUT": 5.0}
    with override_settings(IDEMPOTENCY=settings):
        answers = run_in_threads(THREADS, lambda i: post_order(user, "dup", query="?sleep=0.3"))
    statuses = Counter(answer.status for answer in answers)
    assert set(statuses) <= {201, 409}, statuses
    assert Order.objects.count() == 1
    created = [answer for answer in answers if answer.status == 201]
    assert len([answer for answer in created if not answer.replayed]) == 1
    order = Order.objects.get()
    assert len({answer.body for answer in created}) == 1
    assert json.loads(created[0].body) == {
        "id": order.pk,
        "sku": "book",
        "quantity": 1,
        "paid": False,
    }
    for answer in answers:
        if answer.status == 409:
            assert int(answer.headers["Retry-After"]) >= 1
    record = IdempotencyRecord.objects.get(idem_key="dup")
    assert (record.status, record.attempts) == (Status.SUCCEEDED, 1)


def test_duplicates_past_the_lock_bound_get_409_not_a_second_run(user):
    # A short bound and a slow first request: most duplicates give up with 409.
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 0.2}):
        answers = run_in_threads(THREADS, lambda i: post_order(user, "hot", query="?sleep=1"))
    statuses = Counter(answer.status for answer in answers)
    assert set(statuses) <= {201, 409}, statuses
    assert statuses[409] >= 1
    assert Order.objects.count() == 1
    assert len({answer.body for answer in answers if answer.status == 201}) == 1


def test_many_keys_in_parallel_each_execute_once(user):
    keys = THREADS // 2  # every key is sent by two threads at once

    def send(index: int) -> Answer:
        key = index % keys
        return post_order(user, f"key-{key}", {"sku": f"sku-{key}", "quantity": 1})

    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 5.0}):
        answers = run_in_threads(THREADS, send)
    assert {answer.status for answer in answers} <= {201, 409}
    assert Order.objects.count() == keys
    assert Counter(Order.objects.values_list("sku", flat=True)) == {
        f"sku-{key}": 1 for key in range(keys)
    }
    assert IdempotencyRecord.objects.filter(status=Status.SUCCEEDED).count() == keys


def test_users_in_parallel_with_the_same_key_are_independent():
    users = [UserFactory() for _ in range(THREADS)]
    answers = run_in_threads(THREADS, lambda i: post_order(users[i], "same-key"))
    assert [answer.status for answer in answers] == [201] * THREADS
    assert not any(answer.replayed for answer in answers)
    assert Order.objects.count() == THREADS
    assert len({answer.body for answer in answers}) == THREADS


def test_in_flight_duplicate_gets_409_instead_of_waiting(user):
    query = "?sleep=3"
    with (
        override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 0.3, "RETRY_AFTER": 2}),
        Claimed() as claimed,
    ):
        first = Call(lambda: post_order(user, "slow", query=query))
        first.start()
        assert claimed.wait(JOIN_TIMEOUT), "the first request never claimed its key"
        duplicate = Call(lambda: post_order(user, "slow", query=query))
        duplicate.start()
        answer = duplicate.result()
        first_still_running = first.is_alive()
        created = first.result()
    assert answer.status == 409
    assert json.loads(answer.body)["code"] == "idempotency_key_in_use"
    assert answer.headers["Retry-After"] == "2"
    assert first_still_running, "the duplicate waited for the first request to finish"
    assert created.status == 201
    # Once the first committed, a repeat is a replay.
    repeat = post_order(user, "slow", query=query)
    assert (repeat.status, repeat.body, repeat.replayed) == (201, created.body, True)
    assert Order.objects.count() == 1


def test_in_flight_duplicate_in_lease_mode_gets_409_with_the_lease(user):
    query = "?sleep=2"
    settings = {"MODE": "lease", "LEASE_SECONDS": 30}
    with override_settings(IDEMPOTENCY=settings), Claimed() as claimed:
        first = Call(lambda: post_order(user, "leased", query=query))
        first.start()
        assert claimed.wait(JOIN_TIMEOUT)
        answer = post_order(user, "leased", query=query)
        first_still_running = first.is_alive()
        created = first.result()
    assert first_still_running
    assert answer.status == 409
    # A short poll interval (RETRY_AFTER), not the 30 s left on the lease.
    assert answer.headers["Retry-After"] == "1"
    assert created.status == 201
    assert Order.objects.count() == 1


def test_business_writes_and_record_roll_back_together(user):
    failing = Call(lambda: post_order(user, "fails", query="?fail=1"))
    failing.start()
    with pytest.raises(RuntimeError, match="business failure"):
        failing.result()
    # Seen from another connection: neither the order nor the record exists.
    assert Order.objects.count() == 0
    assert not IdempotencyRecord.objects.exists()
    retried = post_order(user, "fails")
    assert retried.status == 201
    assert Order.objects.count() == 1


def test_waiting_duplicate_runs_when_the_first_is_not_recorded(user):
    # The first request answers 400 (not recorded) after holding the key; a duplicate
    # that waited on it finds the key free and runs itself, exactly once.
    invalid = {"sku": "book", "quantity": 0}
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 5.0}):
        answers = run_in_threads(THREADS, lambda i: post_order(user, "bad", invalid))
    assert {answer.status for answer in answers} == {400}
    assert not IdempotencyRecord.objects.exists()
    assert Order.objects.count() == 0
