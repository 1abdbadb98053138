"""The idempotency protocol: claim a record, run the work once, store its outcome.

This module knows nothing of HTTP. ``execute`` is generic over what the work
returns; the adapters tell it how to turn that into an ``Outcome`` and how to
rebuild it from a stored record.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypeVar

from django.db import DEFAULT_DB_ALIAS, OperationalError, router, transaction
from django.db.models import DurationField, ExpressionWrapper, F, Value
from django.db.models.functions import Now

from idempotency import postgres, replay_cache, signals
from idempotency.conf import idempotency_settings
from idempotency.exceptions import KeyInUse, KeyReused, LeaseLost
from idempotency.models import REPLAYABLE, IdempotencyRecord, Status
from idempotency.resolvers import ResolverSpec, resolver_for

logger = logging.getLogger("idempotency")

T = TypeVar("T")
Mode = Literal["atomic", "lease"]
MODES: tuple[Mode, ...] = ("atomic", "lease")

_LOCK_NOT_AVAILABLE = "55P03"


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", bounded_scope(self.scope))

    @property
    def database(self) -> str:
        return (
            self.using
            or idempotency_settings.DATABASE
            or router.db_for_write(IdempotencyRecord)
            or DEFAULT_DB_ALIAS
        )


def bounded_scope(scope: str) -> str:
    """``scope`` if it fits its column, else a prefix and the scope's SHA-256.

    Cutting it short instead would let two long scopes share records, and
    replay one scope's response to the other.
    """
    width = IdempotencyRecord._meta.get_field("scope").max_length or 255
    if len(scope) <= width:
        return scope
    digest = hashlib.sha256(scope.encode()).hexdigest()
    return f"{scope[: width - len(digest) - 1]}#{digest}"


@dataclass(frozen=True)
class StoredResponse:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | None = None


@dataclass(frozen=True)
class Outcome:
    status: Status
    response: StoredResponse | None = None
    resource_id: str = ""


@dataclass
class Attempt:
    """The claim held by the running work; lets long work renew its lease."""

    operation: Operation
    record: IdempotencyRecord
    owner_token: str
    resource_id: str = ""

    def renew(self, seconds: float | None = None) -> None:
        if self.operation.mode != "lease":
            return
        lease = _lease_length(self.operation, seconds)
        updated = _owned(self.operation, self.record.pk, self.owner_token).update(
            lease_until=Now() + Value(lease)
        )
        if not updated:
            raise LeaseLost()


class _Discarded(Exception):
    """Carries a result that must not be recorded out of the transaction it rolls back."""

    def __init__(self, value: object) -> None:
        self.value = value


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
    """
    cached = replay_cache.lookup(operation)  # None unless REPLAY_CACHE is set and holds it
    if cached is not None:
        return _replay(operation, cached, replay, from_cache=True)
    if operation.mode == "lease":
        return _execute_leased(operation, work, decide=decide, replay=replay)
    return _execute_atomic(operation, work, decide=decide, replay=replay)


def _execute_atomic(
    operation: Operation,
    work: Callable[[Attempt], T],
    *,
    decide: Callable[[T, Attempt], Outcome | None],
    replay: Callable[[IdempotencyRecord], T],
) -> T:
    try:
        with transaction.atomic(using=operation.database):
            attempt, existing = _claim(operation)
            if attempt is not None:
                value = work(attempt)
                outcome = decide(value, attempt)
                if outcome is None:
                    raise _Discarded(value)
                _finish(attempt, outcome)
                return value
    except _Discarded as discarded:
        return discarded.value  # type: ignore[return-value]
    # After the commit: what recovery wrote while claiming must stay even if this is a 409.
    return _replay(operation, existing, replay)


def _execute_leased(
    operation: Operation,
    work: Callable[[Attempt], T],
    *,
    decide: Callable[[T, Attempt], Outcome | None],
    replay: Callable[[IdempotencyRecord], T],
) -> T:
    attempt, existing = _claim_committed(operation)
    if attempt is None:
        return _replay(operation, existing, replay)
    try:
        value = work(attempt)
        outcome = decide(value, attempt)
    except BaseException:
        # The work may have had effects outside any transaction we control:
        # keep the record, bound to this request, for a retry of the same request.
        _release(attempt, delete=False)
        raise
    if outcome is None:
        _release(attempt, delete=True)
    else:
        _finish(attempt, outcome)
    return value


def _replay(
    operation: Operation,
    record: IdempotencyRecord | None,
    replay: Callable[[IdempotencyRecord], T],
    *,
    from_cache: bool = False,
) -> T:
    assert record is not None
    if record.status not in REPLAYABLE:
        raise _in_use(operation, record)  # a lost lease whose outcome is still unknown
    if not from_cache:
        replay_cache.remember(operation, record)
    # The ``idempotency`` logger hears this signal too (idempotency/logs.py).
    signals.response_replayed.send(IdempotencyRecord, record=record, operation=operation)
    return replay(record)


def _claim(
    operation: Operation, *, one_statement: bool = True
) -> tuple[Attempt | None, IdempotencyRecord | None]:
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
        with _bounded_lock_wait(operation):
            record = _insert_or_lock(operation, token)
    return _settle_claim(operation, record, token)


