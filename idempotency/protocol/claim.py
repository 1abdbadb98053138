"""The claim: insert the record or find the one that holds the key, and decide what it means;
and what a duplicate of an attempt in flight is told.

``claim`` returns ``(attempt, None)`` when this call owns the record and must
run the work, or ``(None, found)`` when a recorded outcome must be replayed.
A key held by a live attempt raises ``InFlightHere``; a wait on the row lock past
its bound, ``KeyInUse``; a claim the database gave up (a deadlock's victim),
``ClaimGivenUp``, which the caller may meet by claiming again in a new
transaction; another request under the same key, ``KeyReused``.

The unique (scope, idem_key) index decides every first claim: the insert either
lands or finds the row that holds the key, never check-then-insert.

A duplicate that arrives while an attempt runs either waits for its outcome
(atomic mode: on the row lock, up to ``LOCK_TIMEOUT``; lease mode:
``WAIT_SECONDS``, among at most ``MAX_WAITERS`` of this process) or gets
``KeyInUse`` (409) with a ``Retry-After`` a client can use: when the attempt is
likely done (the operation's recent durations here), never past its lease.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, transaction

from idempotency import signals
from idempotency.conf import idempotency_settings, retention_for
from idempotency.exceptions import KeyInUse, KeyReused
from idempotency.models import REPLAYABLE, IdempotencyRecord, Status
from idempotency.protocol.operation import Attempt, Operation, Taken, new_owner_token
from idempotency.protocol.states import recover
from idempotency.resolvers import resolver_for
from idempotency.stores import Candidate, Found

Claimed = tuple["Attempt | None", Found | None]

# How often a claim the database gave up is tried again, each in a transaction of
# its own, before the duplicate is answered 409.
CLAIM_RETRIES = 3


class ClaimGivenUp(Exception):
    """The database gave up the claim's transaction (a deadlock's victim): claim again."""


class InFlightHere(Exception):
    """A live attempt holds the key: a 409, unless the duplicate may wait for its outcome."""

    def __init__(self, found: Found) -> None:
        self.found = found


def claim(operation: Operation, *, one_statement: bool = True, announce: bool = True) -> Claimed:
    """Claim the record inside the caller's transaction.

    Returns ``(attempt, None)`` when this call owns the record and must run the
    work, or ``(None, found)`` when a recorded outcome must be replayed (or,
    after a lost lease the resolver could not settle, answered "in use" once the
    transaction has committed what recovery wrote). ``announce=False`` leaves
    ``record_claimed`` to the caller, to send once the claim has committed.
    """
    token = new_owner_token()
    found = _claim_in_one_statement(operation, token) if one_statement else None
    if found is None:
        store = operation.store
        with ContentionAnswered(operation), store.bounded_lock_wait(operation.lock_wait):
            found = _insert_or_lock(operation, token)
    claimed = _settle(operation, found, token)
    if announce:
        _announce(claimed)
    return claimed


def claim_committed(operation: Operation) -> Claimed:
    """Lease mode: the claim is committed before the work starts.

    Outside any transaction the one-statement claim commits by itself (no
    BEGIN/COMMIT round trips); only a key held by an unfinished record needs
    the locked path, in a transaction of its own.
    """
    connection = transaction.get_connection(operation.database)
    if not connection.get_autocommit():
        # Inside the caller's transaction: committed with it, announced as in atomic mode.
        with transaction.atomic(using=operation.database):
            return claim(operation)
    token = new_owner_token()
    found = _claim_in_one_statement(operation, token)
    if found is not None:
        claimed = _settle(operation, found, token)
    else:
        with transaction.atomic(using=operation.database):
            claimed = claim(operation, one_statement=False, announce=False)  # it was just tried
    # Announced once committed: a claim whose COMMIT failed was never made.
    _announce(claimed)
    return claimed


def _settle(operation: Operation, found: Found, token: bytes) -> Claimed:
    """What the record found (or inserted) under the key means for this request."""
    record = found.record
    if record.owner_token == token:
        return _claimed(operation, record, token), None
    if found.expired:
        # Its window has passed: the key is new, whatever the old request was ("replace").
        replaced = _reclaim(operation, record, token, candidate_of(operation, token))
        return _claimed(operation, replaced, token, replaced=True), None
    if record.request_hash != operation.request_hash:
        signals.key_reused.send(IdempotencyRecord, record=record, operation=operation)
        raise KeyReused()
    if record.status in REPLAYABLE:
        return None, found
    if record.status == Status.FAILED_RETRYABLE:  # "retry"
        return _claimed(operation, _reclaim(operation, record, token), token, reclaimed=True), None
    if _lease_lost(found):
        return _after_lost_lease(operation, record, token)
    raise InFlightHere(found)


def _lease_lost(found: Found) -> bool:
    """The owner's lease ran out, by the database's clock."""
    remaining = found.lease_remaining
    return (
        found.record.status == Status.PROCESSING
        and remaining is not None
        and remaining < timedelta(0)
    )


def _after_lost_lease(operation: Operation, record: IdempotencyRecord, token: bytes) -> Claimed:
    """Never re-run blindly: the first attempt may have had its effect. Ask the resolver."""
    _, recovered = recover(record, resolver_for(operation.name, operation.resolver))
    if recovered.status in REPLAYABLE:
        return None, Found(recovered)
    if recovered.status == Status.FAILED_RETRYABLE:
        retried = _reclaim(operation, recovered, token)
        return _claimed(operation, retried, token, reclaimed=True), None
    return None, operation.store.lock(recovered.pk)


def _claim_in_one_statement(operation: Operation, token: bytes) -> Found | None:
    """The new record, or a committed one that can be answered without a lock.

    That is a replayable outcome (``SUCCEEDED`` and ``FAILED_FINAL`` never
    change) or another request under the same key. ``None`` sends the caller
    to the locked path: the store has no one-statement claim, or the key is
    held by an unfinished record.
    """
    lease = operation.lease
    with ContentionAnswered(operation):
        found = operation.store.claim(
            candidate_of(operation, token),
            lease=lease,
            lock_timeout=operation.lock_wait,
            # Atomic mode: the record starts with a success's expiry (its finish is then in place).
            expires_in=retention_for(operation.name, Status.SUCCEEDED) if lease is None else None,
        )
    if found is None or found.record.owner_token == token:
        return found
    if found.expired:
        return None  # replaced on the locked path, under the row's lock
    record = found.record
    if record.status in REPLAYABLE or record.request_hash != operation.request_hash:
        return found
    return None


def candidate_of(operation: Operation, token: bytes) -> Candidate:
    return Candidate(
        scope=operation.scope,
        idem_key=operation.key,
        operation=operation.name[:255],
        request_hash=operation.request_hash,
        request_method=operation.method[:16],
        request_path=operation.path[:2048],
        owner_token=token,
    )


def _insert_or_lock(operation: Operation, token: bytes) -> Found:
    candidate = candidate_of(operation, token)
    for _ in range(3):
        found = operation.store.insert_or_lock(candidate)
        if found is not None:
            return found
        # Purged between our insert and our lock: the key is free, insert again.
    raise KeyInUse(retry_after=idempotency_settings.RETRY_AFTER)


def _claimed(
    operation: Operation,
    record: IdempotencyRecord,
    token: bytes,
    *,
    reclaimed: bool = False,
    replaced: bool = False,
) -> Attempt:
    leased = reclaimed or replaced  # ``_reclaim`` took the lease
    if operation.lease is not None and not leased and record.lease_until is None:
        operation.store.renew(record.pk, token, operation.lease)
    taken: Taken = "replaced" if replaced else "reclaimed" if reclaimed else "new"
    return Attempt(operation=operation, record=record, owner_token=token, taken=taken)


def _announce(claimed: Claimed) -> None:
    """``record_claimed``, for a claim that made this request the record's attempt."""
    attempt = claimed[0]
    if attempt is None:
        return
    signals.record_claimed.send(
        IdempotencyRecord,
        record=attempt.record,
        operation=attempt.operation,
        reclaimed=attempt.taken == "reclaimed",
        replaced=attempt.taken == "replaced",
    )


