"""The idempotency protocol: claim a record, run the work once, store its outcome.

``execute`` takes a complete ``Operation`` from an adapter and calls back only for
the work and for the decision on its result. It knows nothing of HTTP, nor of which
database holds the records: it decides, and the alias's store (``idempotency.stores``)
runs the statements.

Atomic mode: one transaction holds the claim, the work's writes and the finish;
what is not recorded did not happen. Lease mode: a committed claim, the work outside
any transaction of ours, and a finish (or release) fenced by the owner token. A
repeat of a recorded outcome is answered from it, read before any transaction when
repeats are frequent (``READ_FIRST``), or from the replay cache.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.core import mail
from django.db import DatabaseError, connections, transaction
from django.db import Error as DjangoDatabaseError

from idempotency import replay_cache, signals
from idempotency.conf import idempotency_settings, retention_for
from idempotency.exceptions import (
    CrossDatabaseWrite,
    DatabaseUnavailable,
    IdempotencyError,
    KeyReused,
    KeyUnderReview,
    LeaseLost,
    OutcomeUnknown,
)
from idempotency.models import REPLAYABLE, IdempotencyRecord, Status
from idempotency.outcomes import Outcome
from idempotency.protocol.claim import (
    CLAIM_RETRIES,
    Claimed,
    ClaimGivenUp,
    ContentionAnswered,
    InFlightHere,
    busy,
    candidate_of,
    claim,
    claim_committed,
    in_use,
    record_duration,
    waiters,
)
from idempotency.protocol.operation import Attempt, Operation, new_owner_token
from idempotency.settings_checks import validate_settings
from idempotency.steps import running_attempt
from idempotency.stores import Candidate, Found
from idempotency.stores.errors import is_outage
from idempotency.unmigrated import not_migrated

T = TypeVar("T")
Work = Callable[[Attempt], T]
Decide = Callable[[T, Attempt], "Outcome | None"]
Replay = Callable[[IdempotencyRecord], T]


def execute(operation: Operation, work: Work[T], *, decide: Decide[T], replay: Replay[T]) -> T:
    """Run ``work`` at most once for ``operation`` and answer repeats with ``replay``.

    ``decide`` turns the work's result into the outcome to record, or ``None``
    to record nothing (the business writes roll back, the key stays free).
    A database that fails under it raises ``DatabaseUnavailable``, or
    ``OutcomeUnknown`` when the connection was lost at the ``COMMIT`` of the outcome
    (it may have landed): either way the same call may be retried, with the same key.
    A records table not migrated
    raises ``ImproperlyConfigured``, which no retry mends.
    """
    if not idempotency_settings.validated:
        validate_settings()
    try:
        if idempotency_settings.REPLAY_CACHE is not None:
            cached = replay_cache.lookup(operation)
            if cached is not None:
                return _replay(operation, cached, replay, from_cache=True)
        if operation.mode == "lease":
            return _execute_leased(operation, work, decide, replay)
        final = _read_first(operation)
        if final is not None:
            return _replay(operation, final, replay)
        if operation.writes_once:
            return _execute_written_once(operation, work, decide, replay)
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
    error: Exception,
    operation: Operation | None = None,
    *,
    kind: type[DatabaseUnavailable] = DatabaseUnavailable,
) -> DatabaseUnavailable:
    """``error`` (an outage) as the protocol's error, once: connections cleaned, signal sent.

    ``kind`` is ``OutcomeUnknown`` where the connection was lost at the ``COMMIT``
    of an outcome, which may have landed.

    A connection the failure broke is closed (Django's own end-of-request check,
    ``close_if_unusable_or_obsolete``, run now), so that what runs next in this
    thread, and the next request, connect afresh. Connections inside a
    transaction are left to it: rolling back is the transaction's owner's job.
    """
    if isinstance(error, DatabaseUnavailable):
        return error
    _close_broken_connections()
    unavailable = kind(retry_after=idempotency_settings.RETRY_AFTER)
    # The ``idempotency`` logger hears this signal (idempotency/logs.py): one record per outage.
    signals.database_unavailable.send(
        IdempotencyRecord, operation=operation, error=error, retry_after=unavailable.retry_after
    )
    return unavailable


def _close_broken_connections() -> None:
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


def _work(work: Work[T], attempt: Attempt) -> T:
    token = running_attempt.set(attempt)
    try:
        return work(attempt)
    finally:
        running_attempt.reset(token)


# --- atomic mode -------------------------------------------------------------------------


def _execute_atomic(operation: Operation, work: Work[T], decide: Decide[T], replay: Replay[T]) -> T:
    for tries_left in range(CLAIM_RETRIES, -1, -1):
        try:
            ran, result = _atomic_attempt(operation, work, decide)
            break
        except ClaimGivenUp as exc:
            # Only a transaction of our own can be tried again: inside the caller's,
            # what the database rolled back is the caller's to handle, so that is a 409.
            if not tries_left or transaction.get_connection(operation.database).in_atomic_block:
                raise busy(operation) from exc
        except InFlightHere as held:
            raise _held(operation, held.found) from None
        except LostRace as lost:
            return _replay_winner(operation, replay, lost)
    if ran:
        return result  # type: ignore[return-value]
    # After the commit: what recovery wrote while claiming must stay even if this is a 409.
    return _answer(operation, result, replay)


def _atomic_attempt(operation: Operation, work: Work[T], decide: Decide[T]) -> tuple[bool, Any]:
    """One transaction: the claim, the work and its outcome, or the record to replay."""
    with (
        AttemptEnd(operation) as end,
        transaction.atomic(using=operation.database),
        operation.store.statements(),
        writes_only_to(operation.database),
    ):
        attempt, existing = claim(operation)
        if attempt is None:
            return False, existing
        end.claimed = True
        replay_share.seen(operation.name, replayed=False)
        value = _work(work, attempt)
        outcome = decide(value, attempt)
        if outcome is None:
            # Nothing recorded, nothing happened: the business writes go too.
            transaction.set_rollback(True, using=operation.database)
        else:
            _finish(attempt, outcome)
            end.committing = True
        return True, value


class LostRace(Exception):
    """The database rolled an attempt back after its claim, in a conflict (see ``AttemptEnd``)."""


class AttemptEnd:
    """What an outermost attempt transaction's failure after the claim means, at its end.

    Two endings an error alone would answer as an outage, "the database is
    unavailable":

    - The connection is lost at ``COMMIT`` (a primary that dies, a failover):
      the database may have committed and lost only the acknowledgement. The
      outcome is unknown, ``OutcomeUnknown``; never "nothing was recorded".
    - The database gives the transaction up after the claim, at ``COMMIT`` or at
      a statement before it (``contention`` "retry"): on a multi-primary cluster
      (Galera) a duplicate on another node certified first (1213 at ``COMMIT``),
      or its write set, applied here, aborted this one (1213 at the next
      statement). Everything the attempt wrote rolled back: a duplicate that
      lost, ``LostRace``, answered with the winner's outcome.

    Inside the caller's transaction neither is ours to judge: nothing is committed here.
    A class, not ``@contextmanager``: it wraps every atomic attempt.
    """

    def __init__(self, operation: Operation) -> None:
        self.operation = operation
        self.claimed = self.committing = False
        self.outermost = False

    def __enter__(self) -> AttemptEnd:
        connection = transaction.get_connection(self.operation.database)
        self.outermost = not connection.in_atomic_block
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: Any
    ) -> None:
        if not (self.outermost and self.claimed and isinstance(error, DjangoDatabaseError)):
            return
        if isinstance(error, IdempotencyError):
            return
        if isinstance(error, DatabaseError) and self.operation.store.contention(error) == "retry":
            raise LostRace() from error
        if self.committing and is_outage(error):
            raise database_unavailable(error, self.operation, kind=OutcomeUnknown) from error


def _replay_winner(operation: Operation, replay: Replay[T], lost: LostRace) -> T:
    """An attempt the database rolled back in a conflict: the duplicate that won, replayed.

    Read in a transaction of its own, after the rollback (on Galera, waiting until
    this node has applied what the cluster committed: ``wsrep_sync_wait``). With
    no outcome under the key, the conflict was not with a duplicate: the error
    is answered as it was raised.
    """
    held = _winner(operation)
    if held is None:
        error = lost.__cause__
        assert isinstance(error, Exception)
        raise database_unavailable(error, operation) from error
    return _replay(operation, held, replay)


def _winner(operation: Operation) -> IdempotencyRecord | None:
    """The final record another attempt committed under the key, if it was this request's."""
    held = operation.store.read_final(operation.scope, operation.key)
    if held is not None and held.request_hash != operation.request_hash:
        signals.key_reused.send(IdempotencyRecord, record=held, operation=operation)
        raise KeyReused()
    return held


