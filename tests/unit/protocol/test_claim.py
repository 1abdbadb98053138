"""``idempotency.protocol.claim``: what the record under a key means for a new request.

Each test claims inside a transaction, as atomic mode does, against a record in a
known state (``tests.support.factories``), and reads the table afterwards: the claim's
answer and what it wrote must agree with the state machine.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, transaction
from django.utils import timezone

from idempotency.exceptions import KeyInUse, KeyReused
from idempotency.models import IdempotencyRecord, Status
from idempotency.protocol import Operation
from idempotency.protocol.claim import (
    ClaimGivenUp,
    ContentionAnswered,
    Durations,
    InFlightHere,
    claim,
    claim_committed,
    retry_after,
)
from tests.support.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db


def operation(record: IdempotencyRecord | None = None, **changes: Any) -> Operation:
    base = Operation(
        scope=record.scope if record else "user:1:tests.claim",
        key=record.idem_key if record else "claim-1",
        request_hash=record.request_hash if record else "a" * 64,
        name="tests.operation",
        method="POST",
        path="/orders/",
    )
    return replace(base, **changes)


def claimed(op: Operation) -> tuple[Any, Any]:
    with transaction.atomic():
        return claim(op)


def stored(record: IdempotencyRecord) -> IdempotencyRecord:
    return IdempotencyRecord.objects.get(pk=record.pk)


def test_an_absent_key_is_inserted_and_owned_by_this_claim():
    attempt, existing = claimed(operation())
    assert existing is None
    record = IdempotencyRecord.objects.get()
    assert record.status == Status.PROCESSING
    assert record.owner_token == attempt.owner_token


def test_a_recorded_outcome_of_the_same_request_is_replayed_and_left_alone():
    record = IdempotencyRecordFactory(succeeded=True)
    attempt, existing = claimed(operation(record))
    assert attempt is None and existing is not None and existing.record.pk == record.pk
    assert stored(record).owner_token == record.owner_token
    assert stored(record).version == record.version


def test_another_request_under_the_key_is_refused_and_changes_nothing():
    record = IdempotencyRecordFactory(succeeded=True)
    with pytest.raises(KeyReused):
        claimed(operation(record, request_hash="b" * 64))
    assert stored(record).request_hash == record.request_hash


def test_a_live_attempt_holds_the_key():
    record = IdempotencyRecordFactory(in_flight=True)
    with pytest.raises(InFlightHere):
        claimed(operation(record, lock_timeout=0.1))
    assert stored(record).owner_token == record.owner_token


def test_a_retryable_record_is_retried_under_a_new_owner_token():
    record = IdempotencyRecordFactory(failed_retryable=True)
    attempt, _ = claimed(operation(record))
    after = stored(record)
    assert after.status == Status.PROCESSING
    assert attempt.owner_token == after.owner_token != record.owner_token
    assert after.attempts == record.attempts + 1
    # The record handed to the work is the row as written, not a stale copy.
    assert attempt.record.owner_token == after.owner_token
    assert attempt.record.status == Status.PROCESSING


def test_an_expired_record_is_replaced_by_the_new_request():
    record = IdempotencyRecordFactory(expired=True)
    attempt, existing = claimed(operation(record, request_hash="c" * 64))
    after = stored(record)
    assert existing is None
    assert after.status == Status.PROCESSING and after.request_hash == bytes.fromhex("c" * 32)
    assert after.response_body is None and after.expires_at is None
    assert attempt.owner_token == after.owner_token


def test_a_replacement_that_no_longer_finds_the_record_expired_is_refused(monkeypatch):
    # The takeover is fenced by the expiry: should the row stop being expired between
    # the read and the write, the key is someone else's and nothing is overwritten.
    record = IdempotencyRecordFactory(expired=True)
    op = operation(record, request_hash="c" * 64)
    reclaim = type(op.store).reclaim

    def renewed_meanwhile(store, found, *args, **kwargs):  # type: ignore[no-untyped-def]
        expires_at = timezone.now() + timedelta(hours=1)
        IdempotencyRecord.objects.filter(pk=found.pk).update(expires_at=expires_at)
        return reclaim(store, found, *args, **kwargs)

    monkeypatch.setattr(type(op.store), "reclaim", renewed_meanwhile)
    with pytest.raises(KeyInUse):
        claimed(op)
    assert stored(record).owner_token == record.owner_token
    assert stored(record).status == Status.SUCCEEDED


def test_a_lost_lease_without_resolver_is_never_run_again():
    record = IdempotencyRecordFactory(expired_lease=True)
    attempt, existing = claimed(operation(record, mode="lease"))
    assert attempt is None
    assert stored(record).status == Status.NEEDS_REVIEW
    assert stored(record).owner_token != record.owner_token  # the old owner is fenced off


def test_a_lease_mode_claim_commits_before_the_work():
    attempt, _ = claim_committed(operation(mode="lease", lease_seconds=30))
    record = IdempotencyRecord.objects.get()  # seen outside any transaction of the claim's
    assert record.owner_token == attempt.owner_token
    assert record.lease_until is not None


class TestContention:
    class Store:
        def __init__(self, answer: str | None) -> None:
            self.answer = answer

        def contention(self, error: DatabaseError) -> str | None:
            return self.answer

    def answered(self, answer: str | None) -> None:
        op = operation()
        object.__setattr__(op, "store", self.Store(answer))
        with ContentionAnswered(op):
            raise DatabaseError("lock")

    def test_a_lock_wait_past_its_bound_is_a_409(self):
        with pytest.raises(KeyInUse):
            self.answered("busy")

    def test_a_transaction_the_database_gave_up_is_claimed_again(self):
        with pytest.raises(ClaimGivenUp):
            self.answered("retry")

    def test_any_other_database_error_is_the_databases(self):
        with pytest.raises(DatabaseError):
            self.answered(None)


class TestRetryAfter:
    def test_without_history_it_is_the_setting(self, settings):
        settings.IDEMPOTENCY = {"RETRY_AFTER": 3}
        assert retry_after("never.seen", elapsed=None, lease_remaining=None) == 3

    def test_never_past_the_lease(self, monkeypatch):
        from idempotency.protocol import claim as module

        durations = Durations()
        durations.add("slow", 100.0)
        monkeypatch.setattr(module, "durations", durations)
        lease = timedelta(seconds=5)
        assert retry_after("slow", elapsed=timedelta(seconds=10), lease_remaining=lease) == 5
        assert retry_after("slow", elapsed=timedelta(seconds=99), lease_remaining=None) == 1
