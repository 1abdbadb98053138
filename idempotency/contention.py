"""When another attempt holds the key: the 409 and its ``Retry-After``, and claims tried again.

A claim meets contention in three ways: the key is held by a live attempt
(``InFlightHere``: a 409 unless the duplicate may wait), the row lock was not
granted in time (``busy``: a 409), or the database gave the claim's transaction
up (``ClaimGivenUp``: claim again, in a transaction of its own).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from django.db import DatabaseError, transaction

from idempotency import signals, waiting
from idempotency.conf import idempotency_settings
from idempotency.exceptions import KeyInUse
from idempotency.models import IdempotencyRecord
from idempotency.operation import Operation

T = TypeVar("T")

# How often a claim the database gave up (a deadlock's victim) is tried again,
# each in a transaction of its own, before the duplicate is answered 409.
CLAIM_RETRIES = 3


class ClaimGivenUp(Exception):
    """The database gave up the claim's transaction (a deadlock's victim): claim again."""


class InFlightHere(Exception):
    """A live attempt holds the key: a 409, unless the duplicate may wait for its outcome."""

    def __init__(self, record: IdempotencyRecord) -> None:
        self.record = record


def retried(operation: Operation, claim: Callable[[], T]) -> T:
    """Run ``claim`` (which opens its own transaction) again when the database gave it up.

    Only a transaction of our own can be tried again: inside the caller's,
    what the database rolled back is the caller's to handle, so that is a 409.
    """
    for _ in range(CLAIM_RETRIES):
        try:
            return claim()
        except ClaimGivenUp as exc:
            # Asked only now: the connection lookup costs more than the claim's own Python.
            if transaction.get_connection(operation.database).in_atomic_block:
                raise busy(operation) from exc
    try:
        return claim()
    except ClaimGivenUp as exc:
        raise busy(operation) from exc


def in_use(
    operation: Operation, record: IdempotencyRecord, *, unresolved: bool = False
) -> KeyInUse:
    remaining: timedelta | None = getattr(record, "lease_remaining", None)
    if unresolved:
        # The resolver answered "unknown": it is asked again when this pause (the lease) ends.
        pause = remaining.total_seconds() if remaining is not None else 0
        retry_after = max(idempotency_settings.RETRY_AFTER, math.ceil(pause))
    else:
        retry_after = waiting.retry_after(
            operation.name, elapsed=_running_for(record, remaining), lease_remaining=remaining
        )
    signals.key_in_use.send(IdempotencyRecord, operation=operation, retry_after=retry_after)
    return KeyInUse(retry_after=retry_after)


def _running_for(record: IdempotencyRecord, remaining: timedelta | None) -> timedelta | None:
    """How long the record's attempt has run, by the database clock (claims set ``updated_at``)."""
    if remaining is None or record.lease_until is None or record.updated_at is None:
        return None
    return record.lease_until - remaining - record.updated_at


def busy(operation: Operation) -> KeyInUse:
    retry_after = idempotency_settings.RETRY_AFTER
    signals.key_in_use.send(IdempotencyRecord, operation=operation, retry_after=retry_after)
    return KeyInUse(retry_after=retry_after)


class ContentionAnswered:
    """A claim that waited past its bound is a 409; one the database gave up, a retry.

    A class, not ``@contextmanager``: it wraps every claim, and a generator costs more.
    """

    def __init__(self, operation: Operation) -> None:
        self.operation = operation

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: Any
    ) -> None:
        if not isinstance(error, DatabaseError):
            return
        contention = self.operation.store.contention(error)
        if contention == "busy":
            raise busy(self.operation) from error
        if contention == "retry":
            raise ClaimGivenUp() from error