# --- atomic mode, the record written once ---------------------------------------------------


def _execute_written_once(
    operation: Operation, work: Work[T], decide: Decide[T], replay: Replay[T]
) -> T:
    """IN_FLIGHT "run": the work first, then its finished record inserted, in one transaction.

    The unique index decides as it does for a claim: a concurrent duplicate's
    insert waits on the first's uncommitted entry and, once the first commits,
    fails; its transaction (its work's writes with it) rolls back and it answers
    with the first's outcome. If the first rolls back, the duplicate's insert
    lands. A key held by a record that is not a live outcome (in flight in another
    mode, retryable, expired) takes the claim's path, which decides those.
    """
    token = new_owner_token()
    new = candidate_of(operation, token)
    attempt = Attempt(operation=operation, record=operation.store.unsaved(new), owner_token=token)
    database = operation.database
    try:
        with (
            AttemptEnd(operation) as end,
            transaction.atomic(using=database),
            operation.store.statements(),
            writes_only_to(database),
        ):
            end.claimed = True  # the work runs first: a conflict anywhere is a lost race
            value = _work(work, attempt)
            outcome = decide(value, attempt)
            if outcome is None:
                # Nothing recorded, nothing happened.
                transaction.set_rollback(True, using=database)
                replay_share.seen(operation.name, replayed=False)
                return value
            if _insert_finished(attempt, new, outcome):
                end.committing = True
                # Counted once it is known to be a first request: a repeat that ran the work
                # and lost at the insert counts as the replay it is (below), not as both,
                # or READ_FIRST "auto" would take twice as many repeats to start reading first.
                replay_share.seen(operation.name, replayed=False)
                return value
            # Another attempt's outcome holds the key.
            transaction.set_rollback(True, using=database)
    except LostRace:
        pass  # rolled back, as a duplicate's insert that lost: what holds the key decides
    held = _winner(operation)
    if held is None:
        return _execute_atomic(operation, work, decide, replay)
    return _replay(operation, held, replay)


