"""The claim: insert the record or find the one that holds the key, and decide what it means.

``claim`` returns ``(attempt, None)`` when this call owns the record and must
run the work, or ``(None, record)`` when a recorded outcome must be replayed.
A key held by a live attempt raises ``InFlightHere``; a wait on the row lock past
its bound, ``KeyInUse``; a claim the database gave up (a deadlock's victim),
``ClaimGivenUp``, which the caller may meet by claiming again in a new
transaction; another request under the same key, ``KeyReused``.

The unique (scope, idem_key) index decides every first claim: the insert either
lands or finds the row that holds the key, never check-then-insert.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, transaction

from idempotency import signals
from idempotency.conf import idempotency_settings, retention_for
from idempotency.exceptions import KeyInUse, KeyReused
from idempotency.models import IdempotencyRecord, Status
from idempotency.protocol.in_flight import busy
from idempotency.protocol.operation import Attempt, Operation, lease_length, lock_timeout
from idempotency.protocol.states import REPLAYABLE, recover
from idempotency.resolvers import resolver_for
from idempotency.stores import Candidate

Claimed = tuple["Attempt | None", IdempotencyRecord | None]

# How often a claim the database gave up is tried again, each in a transaction of
# its own, before the duplicate is answered 409.
CLAIM_RETRIES = 3


class ClaimGivenUp(Exception):
    """The database gave up the claim's transaction (a deadlock's victim): claim again."""


class InFlightHere(Exception):
    """A live attempt holds the key: a 409, unless the duplicate may wait for its outcome."""

    def __init__(self, record: IdempotencyRecord) -> None:
        self.record = record


def claim(operation: Operation, *, one_statement: bool = True) -> Claimed:
    """Claim the record inside the caller's transaction.

    Returns ``(attempt, None)`` when this call owns the record and must run the
    work, or ``(None, record)`` when a recorded outcome must be replayed (or,
    after a lost lease the resolver could not settle, answered "in use" once the
    transaction has committed what recovery wrote).
    """
    token = secrets.token_hex(16)
    record = _claim_in_one_statement(operation, token) if one_statement else None
    if record is None:
        store = operation.store
        with ContentionAnswered(operation), store.bounded_lock_wait(lock_timeout(operation)):
            record = _insert_or_lock(operation, token)
    return _settle(operation, record, token)


def claim_committed(operation: Operation) -> Claimed:
    """Lease mode: the claim is committed before the work starts.

    Outside any transaction the one-statement claim commits by itself (no
    BEGIN/COMMIT round trips); only a key held by an unfinished record needs
    the locked path, in a transaction of its own.
    """
    connection = transaction.get_connection(operation.database)
    if connection.get_autocommit():
        token = secrets.token_hex(16)
        record = _claim_in_one_statement(operation, token)
        if record is not None:
            return _settle(operation, record, token)
        with transaction.atomic(using=operation.database):
            return claim(operation, one_statement=False)  # it was just tried
    with transaction.atomic(using=operation.database):
        return claim(operation)


def _settle(operation: Operation, record: IdempotencyRecord, token: str) -> Claimed:
    """What the record found (or inserted) under the key means for this request."""
    if record.owner_token == token:
        return _claimed(operation, record, token), None
    if _expired(record):
        # Its window has passed: the key is new, whatever the old request was ("replace").
        replaced = _reclaim(operation, record, token, _candidate(operation, token))
        return _claimed(operation, replaced, token, replaced=True), None
    if record.request_hash != operation.request_hash:
        signals.key_reused.send(IdempotencyRecord, record=record, operation=operation)
        raise KeyReused()
    if record.status in REPLAYABLE:
        return None, record
    if record.status == Status.FAILED_RETRYABLE:  # "retry"
        return _claimed(operation, _reclaim(operation, record, token), token, reclaimed=True), None
    if _lease_lost(record):
        return _after_lost_lease(operation, record, token)
    raise InFlightHere(record)


def _expired(record: IdempotencyRecord) -> bool:
    """Its ``expires_at`` has passed, by the database's clock (the store's ``expired``)."""
    return bool(getattr(record, "expired", False))


def _lease_lost(record: IdempotencyRecord) -> bool:
    """The owner's lease ran out, by the database's clock (``lease_remaining``)."""
    remaining = getattr(record, "lease_remaining", None)
    return record.status == Status.PROCESSING and remaining is not None and remaining < timedelta(0)


def _after_lost_lease(operation: Operation, record: IdempotencyRecord, token: str) -> Claimed:
    """Never re-run blindly: the first attempt may have had its effect. Ask the resolver."""
    _, recovered = recover(record, resolver_for(operation.name, operation.resolver))
    if recovered.status in REPLAYABLE:
        return None, recovered
    if recovered.status == Status.FAILED_RETRYABLE:
        retried = _reclaim(operation, recovered, token)
        return _claimed(operation, retried, token, reclaimed=True), None
    return None, operation.store.lock(recovered.pk)


def _claim_in_one_statement(operation: Operation, token: str) -> IdempotencyRecord | None:
    """The new record, or a committed one that can be answered without a lock.

    That is a replayable outcome (``SUCCEEDED`` and ``FAILED_FINAL`` never
    change) or another request under the same key. ``None`` sends the caller
    to the locked path: the store has no one-statement claim, or the key is
    held by an unfinished record.
    """
    lease = lease_length(operation) if operation.mode == "lease" else None
    with ContentionAnswered(operation):
        record = operation.store.claim(
            _candidate(operation, token),
            lease=lease,
            lock_timeout=lock_timeout(operation),
            # Atomic mode: the record starts with a success's expiry (its finish is then in place).
            expires_in=retention_for(operation.name, Status.SUCCEEDED) if lease is None else None,
        )
    if record is None or record.owner_token == token:
        return record
    if _expired(record):
        return None  # replaced on the locked path, under the row's lock
    if record.status in REPLAYABLE or record.request_hash != operation.request_hash:
        return record
    return None


def _candidate(operation: Operation, token: str) -> Candidate:
    return Candidate(
        scope=operation.scope,
        idem_key=operation.key,
        operation=operation.name[:255],
        request_hash=operation.request_hash,
        request_method=operation.method[:16],
        request_path=operation.path[:2048],
        owner_token=token,
    )


def _insert_or_lock(operation: Operation, token: str) -> IdempotencyRecord:
    candidate = _candidate(operation, token)
    for _ in range(3):
        record = operation.store.insert_or_lock(candidate)
        if record is not None:
            return record
        # Purged between our insert and our lock: the key is free, insert again.
    raise KeyInUse(retry_after=idempotency_settings.RETRY_AFTER)


def _claimed(
    operation: Operation,
    record: IdempotencyRecord,
    token: str,
    *,
    reclaimed: bool = False,
    replaced: bool = False,
) -> Attempt:
    leased = reclaimed or replaced  # ``_reclaim`` took the lease
    if operation.mode == "lease" and not leased and record.lease_until is None:
        operation.store.renew(record.pk, token, lease_length(operation))
    signals.record_claimed.send(
        IdempotencyRecord,
        record=record,
        operation=operation,
        reclaimed=reclaimed,
        replaced=replaced,
    )
    return Attempt(operation=operation, record=record, owner_token=token)


def _reclaim(
    operation: Operation, record: IdempotencyRecord, token: str, fresh: Candidate | None = None
) -> IdempotencyRecord:
    """Hand the locked record to ``token``; with ``fresh``, as the new request's first attempt."""
    lease = lease_length(operation) if operation.mode == "lease" else None
    reclaimed = operation.store.reclaim(record, token, lease=lease, fresh=fresh)
    if reclaimed is None:
        # Only an expired record's takeover is fenced, and the row's lock keeps it
        # expired: should it still not land, the key is someone else's now.
        raise KeyInUse(retry_after=idempotency_settings.RETRY_AFTER)
    return reclaimed


class ContentionAnswered:
    """A claim that waited past its bound is a 409; one the database gave up, ``ClaimGivenUp``.

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
