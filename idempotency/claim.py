"""The claim: insert the record or find the one that holds the key, and decide what it means.

``claim`` returns ``(attempt, None)`` when this call owns the record and must
run the work, or ``(None, record)`` when a recorded outcome must be replayed.
A key held by a live attempt raises ``InFlightHere`` (see ``contention``);
another request under the same key raises ``KeyReused``.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.db import transaction

from idempotency import signals
from idempotency.conf import idempotency_settings
from idempotency.contention import ContentionAnswered, InFlightHere
from idempotency.exceptions import KeyInUse, KeyReused
from idempotency.models import REPLAYABLE, IdempotencyRecord, Status
from idempotency.operation import Attempt, Operation, lease_length, lock_timeout
from idempotency.read_first import replay_share
from idempotency.recovery import settle
from idempotency.resolvers import resolver_for
from idempotency.retention import retention_for
from idempotency.stores import Candidate
from idempotency.stores.generic import renewed

Claimed = tuple["Attempt | None", IdempotencyRecord | None]


def claim(operation: Operation, *, one_statement: bool = True) -> Claimed:
    """Claim the record inside the caller's transaction.

    Returns ``(attempt, None)`` when this call owns the record and must run the
    work, or ``(None, record)`` when a recorded outcome must be replayed (or,
    after a lost lease the resolver could not settle, answered "in use" once the
    transaction has committed what recovery wrote). Raises ``KeyReused`` or
    ``KeyInUse`` otherwise.
    """
    token = secrets.token_hex(16)
    record = _claim_in_one_statement(operation, token) if one_statement else None
    if record is None:
        store = operation.store
        with ContentionAnswered(operation), store.bounded_lock_wait(lock_timeout(operation)):
            record = _insert_or_lock(operation, token)
    return _settle_claim(operation, record, token)


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
            return _settle_claim(operation, record, token)
        with transaction.atomic(using=operation.database):
            return claim(operation, one_statement=False)  # it was just tried
    with transaction.atomic(using=operation.database):
        return claim(operation)


def _settle_claim(operation: Operation, record: IdempotencyRecord, token: str) -> Claimed:
    if record.owner_token == token:
        return _claimed(operation, record, token, reclaimed=False), None
    if _expired(record):
        # Its window has passed: the key is new, whatever the old request was.
        _reclaim(operation, record, token, fresh=_candidate(operation, token))
        return _claimed(operation, record, token, reclaimed=False, replaced=True), None
    if record.request_hash != operation.request_hash:
        signals.key_reused.send(IdempotencyRecord, record=record, operation=operation)
        raise KeyReused()
    if record.status in REPLAYABLE:
        return None, record
    if record.status == Status.FAILED_RETRYABLE:
        _reclaim(operation, record, token)
        return _claimed(operation, record, token, reclaimed=True), None
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
    _, settled = settle(record, resolver_for(operation.name, operation.resolver))
    if settled.status in REPLAYABLE:
        return None, settled
    if settled.status == Status.FAILED_RETRYABLE:
        _reclaim(operation, settled, token)
        return _claimed(operation, settled, token, reclaimed=True), None
    return None, operation.store.lock(settled.pk)


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
    reclaimed: bool,
    replaced: bool = False,
) -> Attempt:
    replay_share.seen(operation.name, replayed=False)
    leased = reclaimed or replaced  # ``reclaim`` took the lease
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
) -> None:
    """Hand the locked record to ``token``; with ``fresh``, as the new request's first attempt."""
    lease = lease_length(operation) if operation.mode == "lease" else None
    if not operation.store.reclaim(record.pk, token, lease=lease, fresh=fresh):
        # Only an expired record's takeover is fenced, and the row's lock keeps it
        # expired: should it still not land, the key is someone else's now.
        raise KeyInUse(retry_after=idempotency_settings.RETRY_AFTER)
    record.owner_token = token
    record.status = Status.PROCESSING
    if fresh is not None:
        for name, value in renewed(fresh).items():
            if name != "created_at":  # the database's clock: left as read
                setattr(record, name, value)
        record.expires_at = record.completed_at = None
