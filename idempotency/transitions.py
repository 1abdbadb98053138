"""Operator and recovery state changes, through the records' state machine.

Every change is a conditional UPDATE on the state and version the caller saw
(optimistic, fenced): if anything changed the record meanwhile, nothing is
written and ``TransitionNotAllowed`` says so.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.db.models import F, Q
from django.db.models.functions import Now

from idempotency import replay_cache
from idempotency.exceptions import TransitionNotAllowed
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import StoredResponse
from idempotency.retention import retention_for
from idempotency.stores import records_database

# Transitions made outside a request: by recovery or by an operator.
# (absent -> PROCESSING and FAILED_RETRYABLE -> PROCESSING belong to idempotency.claim.)
ALLOWED: dict[str, frozenset[str]] = {
    Status.PROCESSING: frozenset(
        {Status.SUCCEEDED, Status.FAILED_RETRYABLE, Status.FAILED_FINAL, Status.NEEDS_REVIEW}
    ),
    Status.NEEDS_REVIEW: frozenset(
        {Status.SUCCEEDED, Status.FAILED_RETRYABLE, Status.FAILED_FINAL}
    ),
}


def can_transition(record: IdempotencyRecord, target: str) -> bool:
    return target in ALLOWED.get(record.status, frozenset())


def transition(
    record: IdempotencyRecord,
    target: Status,
    *,
    resource_id: str | None = None,
    response: StoredResponse | None = None,
    using: str | None = None,
    recovery_attempt: bool = False,
) -> IdempotencyRecord:
    """Move ``record`` to ``target`` if the state machine allows it and nobody changed it.

    A ``PROCESSING`` record can only be moved once its lease has expired (judged
    by the database clock): a live owner is never overtaken.
    """
    if not can_transition(record, target):
        raise TransitionNotAllowed(f"A {record.status} record cannot become {target}.")
    guard = Q(pk=record.pk, status=record.status, version=record.version)
    if record.status == Status.PROCESSING:
        guard &= Q(lease_until__lt=Now()) | Q(lease_until__isnull=True)
    values = _values(record, target, resource_id, response, recovery_attempt=recovery_attempt)
    database = records_database(using, record=record)
    records = IdempotencyRecord.objects.using(database)
    if not records.filter(guard).update(**values):
        raise TransitionNotAllowed(
            "The record changed meanwhile (or its lease is still live); reload it and retry."
        )
    moved = records.get(pk=record.pk)
    # Nothing caches the states a transition leaves; the tombstone keeps it so.
    replay_cache.forget_records([moved], database)
    return moved


def _values(
    record: IdempotencyRecord,
    target: Status,
    resource_id: str | None,
    response: StoredResponse | None,
    *,
    recovery_attempt: bool,
) -> dict[str, object]:
    """What a transition writes: a new owner token fences off the previous owner."""
    window = retention_for(record.operation, target)
    values: dict[str, object] = {
        "status": target,
        "owner_token": secrets.token_hex(16),
        "lease_until": None,
        "updated_at": Now(),
        "version": F("version") + 1,
        "expires_at": None if window is None or target == Status.NEEDS_REVIEW else Now() + window,
    }
    if target in (Status.SUCCEEDED, Status.FAILED_FINAL):
        values["completed_at"] = Now()
    if recovery_attempt:
        values["recovery_attempts"] = F("recovery_attempts") + 1
    if resource_id is not None:
        values["resource_id"] = resource_id[:255]
    if response is not None:
        values.update(
            response_status=response.status,
            response_headers=[list(pair) for pair in response.headers],
            response_body=response.body,
        )
    return values


def postpone(
    record: IdempotencyRecord, seconds: float, *, using: str | None = None
) -> IdempotencyRecord:
    """Keep an expired ``PROCESSING`` record as it is for ``seconds`` more (outcome unknown).

    The owner token is kept: if the first attempt is merely slow, it can still
    finish. The record counts one more recovery attempt.
    """
    if record.status != Status.PROCESSING:
        raise TransitionNotAllowed(
            f"Only a PROCESSING record can be postponed, not {record.status}."
        )
    guard = Q(pk=record.pk, status=record.status, version=record.version) & (
        Q(lease_until__lt=Now()) | Q(lease_until__isnull=True)
    )
    records = IdempotencyRecord.objects.using(records_database(using, record=record))
    updated = records.filter(guard).update(
        lease_until=Now() + timedelta(seconds=seconds),
        recovery_attempts=F("recovery_attempts") + 1,
        updated_at=Now(),
        version=F("version") + 1,
    )
    if not updated:
        raise TransitionNotAllowed(
            "The record changed meanwhile (or its lease is still live); reload it and retry."
        )
    return records.get(pk=record.pk)