def _insert_finished(attempt: Attempt, new: Candidate, outcome: Outcome) -> bool:
    """The "claim" and the "finish" in one insert: whether it landed."""
    operation = attempt.operation
    values = attempt.columns(outcome)
    window = retention_for(operation.name, outcome.status)
    try:
        with ContentionAnswered(operation):
            record = operation.store.insert_finished(
                new, values, window, lock_timeout=operation.lock_wait
            )
    except ClaimGivenUp:
        return False  # a deadlock's victim: what holds the key is read afterwards
    if record is None:
        return False
    attempt.record = record
    signals.record_claimed.send(
        IdempotencyRecord, record=record, operation=operation, reclaimed=False, replaced=False
    )
    _recorded(attempt, outcome, values, window)
    return True


# --- an atomic attempt writes to one database ---------------------------------------------
#
# An atomic-mode attempt writes to one database: the one that holds its record.
#
# The claim, the business writes and the recorded outcome commit together only
# when they are in one transaction, so on one database. A view that writes to
# another alias (a tenant's database the router did not pick for the record, a
# second database of its own) commits that write on its own: a retry after a
# crash runs it again, and the guarantee is silently gone. While an attempt
# runs, every other alias of the request's thread refuses writes with
# ``CrossDatabaseWrite``, which says what to set. It is on under ``DEBUG`` and
# Django's test environment (``WRITE_GUARD = None``), always with ``True``,
# never with ``False``: each statement on the other aliases is looked at.
_WRITE = re.compile(r"\s*(?:INSERT|UPDATE|DELETE|MERGE|REPLACE|TRUNCATE|COPY)\b", re.IGNORECASE)


def writes_only_to(database: str) -> AbstractContextManager[None]:
    """While the attempt runs, refuse writes on every alias but ``database`` (when guarded)."""
    if len(connections.settings) < 2 or not _guarded():
        return nullcontext()
    return _refuse_others(database)


@contextmanager
def _refuse_others(database: str) -> Iterator[None]:
    with ExitStack() as stack:
        for alias in connections:
            if alias != database:
                stack.enter_context(connections[alias].execute_wrapper(_refusal(alias, database)))
        yield


