"""The published expiry is exact: past ``expires_at`` a key is new, before the purge runs.

A claim that meets an expired record replaces it under the row's lock (a
fenced reclaim), so racing claims on an expired key run the work once. On
every database; the races on PostgreSQL and MariaDB, with real threads.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from idempotency import signals
from idempotency.models import IdempotencyRecord, Status
from tests.protocol.test_concurrency import ORDER, Answer, post_order
from tests.support.factories import UserFactory
from tests.support.threads import run_in_threads
from tests.testapp.models import Order

THREADS = 12
OTHER = {"sku": "pen", "quantity": 3}


@pytest.fixture
def user():
    return UserFactory()


def expire(key: str, **values: Any) -> None:
    past = timezone.now() - timedelta(seconds=1)
    assert IdempotencyRecord.objects.filter(idem_key=key).update(expires_at=past, **values) == 1


def first_run(answer: Answer) -> bool:
    return answer.status == 201 and not answer.replayed


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["atomic", "lease"])
@pytest.mark.parametrize("read_first", ["never", "always"])
def test_an_expired_key_is_a_new_request(user, mode, read_first):
    with override_settings(IDEMPOTENCY={"MODE": mode, "READ_FIRST": read_first}):
        first = post_order(user, "k")
        assert post_order(user, "k").replayed  # the control: inside the window it replays
        expire("k")
        again = post_order(user, "k")
        assert first_run(again)
        assert post_order(user, "k").replayed  # the new outcome, in a new window
    assert json.loads(again.body)["id"] != json.loads(first.body)["id"]
    assert Order.objects.count() == 2
    record = IdempotencyRecord.objects.get(idem_key="k")
    assert (record.status, record.attempts) == (Status.SUCCEEDED, 1)
    assert record.expires_at > timezone.now() + timedelta(hours=1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", [Status.SUCCEEDED, Status.FAILED_FINAL, Status.FAILED_RETRYABLE])
def test_another_body_under_an_expired_key_runs_not_422(user, status):
    post_order(user, "k")
    assert post_order(user, "k", OTHER).status == 422  # the control
    expire("k", status=status)
    answer = post_order(user, "k", OTHER)
    assert first_run(answer)
    assert json.loads(answer.body)["sku"] == "pen"
    record = IdempotencyRecord.objects.get(idem_key="k")
    assert record.attempts == 1
    assert record.created_at > timezone.now() - timedelta(seconds=30)
    assert post_order(user, "k", OTHER).replayed
    assert post_order(user, "k").status == 422  # the old request's body is the other one now


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", [Status.PROCESSING, Status.NEEDS_REVIEW])
def test_records_in_flight_or_in_review_are_never_replaced(user, status):
    # Atomic mode's claim gives PROCESSING a success's expiry already: it must not count.
    post_order(user, "k")
    lease = timezone.now() + timedelta(minutes=1)
    expire("k", status=status, lease_until=lease if status == Status.PROCESSING else None)
    with override_settings(IDEMPOTENCY={"MODE": "lease"}):
        assert post_order(user, "k").status == 409
    assert Order.objects.count() == 1
    assert IdempotencyRecord.objects.get(idem_key="k").status == status


@pytest.mark.django_db(transaction=True)
def test_the_replacement_is_signalled_as_a_claim(user):
    heard: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        heard.append(kwargs)

    post_order(user, "k")
    expire("k")
    signals.record_claimed.connect(receiver, weak=False)
    try:
        post_order(user, "k")
    finally:
        signals.record_claimed.disconnect(receiver)
    assert [(call["reclaimed"], call["replaced"]) for call in heard] == [(False, True)]


@pytest.mark.django_db(transaction=True)
def test_the_replacement_is_logged_as_one(user, caplog):
    post_order(user, "k")
    expire("k")
    with caplog.at_level(logging.INFO, logger="idempotency"):
        post_order(user, "k")
    (claim,) = [entry for entry in caplog.records if entry.event == "idempotency.claimed"]
    assert (claim.reclaimed, claim.replaced) == (False, True)
    assert "replaced=True" in claim.getMessage()


@pytest.mark.django_db(transaction=True)
def test_a_short_retention_forgets_the_key(user):
    # As a client sees it: nothing touched by the test, only time passing.
    with override_settings(IDEMPOTENCY={"RETENTION": {"SUCCEEDED": 1}}):
        post_order(user, "k")
        assert post_order(user, "k").replayed
        time.sleep(1.2)
        assert first_run(post_order(user, "k"))
    assert Order.objects.count() == 2


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["atomic", "lease"])
@pytest.mark.parametrize("read_first", ["never", "always"])
def test_racing_claims_on_an_expired_key_run_once(user, mode, read_first):
    post_order(user, "k")
    expire("k")
    settings = {"MODE": mode, "READ_FIRST": read_first, "LOCK_TIMEOUT": 10.0}
    with override_settings(IDEMPOTENCY=settings):
        answers = run_in_threads(THREADS, lambda i: post_order(user, "k", query="?sleep=0.3"))
    statuses = Counter(answer.status for answer in answers)
    assert set(statuses) <= {201, 409}, statuses
    assert len([answer for answer in answers if first_run(answer)]) == 1
    created = [answer for answer in answers if answer.status == 201]
    assert len({answer.body for answer in created}) == 1
    assert Order.objects.count() == 2  # the expired request's order, and one more
    record = IdempotencyRecord.objects.get(idem_key="k")
    assert (record.status, record.attempts) == (Status.SUCCEEDED, 1)
    assert json.loads(created[0].body)["id"] == Order.objects.latest("pk").pk


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_racing_claims_with_different_bodies_on_an_expired_key(user):
    post_order(user, "k")
    expire("k")
    bodies = [ORDER, OTHER]
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 10.0}):
        answers = run_in_threads(
            THREADS, lambda i: post_order(user, "k", bodies[i % 2], query="?sleep=0.3")
        )
    # One of them takes the key; those with its body replay it, the others get 422.
    winner = [answer for answer in answers if first_run(answer)]
    assert len(winner) == 1
    sku = json.loads(winner[0].body)["sku"]
    for index, answer in enumerate(answers):
        same = bodies[index % 2]["sku"] == sku
        assert answer.status in ({201, 409} if same else {422, 409}), (index, answer)
    assert Order.objects.count() == 2