def _claim_committed(operation: Operation) -> tuple[Attempt | None, IdempotencyRecord | None]:
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


def _settle_claim(
    operation: Operation, record: IdempotencyRecord, token: str
) -> tuple[Attempt | None, IdempotencyRecord | None]:
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
    raise _in_use(operation, record)


def _lease_lost(record: IdempotencyRecord) -> bool:
    """The owner's lease ran out, by the database's clock (``lease_remaining``)."""
    remaining = getattr(record, "lease_remaining", None)
    return record.status == Status.PROCESSING and remaining is not None and remaining < timedelta(0)


def _after_lost_lease(
    operation: Operation, record: IdempotencyRecord, token: str
) -> tuple[Attempt | None, IdempotencyRecord | None]:
    """Never re-run blindly: the first attempt may have had its effect. Ask the resolver."""
    from idempotency.recovery import settle  # recovery builds on core: import at use

    _, settled = settle(record, resolver_for(operation.name, operation.resolver))
    if settled.status in REPLAYABLE:
        return None, settled
    if settled.status == Status.FAILED_RETRYABLE:
        _reclaim(operation, settled, token)
        return _claimed(operation, settled, token, reclaimed=True), None
    return None, _locked(operation).get(pk=settled.pk)


def _claim_in_one_statement(operation: Operation, token: str) -> IdempotencyRecord | None:
    """PostgreSQL: insert the record, or read the committed one holding the key, in one trip.

    Returns the new record (owned by ``token``; in lease mode with its lease
    taken), or a committed record that can be answered without a lock: a
    replayable outcome, or another request under the same key. ``None`` when
    the key is held by an unfinished record (or one this statement's snapshot
    cannot see): the caller takes the locked path.

    The statement bounds its own wait on a concurrent first attempt with
    ``set_config('lock_timeout', ..., true)`` and restores the previous value
    once the row is settled, instead of two ``SET LOCAL`` round trips.
    """
    connection = transaction.get_connection(operation.database)
    if connection.vendor != "postgresql":
        return None
    candidate = _candidate(operation, token)
    lease = _lease_length(operation) if operation.mode == "lease" else None
    with _lock_timeout_as_key_in_use(operation):
        found = postgres.claim(connection, candidate, _lock_timeout_ms(operation), lease)
    if found.claimed_id is not None:
        candidate.pk = found.claimed_id
        candidate._state.adding = False
        candidate._state.db = operation.database
        candidate.lease_until = found.lease_until
        if found.created_at is not None:
            candidate.created_at = candidate.updated_at = found.created_at
        return candidate
    existing = found.existing
    if existing is None:
        return None
    if existing.status in REPLAYABLE or existing.request_hash != operation.request_hash:
        return existing  # SUCCEEDED and FAILED_FINAL never change: no lock needed to answer
    return None


def _candidate(operation: Operation, token: str) -> IdempotencyRecord:
    return IdempotencyRecord(
        scope=operation.scope,
        idem_key=operation.key,
        operation=operation.name[:255],
        request_hash=operation.request_hash,
        request_method=operation.method[:16],
        request_path=operation.path[:2048],
        status=Status.PROCESSING,
        owner_token=token,
    )


def _insert_or_lock(operation: Operation, token: str) -> IdempotencyRecord:
    records = IdempotencyRecord.objects.using(operation.database)
    candidate = _candidate(operation, token)
    # The unique constraint is the arbiter: of concurrent inserts exactly one
    # lands, the others wait for it (bounded) and then lock the winner's row.
    for _ in range(3):
        records.bulk_create([candidate], ignore_conflicts=True)
        try:
            return _locked(operation).get(scope=operation.scope, idem_key=operation.key)
        except IdempotencyRecord.DoesNotExist:
            # Purged between our insert and our lock: the key is free, insert again.
            continue
    raise KeyInUse(retry_after=idempotency_settings.RETRY_AFTER)


def _locked(operation: Operation):  # type: ignore[no-untyped-def]
    """Records locked for this transaction, with their remaining lease by the database clock."""
    return (
        IdempotencyRecord.objects.using(operation.database)
        .select_for_update()
        .annotate(
            lease_remaining=ExpressionWrapper(
                F("lease_until") - Now(), output_field=DurationField()
            ),
        )
    )


def _claimed(
    operation: Operation, record: IdempotencyRecord, token: str, *, reclaimed: bool
) -> Attempt:
    if operation.mode == "lease" and not reclaimed and record.lease_until is None:
        _owned(operation, record.pk, token).update(
            lease_until=Now() + Value(_lease_length(operation))
        )
    signals.record_claimed.send(
        IdempotencyRecord, record=record, operation=operation, reclaimed=reclaimed
    )
    return Attempt(operation=operation, record=record, owner_token=token)


def _reclaim(operation: Operation, record: IdempotencyRecord, token: str) -> None:
    lease = Now() + Value(_lease_length(operation)) if operation.mode == "lease" else None
    IdempotencyRecord.objects.using(operation.database).filter(pk=record.pk).update(
        status=Status.PROCESSING,
        owner_token=token,
        lease_until=lease,
        attempts=F("attempts") + 1,
        version=F("version") + 1,
        completed_at=None,
        expires_at=None,
        updated_at=Now(),
    )
    record.owner_token = token
    record.status = Status.PROCESSING


