"""The resolver idempotency.steps ships: ``effects_carry_step_keys``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from idempotency import idempotent_function, resolvers
from idempotency.models import IdempotencyRecord, IdempotencyStep, Status
from idempotency.recovery import recover_expired
from idempotency.steps import current, effects_carry_step_keys, key_for_record
from tests.support.factories import IdempotencyRecordFactory

SEED = "ab" * 32
SHIPPED = "idempotency.steps.effects_carry_step_keys"


def seeded(record: IdempotencyRecord, *, age: timedelta = timedelta(0)) -> IdempotencyStep:
    """The seed row a request's first ``step_key`` writes, written ``age`` ago."""
    row = IdempotencyStep.objects.create(
        record=record, request_started=record.created_at, seed=SEED
    )
    IdempotencyStep.objects.filter(pk=row.pk).update(created_at=timezone.now() - age)
    return row


@pytest.mark.django_db
class TestEffectsCarryStepKeys:
    def test_a_request_that_keyed_no_step_sent_nothing_and_is_released(self):
        record = IdempotencyRecordFactory(expired_lease=True)
        assert effects_carry_step_keys(record).answer == "not_done"

    def test_a_request_whose_steps_were_keyed_is_released_for_the_same_keys(self):
        record = IdempotencyRecordFactory(expired_lease=True)
        seeded(record, age=timedelta(minutes=5))
        assert effects_carry_step_keys(record).answer == "not_done"

    def test_the_seed_of_a_replaced_request_is_not_this_ones(self):
        record = IdempotencyRecordFactory(expired_lease=True)
        IdempotencyStep.objects.create(
            record=record, request_started=record.created_at - timedelta(days=3), seed=SEED
        )
        assert effects_carry_step_keys(record).answer == "not_done"

    def test_past_the_providers_window_it_cannot_tell(self, caplog):
        record = IdempotencyRecordFactory(expired_lease=True)
        seeded(record, age=timedelta(hours=25))  # Stripe forgets a key after 24 hours
        with caplog.at_level(logging.WARNING, logger="idempotency"):
            assert effects_carry_step_keys(record).answer == "unknown"
        assert "STEP_KEY_WINDOW" in caplog.text

    @override_settings(IDEMPOTENCY={"STEP_KEY_WINDOW": 3600})
    def test_the_window_is_the_setting(self):
        record = IdempotencyRecordFactory(expired_lease=True)
        seeded(record, age=timedelta(hours=2))
        assert effects_carry_step_keys(record).answer == "unknown"

    @override_settings(IDEMPOTENCY={"STEP_KEY_WINDOW": None})
    def test_without_a_window_it_always_releases(self):
        record = IdempotencyRecordFactory(expired_lease=True)
        seeded(record, age=timedelta(days=30))
        assert effects_carry_step_keys(record).answer == "not_done"

    @override_settings(IDEMPOTENCY={"RESOLVERS": {"tests.shipped": SHIPPED}})
    def test_named_in_the_setting_recovery_releases_instead_of_review(self):
        record = IdempotencyRecordFactory(expired_lease=True, operation="tests.shipped")
        seeded(record)
        report = recover_expired()
        assert report.released == 1
        assert IdempotencyRecord.objects.get(pk=record.pk).status == Status.FAILED_RETRYABLE


# --- a lost attempt, retried with the same step key ---------------------------------------

OPERATION = "tests.resolvers.pay"
sent: list[str] = []
lost = {"next_attempt": False}


@idempotent_function(
    scope="tests.resolvers",
    key=lambda order: order,
    mode="lease",
    lease_seconds=30,
    operation=OPERATION,
    resolver=effects_carry_step_keys,
)
def pay(order: str) -> str:
    key = current().step_key("charge")
    sent.append(key)  # what the provider received
    if lost["next_attempt"]:
        lost["next_attempt"] = False
        # As a killed worker leaves it: no outcome, no release (its token is gone), and a
        # lease that runs out.
        IdempotencyRecord.objects.filter(idem_key=order).update(
            owner_token=b"killed", lease_until=timezone.now() - timedelta(seconds=1)
        )
        raise SystemExit("killed after the provider answered")
    return key


@pytest.fixture
def _clean() -> Iterator[None]:
    sent.clear()
    yield
    resolvers._registry.pop(OPERATION, None)


@pytest.mark.django_db(transaction=True)  # lease mode: the seed is committed before its key
@pytest.mark.usefixtures("_clean")
def test_a_lost_attempt_is_retried_with_the_key_it_sent():
    lost["next_attempt"] = True
    with pytest.raises(SystemExit):
        pay("order-1")
    record = IdempotencyRecord.objects.get(idem_key="order-1")
    assert record.status == Status.PROCESSING  # lost: what recovery, or the retry, finds

    # The retry finds the lease run out and asks the resolver: released, run again, and the
    # provider gets the first attempt's key, which it answers without charging twice.
    assert pay("order-1") == sent[0] == key_for_record(record, "charge")
    assert sent == [sent[0], sent[0]]
    stored = IdempotencyRecord.objects.get(idem_key="order-1")
    assert (stored.status, stored.attempts) == (Status.SUCCEEDED, 2)