def _reclaim(
    operation: Operation, record: IdempotencyRecord, token: bytes, fresh: Candidate | None = None
) -> IdempotencyRecord:
    """Hand the locked record to ``token``; with ``fresh``, as the new request's first attempt."""
    reclaimed = operation.store.reclaim(record, token, lease=operation.lease, fresh=fresh)
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


# --- what a duplicate of an attempt in flight is told ----------------------------------------

_OPERATIONS = 256  # operation names remembered, the least recently finished forgotten first
_SAMPLES = 32  # durations remembered per operation


def in_use(operation: Operation, found: Found, *, unresolved: bool = False) -> KeyInUse:
    """The 409 for a key ``found``'s attempt holds, with when to come back."""
    record, remaining = found.record, found.lease_remaining
    if unresolved:
        # The resolver answered "unknown": it is asked again when this pause (the lease) ends.
        pause = remaining.total_seconds() if remaining is not None else 0
        seconds = max(idempotency_settings.RETRY_AFTER, math.ceil(pause))
    else:
        seconds = retry_after(
            operation.name, elapsed=_running_for(record, remaining), lease_remaining=remaining
        )
    signals.key_in_use.send(IdempotencyRecord, operation=operation, retry_after=seconds)
    return KeyInUse(retry_after=seconds)


