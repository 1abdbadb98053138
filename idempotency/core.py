"""The idempotency protocol: claim a record, run the work once, store its outcome.

This module knows nothing of HTTP, nor of which database holds the records:
it decides, and the alias's store (``idempotency.stores``) runs the
statements. ``execute`` is generic over what the work returns; the adapters
tell it how to turn that into an ``Outcome`` and how to rebuild it from a
stored record.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache, cached_property
from typing import Any, Literal, TypeVar

from django.db import DatabaseError, connections, transaction

from idempotency import replay_cache, signals, waiting
from idempotency.checks import validate_settings
from idempotency.conf import idempotency_settings
from idempotency.exceptions import (
    OUTAGE_ERRORS,
    DatabaseUnavailable,
    IdempotencyError,
    KeyInUse,
    KeyReused,
    LeaseLost,
)
from idempotency.models import REPLAYABLE, IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.recovery import settle
from idempotency.resolvers import ResolverSpec, resolver_for
from idempotency.retention import retention_for
from idempotency.stores import Candidate, Store, records_database, store_for

logger = logging.getLogger("idempotency")

T = TypeVar("T")
Claimed = tuple["Attempt | None", IdempotencyRecord | None]
Mode = Literal["atomic", "lease"]
MODES: tuple[Mode, ...] = ("atomic", "lease")
# What a duplicate of an attempt still in flight gets: "wait" (atomic mode: for the
# row lock, up to LOCK_TIMEOUT, then the outcome; lease mode: WAIT_SECONDS) or
# "conflict" (409 with Retry-After at once, as the draft says a server SHOULD).
InFlight = Literal["wait", "conflict"]
IN_FLIGHT: tuple[InFlight, ...] = ("wait", "conflict")

# Outcome and StoredResponse live in idempotency.outcomes; still importable from here.
__all__ = [
    "IN_FLIGHT",
    "MODES",
    "Attempt",
    "InFlight",
    "check_in_flight",
    "Mode",
    "Operation",
    "Outcome",
    "StoredResponse",
    "execute",
]

# How often a claim the database gave up (a deadlock's victim) is tried again,
# each in a transaction of its own, before the duplicate is answered 409.
CLAIM_RETRIES = 3


@dataclass(frozen=True)
class Operation:
    """One business intent: who (scope), which key, and what exactly (request_hash)."""

    scope: str
    key: str
    request_hash: str
    name: str = ""
    method: str = ""
    path: str = ""
    mode: Mode = "atomic"
    lease_seconds: float | None = None
    lock_timeout: float | None = None
    using: str | None = None
    # Who says what happened when a lease is lost: a callable or a dotted path
    # (see idempotency.resolvers); None looks it up by ``name``.
    resolver: ResolverSpec | None = None
    # Lease mode: how long a duplicate of an in-flight attempt waits for its
    # outcome before ``KeyInUse``; None reads WAIT_SECONDS.
    wait_seconds: float | None = None
    # None reads IN_FLIGHT.
    in_flight: InFlight | None = None

    # Where its record lives: known once the rest is.
    database: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", bounded_scope(self.scope))
        object.__setattr__(self, "database", records_database(self.using))

    @cached_property
    def store(self) -> Store:
        return store_for(self.database)

    @property
    def conflict_at_once(self) -> bool:
        """A duplicate of an attempt in flight gets 409 at once: no lock wait, no waiting."""
        return (self.in_flight or idempotency_settings.IN_FLIGHT) == "conflict"

    @property
    def wait_for(self) -> float:
        if self.conflict_at_once:
            return 0.0
        if self.wait_seconds is not None:
            return self.wait_seconds
        return idempotency_settings.WAIT_SECONDS


def check_in_flight(in_flight: str | None, wait_seconds: float | None) -> None:
    """Refuse an ``in_flight`` that is not one of ``IN_FLIGHT``, or that contradicts itself."""
    if in_flight is not None and in_flight not in IN_FLIGHT:
        raise ValueError(f"in_flight should be one of {IN_FLIGHT}, not {in_flight!r}.")
    if in_flight == "conflict" and wait_seconds:
        raise ValueError(
            "in_flight='conflict' answers 409 at once: give it or wait_seconds, not both."
        )


@cache
def _scope_width() -> int:
    return IdempotencyRecord._meta.get_field("scope").max_length or 255


def bounded_scope(scope: str) -> str:
    """``scope`` if it fits its column, else a prefix and the scope's SHA-256.

    Cutting it short instead would let two long scopes share records, and
    replay one scope's response to the other.
    """
    if len(scope) <= (width := _scope_width()):
        return scope
    digest = hashlib.sha256(scope.encode()).hexdigest()
    return f"{scope[: width - len(digest) - 1]}#{digest}"


@dataclass
class Attempt:
    """The claim held by the running work; lets long work renew its lease."""

    operation: Operation
    record: IdempotencyRecord
    owner_token: str
    resource_id: str = ""
    started: float = field(default_factory=time.monotonic)  # this process's clock, for durations

    def renew(self, seconds: float | None = None) -> None:
        if self.operation.mode != "lease":
            return
        lease = _lease_length(self.operation, seconds)
        if not self.operation.store.renew(self.record.pk, self.owner_token, lease):
            raise LeaseLost()


class _ClaimGivenUp(Exception):
    """The database gave up the claim's transaction (a deadlock's victim): claim again."""


class _InFlight(Exception):
    """A live attempt holds the key: a 409, unless the duplicate may wait for its outcome."""

    def __init__(self, record: IdempotencyRecord) -> None:
        self.record = record


def execute(
    operation: Operation,
    work: Callable[[Attempt], T],
    *,
    decide: Callable[[T, Attempt], Outcome | None],
    replay: Callable[[IdempotencyRecord], T],
) -> T:
    """Run ``work`` at most once for ``operation`` and answer repeats with ``replay``.

    ``decide`` turns the work's result into the outcome to record, or ``None``
    to record nothing (the business writes roll back, the key stays free).
    A database that fails under it raises ``DatabaseUnavailable``: nothing was
    recorded, and the same call may be retried.
    """
    validate_settings()
    try:
        cached = replay_cache.lookup(operation)  # None unless REPLAY_CACHE is set and holds it
        if cached is not None:
            return _replay(operation, cached, replay, from_cache=True)
        if operation.mode == "lease":
            return _execute_leased(operation, work, decide=decide, replay=replay)
        final = _read_first(operation)
        if final is not None:
            return _replay(operation, final, replay)
        return _execute_atomic(operation, work, decide=decide, replay=replay)
    except OUTAGE_ERRORS as exc:
        if isinstance(exc, IdempotencyError):
            raise
        raise database_unavailable(exc, operation) from exc


def database_unavailable(
    error: Exception, operation: Operation | None = None
) -> DatabaseUnavailable:
    """``error`` (an outage) as the protocol's error, once: connections cleaned, signal sent.

    A connection the failure broke is closed (Django's own end-of-request check,
    ``close_if_unusable_or_obsolete``, run now), so that what runs next in this
    thread, and the next request, connect afresh. Connections inside a
    transaction are left to it: rolling back is the transaction's owner's job.
    """
    if isinstance(error, DatabaseUnavailable):
        return error
    _close_broken_connections()
    unavailable = DatabaseUnavailable(retry_after=idempotency_settings.RETRY_AFTER)
    # The ``idempotency`` logger hears this signal (idempotency/logs.py): one record per outage.
    signals.database_unavailable.send(
        IdempotencyRecord, operation=operation, error=error, retry_after=unavailable.retry_after
    )
    return unavailable


def _close_broken_connections() -> None:
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


class ReplayShare:
    """The share of replays among an operation's requests, in this process (READ_FIRST "auto").

    An exponentially weighted mean over about the last ``1 / WEIGHT`` requests
    of each operation. Reading first saves a replay the claim's transaction
    (``BEGIN``, the claim, ``COMMIT``: three round trips for one) and costs a
    first request one read more, so it pays once replays are about a third
    of the requests (``THRESHOLD``); below that first requests pay nothing.
    Updated without a lock: a lost update only nudges a heuristic.
    """

    WEIGHT = 1 / 32
    THRESHOLD = 1 / 3
    # Operation names come from code, so they are few; a project that makes them
    # up per request must not grow this dict without bound.
    MAX_OPERATIONS = 1024

    def __init__(self) -> None:
        self._shares: dict[str, float] = {}

    def seen(self, name: str, *, replayed: bool) -> None:
        share = self._shares.get(name)
        if share is None:
            if len(self._shares) >= self.MAX_OPERATIONS:
                self._shares = {}
            share = 0.0
        self._shares[name] = share + ((1.0 if replayed else 0.0) - share) * self.WEIGHT

    def high(self, name: str) -> bool:
        return self._shares.get(name, 0.0) >= self.THRESHOLD


replay_share = ReplayShare()


def _read_first(operation: Operation) -> IdempotencyRecord | None:
    """Atomic mode: a final record of this very request, read before any transaction opens.

    Only a ``SUCCEEDED`` or ``FAILED_FINAL`` record (they never change) whose
    request hash matches is answered from the read; anything else (no
    record, one in flight or retryable, another body: 422) takes the claim's
    path as without it, so the unique constraint and the row lock still
    decide every first request and every conflict.
    """
    policy = idempotency_settings.READ_FIRST
    if policy == "never" or (policy == "auto" and not replay_share.high(operation.name)):
        return None
    record = operation.store.read_final(operation.scope, operation.key)
    if record is None or record.request_hash != operation.request_hash:
        return None
    return record


def _execute_atomic(
    operation: Operation,
    work: Callable[[Attempt], T],
    *,
    decide: Callable[[T, Attempt], Outcome | None],
    replay: Callable[[IdempotencyRecord], T],
) -> T:
    def run() -> tuple[bool, T | IdempotencyRecord | None]:
        with transaction.atomic(using=operation.database), operation.store.statements():
            attempt, existing = _claim(operation)
            if attempt is None:
                return False, existing
            value = work(attempt)
            outcome = decide(value, attempt)
            if outcome is None:
                # Nothing recorded, nothing happened: the business writes go too.
                transaction.set_rollback(True, using=operation.database)
            else:
                _finish(attempt, outcome)
            return True, value

    try:
        ran, result = _retried(operation, run)
    except _InFlight as busy:
        raise _in_use(operation, busy.record) from None
    if ran:
        return result  # type: ignore[return-value]
    # After the commit: what recovery wrote while claiming must stay even if this is a 409.
    return _replay(operation, result, replay)  # type: ignore[arg-type]


def _execute_leased(
    operation: Operation,
    work: Callable[[Attempt], T],
    *,
    decide: Callable[[T, Attempt], Outcome | None],
    replay: Callable[[IdempotencyRecord], T],
) -> T:
    attempt, existing = _claim_or_wait(operation)
    if attempt is None:
        return _replay(operation, existing, replay)
    try:
        value = work(attempt)
        outcome = decide(value, attempt)
    except BaseException as exc:
        # The work may have had effects outside any transaction we control:
        # keep the record, bound to this request, for a retry of the same request.
        if isinstance(exc, OUTAGE_ERRORS):
            # Released over a fresh connection if the database is back; if it is
            # not, the record stays claimable once its lease runs out.
            _close_broken_connections()
        _release(attempt, delete=False)
        raise
    if outcome is None:
        _release(attempt, delete=True)
    else:
        _finish(attempt, outcome)
    return value


def _claim_or_wait(operation: Operation) -> Claimed:
    """Lease mode: claim; a duplicate of a live attempt may first wait for its outcome.

    Woken when the record may have changed, it claims again: that replays the
    outcome, re-claims a released key (one waiter wins, the others wait on for
    its outcome) or finds the attempt still running. Bounded by ``wait_for``
    and by ``MAX_WAITERS`` per process; never inside a transaction.
    """
    try:
        return _retried(operation, lambda: _claim_committed(operation))
    except _InFlight as busy:
        in_flight = busy.record
    connection = transaction.get_connection(operation.database)
    if operation.wait_for <= 0 or connection.in_atomic_block:
        raise _in_use(operation, in_flight)
    deadline = time.monotonic() + operation.wait_for
    with waiting.waiters.admitted() as admitted:
        while admitted and (left := deadline - time.monotonic()) > 0:
            operation.store.wait_for_outcome(operation.scope, operation.key, left)
            try:
                return _retried(operation, lambda: _claim_committed(operation))
            except _InFlight as busy:
                in_flight = busy.record
    raise _in_use(operation, in_flight)


def _retried(operation: Operation, claim: Callable[[], T]) -> T:
    """Run ``claim`` (which opens its own transaction) again when the database gave it up.

    Only a transaction of our own can be tried again: inside the caller's,
    what the database rolled back is the caller's to handle, so that is a 409.
    """
    for _ in range(CLAIM_RETRIES):
        try:
            return claim()
        except _ClaimGivenUp as exc:
            # Asked only now: the connection lookup costs more than the claim's own Python.
            if transaction.get_connection(operation.database).in_atomic_block:
                raise _busy(operation) from exc
    try:
        return claim()
    except _ClaimGivenUp as exc:
        raise _busy(operation) from exc


def _replay(
    operation: Operation,
    record: IdempotencyRecord | None,
    replay: Callable[[IdempotencyRecord], T],
    *,
    from_cache: bool = False,
) -> T:
    assert record is not None
    if record.status not in REPLAYABLE:
        raise _in_use(operation, record, unresolved=True)  # a lost lease, outcome unknown
    replay_share.seen(operation.name, replayed=True)
    if not from_cache:
        replay_cache.remember(operation, record)
    # The ``idempotency`` logger hears this signal too (idempotency/logs.py).
    signals.response_replayed.send(IdempotencyRecord, record=record, operation=operation)
    return replay(record)


def _claim(operation: Operation, *, one_statement: bool = True) -> Claimed:
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
        with _ContentionAnswered(operation), store.bounded_lock_wait(_lock_timeout(operation)):
            record = _insert_or_lock(operation, token)
    return _settle_claim(operation, record, token)


def _claim_committed(operation: Operation) -> Claimed:
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
            return _claim(operation, one_statement=False)  # it was just tried
    with transaction.atomic(using=operation.database):
        return _claim(operation)


def _settle_claim(operation: Operation, record: IdempotencyRecord, token: str) -> Claimed:
    if record.owner_token == token:
        return _claimed(operation, record, token, reclaimed=False), None
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
    raise _InFlight(record)


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
    lease = _lease_length(operation) if operation.mode == "lease" else None
    with _ContentionAnswered(operation):
        record = operation.store.claim(
            _candidate(operation, token),
            lease=lease,
            lock_timeout=_lock_timeout(operation),
            # Atomic mode: the record starts with a success's expiry (its finish is then in place).
            expires_in=retention_for(operation.name, Status.SUCCEEDED) if lease is None else None,
        )
    if record is None or record.owner_token == token:
        return record
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
    operation: Operation, record: IdempotencyRecord, token: str, *, reclaimed: bool
) -> Attempt:
    replay_share.seen(operation.name, replayed=False)
    if operation.mode == "lease" and not reclaimed and record.lease_until is None:
        operation.store.renew(record.pk, token, _lease_length(operation))
    signals.record_claimed.send(
        IdempotencyRecord, record=record, operation=operation, reclaimed=reclaimed
    )
    return Attempt(operation=operation, record=record, owner_token=token)


def _reclaim(operation: Operation, record: IdempotencyRecord, token: str) -> None:
    lease = _lease_length(operation) if operation.mode == "lease" else None
    operation.store.reclaim(record.pk, token, lease=lease)
    record.owner_token = token
    record.status = Status.PROCESSING


def _in_use(
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


def _busy(operation: Operation) -> KeyInUse:
    retry_after = idempotency_settings.RETRY_AFTER
    signals.key_in_use.send(IdempotencyRecord, operation=operation, retry_after=retry_after)
    return KeyInUse(retry_after=retry_after)


def _finish(attempt: Attempt, outcome: Outcome) -> None:
    operation, response = attempt.operation, outcome.response
    values: dict[str, Any] = {
        "status": str(outcome.status),
        "response_status": response.status if response else None,
        "response_headers": [list(pair) for pair in response.headers] if response else [],
        "response_body": response.body if response else None,
        "resource_id": (outcome.resource_id or attempt.resource_id)[:255],
    }
    window = retention_for(operation.name, outcome.status)
    if not operation.store.finish(attempt.record.pk, attempt.owner_token, values, window):
        raise LeaseLost()
    replay_cache.remember_outcome(
        operation, attempt.record.pk, outcome, window, values["resource_id"]
    )
    if operation.mode == "lease":
        waiting.durations.add(operation.name, time.monotonic() - attempt.started)
        _announce(operation)
    signals.record_completed.send(
        IdempotencyRecord,
        record=attempt.record,
        operation=attempt.operation,
        status=outcome.status,
    )


def _release(attempt: Attempt, *, delete: bool) -> None:
    store, pk, token = attempt.operation.store, attempt.record.pk, attempt.owner_token
    if delete:
        if store.discard(pk, token):
            _announce(attempt.operation)
        return
    window = retention_for(attempt.operation.name, Status.FAILED_RETRYABLE)
    if store.release(pk, token, window):
        _announce(attempt.operation)
        signals.record_completed.send(
            IdempotencyRecord,
            record=attempt.record,
            operation=attempt.operation,
            status=Status.FAILED_RETRYABLE,
        )


def _lease_length(operation: Operation, seconds: float | None = None) -> timedelta:
    length = seconds or operation.lease_seconds or idempotency_settings.LEASE_SECONDS
    return timedelta(seconds=length)


def _lock_timeout(operation: Operation) -> float:
    """How long a claim waits on the row lock of a concurrent attempt; 0: not at all."""
    if operation.conflict_at_once:
        return 0.0
    if operation.lock_timeout is not None:
        return operation.lock_timeout
    return float(idempotency_settings.LOCK_TIMEOUT)


class _ContentionAnswered:
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
            raise _busy(self.operation) from error
        if contention == "retry":
            raise _ClaimGivenUp() from error


def _announce(operation: Operation) -> None:
    """Wake the duplicates waiting for this key's outcome, if any may wait."""
    if operation.wait_for > 0:
        operation.store.notify_waiters(operation.scope, operation.key)