def _in_use(operation: Operation, record: IdempotencyRecord) -> KeyInUse:
    retry_after = idempotency_settings.RETRY_AFTER
    remaining = getattr(record, "lease_remaining", None)
    if remaining is not None and remaining > timedelta(0):
        retry_after = max(retry_after, math.ceil(remaining.total_seconds()))
    signals.key_in_use.send(IdempotencyRecord, operation=operation, retry_after=retry_after)
    return KeyInUse(retry_after=retry_after)


def _finish(attempt: Attempt, outcome: Outcome) -> None:
    operation, response = attempt.operation, outcome.response
    values: dict[str, Any] = {
        "status": outcome.status,
        "response_status": response.status if response else None,
        "response_headers": [list(pair) for pair in response.headers] if response else [],
        "response_body": response.body if response else None,
        "resource_id": (outcome.resource_id or attempt.resource_id)[:255],
    }
    connection = transaction.get_connection(operation.database)
    if connection.vendor == "postgresql":
        window = retention_for(operation.name, outcome.status)
        record, token = attempt.record, attempt.owner_token
        updated = postgres.finish(connection, record.pk, token, values, window)
    else:
        updated = _owned(operation, attempt.record.pk, attempt.owner_token).update(
            **values,
            lease_until=None,
            completed_at=Now(),
            expires_at=_expiry(operation, outcome.status),
            updated_at=Now(),
            version=F("version") + 1,
        )
    if not updated:
        raise LeaseLost()
    window = retention_for(operation.name, outcome.status)
    replay_cache.remember_outcome(operation, attempt.record.pk, outcome, window)
    signals.record_completed.send(
        IdempotencyRecord,
        record=attempt.record,
        operation=attempt.operation,
        status=outcome.status,
    )


def _release(attempt: Attempt, *, delete: bool) -> None:
    owned = _owned(attempt.operation, attempt.record.pk, attempt.owner_token)
    if delete:
        owned.delete()
        return
    released = owned.update(
        status=Status.FAILED_RETRYABLE,
        lease_until=None,
        expires_at=_expiry(attempt.operation, Status.FAILED_RETRYABLE),
        updated_at=Now(),
        version=F("version") + 1,
    )
    if released:
        signals.record_completed.send(
            IdempotencyRecord,
            record=attempt.record,
            operation=attempt.operation,
            status=Status.FAILED_RETRYABLE,
        )


def _owned(operation: Operation, pk: int, token: str):  # type: ignore[no-untyped-def]
    """The record, only while this attempt still holds it (fencing)."""
    return IdempotencyRecord.objects.using(operation.database).filter(
        pk=pk, owner_token=token, status=Status.PROCESSING
    )


def _lease_length(operation: Operation, seconds: float | None = None) -> timedelta:
    length = seconds or operation.lease_seconds or idempotency_settings.LEASE_SECONDS
    return timedelta(seconds=length)


def _expiry(operation: Operation, status: str):  # type: ignore[no-untyped-def]
    window = retention_for(operation.name, status)
    return None if window is None else Now() + Value(window)


def retention_for(operation_name: str, status: str) -> timedelta | None:
    """How long a record in ``status`` is kept; ``None`` means until an operator acts."""
    overrides = idempotency_settings.OPERATION_RETENTION.get(operation_name, {})
    seconds = overrides.get(status, idempotency_settings.RETENTION.get(status))
    return None if seconds is None else timedelta(seconds=float(seconds))


@contextmanager
def _bounded_lock_wait(operation: Operation) -> Iterator[None]:
    """Bound how long a duplicate waits on the first attempt's row; past it, 409.

    The caller's own ``lock_timeout`` is put back afterwards: the work runs under it.
    """
    connection = transaction.get_connection(operation.database)
    previous = None
    if connection.vendor == "postgresql":
        previous = postgres.set_lock_timeout(connection, _lock_timeout_ms(operation))
    with _lock_timeout_as_key_in_use(operation):
        yield
    if previous is not None:
        postgres.set_lock_timeout(connection, previous)


@contextmanager
def _lock_timeout_as_key_in_use(operation: Operation) -> Iterator[None]:
    try:
        yield
    except OperationalError as exc:
        if _is_lock_timeout(exc):
            retry_after = idempotency_settings.RETRY_AFTER
            signals.key_in_use.send(IdempotencyRecord, operation=operation, retry_after=retry_after)
            raise KeyInUse(retry_after=retry_after) from exc
        raise


def _lock_timeout_ms(operation: Operation) -> str:
    seconds = (
        operation.lock_timeout
        if operation.lock_timeout is not None
        else idempotency_settings.LOCK_TIMEOUT
    )
    return f"{max(1, int(seconds * 1000))}ms"


def _is_lock_timeout(exc: OperationalError) -> bool:
    cause = exc.__cause__
    state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return state == _LOCK_NOT_AVAILABLE or "database is locked" in str(exc)
