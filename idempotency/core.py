"""The idempotency protocol: claim a record, run the work once, store its outcome.

This module knows nothing of HTTP, nor of which database holds the records:
it decides, and the alias's store (``idempotency.stores``) runs the
statements. ``execute`` is generic over what the work returns; the adapters
tell it how to turn that into an ``Outcome`` and how to rebuild it from a
stored record. Its parts: ``operation`` (the types), ``claim``,
``contention`` (a key held by another attempt), ``finish`` (store or release)
and ``read_first``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import Error as DjangoDatabaseError
from django.db import connections, transaction

from idempotency import replay_cache, signals, waiting
from idempotency.claim import Claimed, claim, claim_committed
from idempotency.conf import IN_FLIGHT, MODES, InFlight, Mode, idempotency_settings
from idempotency.contention import CLAIM_RETRIES, InFlightHere, in_use, retried
from idempotency.exceptions import DatabaseUnavailable, IdempotencyError
from idempotency.finish import finish, release
from idempotency.models import REPLAYABLE, IdempotencyRecord
from idempotency.operation import Attempt, Operation, bounded_scope
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.read_first import ReplayShare, read_first, replay_share
from idempotency.settings_checks import validate_settings
from idempotency.stores.errors import is_outage
from idempotency.unmigrated import not_migrated
from idempotency.write_guard import writes_only_to

logger = logging.getLogger("idempotency")

T = TypeVar("T")
Work = Callable[[Attempt], T]
Decide = Callable[[T, Attempt], "Outcome | None"]
Replay = Callable[[IdempotencyRecord], T]

# The protocol's names, importable from here whichever part defines them.
__all__ = [
    "CLAIM_RETRIES",
    "IN_FLIGHT",
    "MODES",
    "Attempt",
    "InFlight",
    "Mode",
    "Operation",
    "Outcome",
    "ReplayShare",
    "StoredResponse",
    "bounded_scope",
    "database_unavailable",
    "execute",
    "replay_share",
]


def execute(operation: Operation, work: Work[T], *, decide: Decide[T], replay: Replay[T]) -> T:
    """Run ``work`` at most once for ``operation`` and answer repeats with ``replay``.

    ``decide`` turns the work's result into the outcome to record, or ``None``
    to record nothing (the business writes roll back, the key stays free).
    A database that fails under it raises ``DatabaseUnavailable``: nothing was
    recorded, and the same call may be retried. A records table not migrated
    raises ``ImproperlyConfigured``, which no retry mends.
    """
    validate_settings()
    try:
        cached = replay_cache.lookup(operation)  # None unless REPLAY_CACHE is set and holds it
        if cached is not None:
            return _replay(operation, cached, replay, from_cache=True)
        if operation.mode == "lease":
            return _execute_leased(operation, work, decide, replay)
        final = read_first(operation)
        if final is not None:
            return _replay(operation, final, replay)
        return _execute_atomic(operation, work, decide, replay)
    except DjangoDatabaseError as exc:  # InterfaceError too, which is no DatabaseError
        if isinstance(exc, IdempotencyError):
            raise
        if is_outage(exc):
            raise database_unavailable(exc, operation) from exc
        unmigrated = not_migrated(exc, operation.database)  # a 500 that says what to run
        if unmigrated is not None:
            raise unmigrated from exc
        raise


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


def _execute_atomic(operation: Operation, work: Work[T], decide: Decide[T], replay: Replay[T]) -> T:
    def run() -> tuple[bool, T | IdempotencyRecord | None]:
        with (
            transaction.atomic(using=operation.database),
            operation.store.statements(),
            writes_only_to(operation.database),
        ):
            attempt, existing = claim(operation)
            if attempt is None:
                return False, existing
            value = work(attempt)
            outcome = decide(value, attempt)
            if outcome is None:
                # Nothing recorded, nothing happened: the business writes go too.
                transaction.set_rollback(True, using=operation.database)
            else:
                finish(attempt, outcome)
            return True, value

    try:
        ran, result = retried(operation, run)
    except InFlightHere as busy:
        raise in_use(operation, busy.record) from None
    if ran:
        return result  # type: ignore[return-value]
    # After the commit: what recovery wrote while claiming must stay even if this is a 409.
    return _replay(operation, result, replay)  # type: ignore[arg-type]


def _execute_leased(operation: Operation, work: Work[T], decide: Decide[T], replay: Replay[T]) -> T:
    attempt, existing = _claim_or_wait(operation)
    if attempt is None:
        return _replay(operation, existing, replay)
    try:
        value = work(attempt)
        outcome = decide(value, attempt)
    except BaseException as exc:
        # The work may have had effects outside any transaction we control:
        # keep the record, bound to this request, for a retry of the same request.
        if is_outage(exc):
            # Released over a fresh connection if the database is back; if it is
            # not, the record stays claimable once its lease runs out.
            _close_broken_connections()
        release(attempt, delete=False)
        raise
    if outcome is None:
        release(attempt, delete=True)
    else:
        finish(attempt, outcome)
    return value


def _claim_or_wait(operation: Operation) -> Claimed:
    """Lease mode: claim; a duplicate of a live attempt may first wait for its outcome.

    Woken when the record may have changed, it claims again: that replays the
    outcome, re-claims a released key (one waiter wins, the others wait on for
    its outcome) or finds the attempt still running. Bounded by ``wait_for``
    and by ``MAX_WAITERS`` per process; never inside a transaction.
    """
    try:
        return retried(operation, lambda: claim_committed(operation))
    except InFlightHere as busy:
        in_flight = busy.record
    connection = transaction.get_connection(operation.database)
    if operation.wait_for <= 0 or connection.in_atomic_block:
        raise in_use(operation, in_flight)
    deadline = time.monotonic() + operation.wait_for
    with waiting.waiters.admitted() as admitted:
        while admitted and (left := deadline - time.monotonic()) > 0:
            operation.store.wait_for_outcome(operation.scope, operation.key, left)
            try:
                return retried(operation, lambda: claim_committed(operation))
            except InFlightHere as busy:
                in_flight = busy.record
    raise in_use(operation, in_flight)


def _replay(
    operation: Operation,
    record: IdempotencyRecord | None,
    replay: Replay[T],
    *,
    from_cache: bool = False,
) -> T:
    assert record is not None
    if record.status not in REPLAYABLE:
        raise in_use(operation, record, unresolved=True)  # a lost lease, outcome unknown
    replay_share.seen(operation.name, replayed=True)
    if not from_cache:
        replay_cache.remember(operation, record)
    # The ``idempotency`` logger hears this signal too (idempotency/logs.py).
    signals.response_replayed.send(IdempotencyRecord, record=record, operation=operation)
    return replay(record)
