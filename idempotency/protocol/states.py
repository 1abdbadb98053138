"""The record's state machine: every move a record can make, in one table, and the
moves made outside an attempt (recovery's and an operator's).

A move names who makes it (a request claiming the key, the attempt that owns the
record, recovery, an operator, the purge), the states it leaves and reaches, and the
guard the database enforces for it. ``ABSENT`` stands for "no row": a claim creates
the row, a discard or a purge deletes it. Nothing moves a record but these moves, and
each names (``runs``) the one place its write is: a request's moves are the claim's and
the store's (``Store.finish`` is the finish); recovery's and operators' are
``recover``, ``postpone`` and ``transition`` below, which refuse what the table does
not allow.
``docs/concepts.md`` draws this table and ``model/protocol.pml`` model-checks it;
tests compare both with it.

Every move made outside an attempt is the store's conditional write on the state and
version the caller saw (``Store.settle``, ``Store.postpone``: optimistic, fenced): if
anything changed the record meanwhile, nothing is written and ``TransitionNotAllowed``
says so. A new owner token fences off the previous owner, whose late finish then lands
nowhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from idempotency import replay_cache, signals
from idempotency.conf import idempotency_settings, retention_for
from idempotency.exceptions import TransitionNotAllowed
from idempotency.models import PURGEABLE, IdempotencyRecord, Status
from idempotency.outcomes import Recovered, StoredResponse
from idempotency.protocol.operation import new_owner_token, response_columns
from idempotency.resolvers import Resolution, Resolver, ask
from idempotency.stores import records_database, store_for

ABSENT = "ABSENT"

PROCESSING = Status.PROCESSING.value
SUCCEEDED = Status.SUCCEEDED.value
FAILED_RETRYABLE = Status.FAILED_RETRYABLE.value
FAILED_FINAL = Status.FAILED_FINAL.value
NEEDS_REVIEW = Status.NEEDS_REVIEW.value

STATES = (ABSENT, PROCESSING, SUCCEEDED, FAILED_RETRYABLE, FAILED_FINAL, NEEDS_REVIEW)


@dataclass(frozen=True)
class Move:
    name: str
    actor: str
    sources: frozenset[str]
    targets: frozenset[str]
    guard: str
    # What makes the move: the one place its write is (a dotted path).
    runs: str


def _move(
    name: str, actor: str, sources: set[str], targets: set[str], guard: str, runs: str
) -> Move:
    return Move(name, actor, frozenset(sources), frozenset(targets), guard, runs)


_STORE = "idempotency.stores.base.Store."


MOVES: dict[str, Move] = {
    move.name: move
    for move in (
        _move(
            "claim",
            "request",
            {ABSENT},
            {PROCESSING},
            "the unique (scope, idem_key) index",
            "idempotency.protocol.claim.claim",
        ),
        _move(
            "write_once",
            "request",
            {ABSENT},
            {SUCCEEDED, FAILED_FINAL},
            "the unique (scope, idem_key) index, waited on; in the work's transaction "
            "(IN_FLIGHT run, atomic mode)",
            _STORE + "insert_finished",
        ),
        _move(
            "retry",
            "request",
            {FAILED_RETRYABLE},
            {PROCESSING},
            "row lock; same request hash; a new owner token",
            _STORE + "reclaim",
        ),
        _move(
            "replace",
            "request",
            set(PURGEABLE),
            {PROCESSING},
            "row lock; expires_at passed (by the database's clock); a new owner token",
            _STORE + "reclaim",
        ),
        _move(
            "renew",
            "owner",
            {PROCESSING},
            {PROCESSING},
            "owner token (lease mode)",
            _STORE + "renew",
        ),
        _move(
            "finish",
            "owner",
            {PROCESSING},
            {SUCCEEDED, FAILED_FINAL},
            "owner token",
            _STORE + "finish",
        ),
        _move(
            "release",
            "owner",
            {PROCESSING},
            {FAILED_RETRYABLE},
            "owner token (lease mode)",
            _STORE + "release",
        ),
        _move(
            "discard",
            "owner",
            {PROCESSING},
            {ABSENT},
            "owner token (lease mode)",
            _STORE + "discard",
        ),
        _move(
            "recover",
            "recovery",
            {PROCESSING},
            {SUCCEEDED, FAILED_RETRYABLE, NEEDS_REVIEW},
            "row lock; lease expired; version; a new owner token fences the old owner",
            _STORE + "settle",
        ),
        _move(
            "postpone",
            "recovery",
            {PROCESSING},
            {PROCESSING},
            "row lock; lease expired; version; the owner token is kept",
            _STORE + "postpone",
        ),
        _move(
            "resolve",
            "operator",
            {PROCESSING, NEEDS_REVIEW},
            {SUCCEEDED, FAILED_RETRYABLE, FAILED_FINAL},
            "version; a PROCESSING record only once its lease expired; a new owner token",
            _STORE + "settle",
        ),
        _move(
            "purge",
            "purge",
            set(PURGEABLE),
            {ABSENT},
            "expires_at passed; skips locked rows",
            _STORE + "delete_batch",
        ),
    )
}


def allowed(move: str, source: str, target: str) -> bool:
    """``move`` takes a record from ``source`` to ``target`` in the table."""
    entry = MOVES[move]
    return source in entry.sources and target in entry.targets


def transition(
    record: IdempotencyRecord,
    target: Status,
    *,
    resource_id: str | None = None,
    response: StoredResponse | None = None,
    using: str | None = None,
    move: str = "resolve",
    recovery_attempt: bool = False,
) -> IdempotencyRecord:
    """Make ``move`` (an operator's ``resolve``, recovery's ``recover``) to ``target``.

    Refused unless the table allows it from the record's state and nobody changed
    the record since it was read. A ``PROCESSING`` record can only be moved once
    its lease has expired (judged by the database clock): a live owner is never
    overtaken.
    """
    if not allowed(move, record.status, target):
        raise TransitionNotAllowed(f"A {record.status} record cannot become {target}.")
    columns = {} if response is None else response_columns(response)
    if resource_id is not None:
        columns["resource_id"] = resource_id[:255]
    database = records_database(using, record=record)
    moved = store_for(database).settle(
        record,
        target,
        new_owner_token(),
        expires_in=None if target == NEEDS_REVIEW else retention_for(record.operation, target),
        columns=columns,
        recovered=recovery_attempt,
    )
    if moved is None:
        raise _changed()
    # Nothing caches the states a transition leaves; the tombstone keeps it so.
    replay_cache.forget_records([moved], database)
    return moved


def can_transition(record: IdempotencyRecord, target: str, move: str = "resolve") -> bool:
    return allowed(move, record.status, target)


def postpone(
    record: IdempotencyRecord, seconds: float, *, using: str | None = None
) -> IdempotencyRecord:
    """Keep an expired ``PROCESSING`` record as it is for ``seconds`` more (outcome unknown).

    The owner token is kept: if the first attempt is merely slow, it can still
    finish. The record counts one more recovery attempt.
    """
    if not allowed("postpone", record.status, PROCESSING):
        raise TransitionNotAllowed(
            f"Only a PROCESSING record can be postponed, not {record.status}."
        )
    store = store_for(records_database(using, record=record))
    moved = store.postpone(record, timedelta(seconds=seconds))
    if moved is None:
        raise _changed()
    return moved


def _changed() -> TransitionNotAllowed:
    return TransitionNotAllowed(
        "The record changed meanwhile (or its lease is still live); reload it and retry."
    )


def recover(
    record: IdempotencyRecord, resolver: Resolver | None
) -> tuple[Recovered, IdempotencyRecord]:
    """Ask ``resolver`` what became of ``record``'s effect and move it by the answer.

    ``record`` is a ``PROCESSING`` record whose lease ran out (recovery's move,
    ``recover`` or ``postpone``) or one under review (an operator asking again,
    ``resolve``), locked by the caller. A lost lease is never re-run blindly: the
    first attempt may have had its effect. Returns what happened and the record
    as it is now.
    """
    resolution = ask(resolver, record) if resolver is not None else None
    outcome = recovery_outcome(record, resolution)
    updated = _recovered(record, outcome, resolution)
    signals.record_recovered.send(
        IdempotencyRecord, record=updated, operation=record.operation, outcome=outcome
    )
    return outcome, updated


def recovery_outcome(record: IdempotencyRecord, resolution: Resolution | None) -> Recovered:
    """What a resolver's answer (``None``: there is no resolver) does to ``record``."""
    if resolution is None:
        if record.status == NEEDS_REVIEW:
            return Recovered.UNKNOWN
        if idempotency_settings.RELEASE_EXPIRED_WITHOUT_RESOLVER:
            return Recovered.RELEASED
        return Recovered.NEEDS_REVIEW
    if resolution.answer == "done":
        return Recovered.SUCCEEDED
    if resolution.answer == "not_done":
        return Recovered.RELEASED
    if record.status == PROCESSING and (
        record.recovery_attempts + 1 >= idempotency_settings.MAX_RESOLVE_ATTEMPTS
    ):
        return Recovered.NEEDS_REVIEW
    return Recovered.UNKNOWN


def _recovered(
    record: IdempotencyRecord, outcome: Recovered, resolution: Resolution | None
) -> IdempotencyRecord:
    # The caller locked ``record`` on the records' database: its writes go there too.
    database = record._state.db
    move = "recover" if record.status == PROCESSING else "resolve"
    if outcome == Recovered.SUCCEEDED:
        assert resolution is not None
        return transition(
            record,
            Status.SUCCEEDED,
            resource_id=resolution.resource_id,
            response=resolution.response,
            using=database,
            move=move,
            recovery_attempt=True,
        )
    if outcome == Recovered.RELEASED:
        return transition(
            record, Status.FAILED_RETRYABLE, using=database, move=move, recovery_attempt=True
        )
    if outcome == Recovered.NEEDS_REVIEW:
        return transition(
            record, Status.NEEDS_REVIEW, using=database, move="recover", recovery_attempt=True
        )
    if record.status == PROCESSING:
        # Unknown: look again after a pause rather than at every request or pass.
        return postpone(record, idempotency_settings.RESOLVE_RETRY_SECONDS, using=database)
    return record