def busy(operation: Operation) -> KeyInUse:
    """The 409 for a claim whose wait on the row lock ran past its bound."""
    seconds = idempotency_settings.RETRY_AFTER
    signals.key_in_use.send(IdempotencyRecord, operation=operation, retry_after=seconds)
    return KeyInUse(retry_after=seconds)


def _running_for(record: IdempotencyRecord, remaining: timedelta | None) -> timedelta | None:
    """How long the record's attempt has run, by the database clock (claims set ``updated_at``)."""
    if remaining is None or record.lease_until is None or record.updated_at is None:
        return None
    return record.lease_until - remaining - record.updated_at


def retry_after(name: str, *, elapsed: timedelta | None, lease_remaining: timedelta | None) -> int:
    """``Retry-After`` of a ``409``: whole seconds until the answer is likely there.

    The operation's median duration here less what the attempt has run so far,
    else ``RETRY_AFTER`` (also once the attempt runs longer than usual); never
    past the end of its lease; at least one second.
    """
    seconds = float(idempotency_settings.RETRY_AFTER)
    median = durations.median(name)
    if median is not None and elapsed is not None and median > elapsed.total_seconds():
        seconds = median - elapsed.total_seconds()
    if lease_remaining is not None and lease_remaining > timedelta(0):
        seconds = min(seconds, lease_remaining.total_seconds())
    return max(1, math.ceil(seconds))


class Durations:
    """The durations of each operation's latest finished attempts in this process, bounded."""

    def __init__(self, operations: int = _OPERATIONS, samples: int = _SAMPLES) -> None:
        self._lock = threading.Lock()
        self._operations = operations
        self._samples = samples
        self._by_name: OrderedDict[str, deque[float]] = OrderedDict()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            samples = self._by_name.pop(name, None) or deque(maxlen=self._samples)
            samples.append(seconds)
            self._by_name[name] = samples
            while len(self._by_name) > self._operations:
                self._by_name.popitem(last=False)

    def median(self, name: str) -> float | None:
        with self._lock:
            samples = list(self._by_name.get(name, ()))
        return statistics.median(samples) if samples else None


durations = Durations()


def record_duration(name: str, seconds: float) -> None:
    """An attempt of ``name`` finished after ``seconds``: the next 409s' ``Retry-After`` use it."""
    durations.add(name, seconds)


class Waiters:
    """How many requests of this process wait for an outcome now, at most ``MAX_WAITERS``.

    A waiting request holds a worker thread (and its database connection, idle);
    past the bound, duplicates get ``409`` at once, so a hot key cannot take
    every thread of a process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @contextmanager
    def admitted(self) -> Iterator[bool]:
        with self._lock:
            admitted = self._count < idempotency_settings.MAX_WAITERS
            self._count += admitted
        try:
            yield admitted
        finally:
            if admitted:
                with self._lock:
                    self._count -= 1

    @property
    def count(self) -> int:
        return self._count


waiters = Waiters()