def _refusal(alias: str, database: str) -> Callable[..., Any]:
    def refuse(execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any) -> Any:
        if isinstance(sql, str) and _WRITE.match(sql):
            raise CrossDatabaseWrite(
                f"An atomic-mode idempotent attempt whose record is on database {database!r} "
                f"wrote to {alias!r}: that write would commit on its own, outside the "
                f"attempt's transaction, and run again on a retry. Put the record where the "
                f"writes go: route IdempotencyRecord like the view's models (the router's "
                f"db_for_write), or pass using={alias!r} to the view's protection "
                f"(@idempotent(using=...), Operation(using=...)), or IDEMPOTENCY['DATABASE']; "
                f"or use mode='lease'. IDEMPOTENCY['WRITE_GUARD'] = False turns this check off."
            )
        return execute(sql, params, many, context)

    return refuse


def _guarded() -> bool:
    chosen = idempotency_settings.WRITE_GUARD
    if chosen is not None:
        return chosen
    return bool(settings.DEBUG) or _testing()


def _testing() -> bool:
    """Django's test environment is set up (its runner, pytest-django): DEBUG is off there.

    ``setup_test_environment`` installs the locmem outbox, ``django.core.mail.outbox``
    (documented in Django's testing tools); nothing else marks it publicly.
    """
    return hasattr(mail, "outbox")


# --- lease mode --------------------------------------------------------------------------


def _execute_leased(operation: Operation, work: Work[T], decide: Decide[T], replay: Replay[T]) -> T:
    attempt, existing = _claim_or_wait(operation)
    if attempt is None:
        return _answer(operation, existing, replay)
    replay_share.seen(operation.name, replayed=False)
    try:
        value = _work(work, attempt)
        outcome = decide(value, attempt)
    except BaseException as exc:
        # The work may have had effects outside any transaction we control:
        # keep the record, bound to this request, for a retry of the same request.
        if is_outage(exc):
            # Released over a fresh connection if the database is back; if it is
            # not, the record stays claimable once its lease runs out.
            _close_broken_connections()
        _release(attempt, delete=False)
        raise
    if outcome is None:
        _release(attempt, delete=True)
        return value
    try:
        _finish(attempt, outcome)
    except DjangoDatabaseError as exc:
        # The work has run; the finish is one statement that commits by itself, and
        # whether it did when the connection was lost nobody knows here.
        if is_outage(exc) and not isinstance(exc, IdempotencyError):
            raise database_unavailable(exc, operation, kind=OutcomeUnknown) from exc
        raise
    return value


def _claim_or_wait(operation: Operation) -> Claimed:
    """Lease mode: claim; a duplicate of a live attempt may first wait for its outcome.

    Woken when the record may have changed, it claims again: that replays the
    outcome, re-claims a released key (one waiter wins, the others wait on for
    its outcome) or finds the attempt still running. Bounded by ``wait_for``
    and by ``MAX_WAITERS`` per process; never inside a transaction.
    """
    try:
        return _claim_committed(operation)
    except InFlightHere as held:
        found = held.found
    connection = transaction.get_connection(operation.database)
    if operation.wait_for <= 0 or connection.in_atomic_block or _under_review(found):
        raise _held(operation, found)
    deadline = time.monotonic() + operation.wait_for
    with waiters.admitted() as admitted:
        while admitted and (left := deadline - time.monotonic()) > 0:
            operation.store.wait_for_outcome(operation.scope, operation.key, left)
            try:
                return _claim_committed(operation)
            except InFlightHere as held:
                found = held.found
    raise _held(operation, found)


def _claim_committed(operation: Operation) -> Claimed:
    """``claim_committed``, again in a new transaction when the database gave one up."""
    for tries_left in range(CLAIM_RETRIES, -1, -1):
        try:
            return claim_committed(operation)
        except ClaimGivenUp as exc:
            if not tries_left or transaction.get_connection(operation.database).in_atomic_block:
                raise busy(operation) from exc
        except DatabaseError as exc:
            # The claim's own COMMIT given up: on Galera, a duplicate's claim on another
            # node certified first (1213). The next claim finds it, as a duplicate does.
            if isinstance(exc, IdempotencyError) or operation.store.contention(exc) != "retry":
                raise
            if not tries_left or transaction.get_connection(operation.database).in_atomic_block:
                raise busy(operation) from exc
    raise AssertionError("unreachable")  # pragma: no cover


# --- the end of an attempt -----------------------------------------------------------------


def _finish(attempt: Attempt, outcome: Outcome) -> None:
    """Store the outcome ("finish"), fenced by the owner token: a lost lease stores nothing."""
    operation = attempt.operation
    values = attempt.columns(outcome)
    window = retention_for(operation.name, outcome.status)
    if not operation.store.finish(attempt.record.pk, attempt.owner_token, values, window):
        raise LeaseLost()
    _recorded(attempt, outcome, values, window)


def _recorded(
    attempt: Attempt, outcome: Outcome, values: dict[str, Any], window: timedelta | None
) -> None:
    """What follows an outcome stored: the replay cache, durations, waiters, the signal."""
    operation = attempt.operation
    if idempotency_settings.REPLAY_CACHE is not None:
        replay_cache.remember_outcome(operation, attempt.record.pk, values, window, attempt.started)
    if operation.mode == "lease":
        record_duration(operation.name, time.monotonic() - attempt.started)
        _wake_waiters(operation)
    _completed(attempt, outcome.status)


def _release(attempt: Attempt, *, delete: bool) -> None:
    """Give the key back: ``delete`` the record ("discard": nothing happened), or
    leave it ``FAILED_RETRYABLE`` ("release"), for a retry of the same request."""
    store, pk, token = attempt.operation.store, attempt.record.pk, attempt.owner_token
    if delete:
        if store.discard(pk, token):
            _wake_waiters(attempt.operation)
        return
    window = retention_for(attempt.operation.name, Status.FAILED_RETRYABLE)
    if store.release(pk, token, window):
        _wake_waiters(attempt.operation)
        _completed(attempt, Status.FAILED_RETRYABLE)


def _completed(attempt: Attempt, status: Status) -> None:
    signals.record_completed.send(
        IdempotencyRecord, record=attempt.record, operation=attempt.operation, status=status
    )


def _wake_waiters(operation: Operation) -> None:
    """Wake the duplicates waiting for this key's outcome, if any may wait."""
    if operation.wait_for > 0:
        operation.store.notify_waiters(operation.scope, operation.key)


# --- repeats -------------------------------------------------------------------------------


def _answer(operation: Operation, found: Found | None, replay: Replay[T]) -> T:
    """What the claim found instead of a key to run: a recorded outcome, or no outcome yet."""
    assert found is not None
    if found.record.status not in REPLAYABLE:
        raise _held(operation, found, unresolved=True)  # a lost lease, outcome unknown
    return _replay(operation, found.record, replay)


def _replay(
    operation: Operation, record: IdempotencyRecord, replay: Replay[T], *, from_cache: bool = False
) -> T:
    """Answer ``record``'s outcome (``REPLAYABLE``) without running the work."""
    replay_share.seen(operation.name, replayed=True)
    if not from_cache and idempotency_settings.REPLAY_CACHE is not None:
        replay_cache.remember(operation, record)
    # The ``idempotency`` logger hears this signal too (idempotency/logs.py).
    signals.response_replayed.send(IdempotencyRecord, record=record, operation=operation)
    return replay(record)


def _held(operation: Operation, found: Found, *, unresolved: bool = False) -> IdempotencyError:
    """The answer to a key whose record has no outcome to replay.

    In use while an attempt holds it (or the resolver is asked again once its pause
    ends); under review once it waits for an operator, which no wait of a client's
    shortens: a 409 of its own, without ``Retry-After``.
    """
    if _under_review(found):
        signals.key_under_review.send(IdempotencyRecord, record=found.record, operation=operation)
        return KeyUnderReview()
    return in_use(operation, found, unresolved=unresolved)


def _under_review(found: Found) -> bool:
    return found.record.status == Status.NEEDS_REVIEW


class ReplayShare:
    """The share of replays among an operation's requests, in this process (READ_FIRST "auto").

    An exponentially weighted mean over about the last ``1 / WEIGHT`` requests
    of each operation. Reading first pays once replays are about a third of
    the requests (``THRESHOLD``); below that first requests pay nothing.
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

    Saves a replay the claim's transaction (``BEGIN``, the claim, ``COMMIT``)
    and costs a first request one read more; ``ReplayShare`` tells, per
    operation, when that pays ("auto"). Only a ``SUCCEEDED`` or ``FAILED_FINAL``
    record (they never change) whose request hash matches is answered from the
    read; anything else takes the claim's path as without it, so the unique
    constraint and the row lock still decide every first request and conflict.
    """
    policy = idempotency_settings.READ_FIRST
    if policy == "never" or (policy == "auto" and not replay_share.high(operation.name)):
        return None
    record = operation.store.read_final(operation.scope, operation.key)
    if record is None or record.request_hash != operation.request_hash:
        return None
    return record
