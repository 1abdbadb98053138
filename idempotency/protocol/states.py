"""The record's state machine: every move a record can make, in one table.

A move names who makes it (a request claiming the key, the attempt that owns the
record, recovery, an operator, the purge), the states it leaves and reaches, and the
guard the database enforces for it. ``ABSENT`` stands for "no row": a claim creates
the row, a discard or a purge deletes it. Nothing moves a record but these moves;
``docs/concepts.md`` draws this table and ``model/protocol.pml`` model-checks it, and
tests compare both with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from idempotency.models import Status

ABSENT = "ABSENT"

PROCESSING = Status.PROCESSING.value
SUCCEEDED = Status.SUCCEEDED.value
FAILED_RETRYABLE = Status.FAILED_RETRYABLE.value
FAILED_FINAL = Status.FAILED_FINAL.value
NEEDS_REVIEW = Status.NEEDS_REVIEW.value

STATES = (ABSENT, PROCESSING, SUCCEEDED, FAILED_RETRYABLE, FAILED_FINAL, NEEDS_REVIEW)
# Outcomes a repeat is answered with; they never change until the record expires.
REPLAYABLE = frozenset({SUCCEEDED, FAILED_FINAL})
# What the purge may delete once it has expired: never a record in flight or under review.
PURGEABLE = frozenset({SUCCEEDED, FAILED_FINAL, FAILED_RETRYABLE})


@dataclass(frozen=True)
class Move:
    name: str
    actor: str
    sources: frozenset[str]
    targets: frozenset[str]
    guard: str


def _move(name: str, actor: str, sources: set[str], targets: set[str], guard: str) -> Move:
    return Move(name, actor, frozenset(sources), frozenset(targets), guard)


MOVES: dict[str, Move] = {
    move.name: move
    for move in (
        _move("claim", "request", {ABSENT}, {PROCESSING}, "the unique (scope, idem_key) index"),
        _move(
            "retry",
            "request",
            {FAILED_RETRYABLE},
            {PROCESSING},
            "row lock; same request hash; a new owner token",
        ),
        _move(
            "replace",
            "request",
            set(PURGEABLE),
            {PROCESSING},
            "row lock; expires_at passed (by the database's clock); a new owner token",
        ),
        _move("renew", "owner", {PROCESSING}, {PROCESSING}, "owner token (lease mode)"),
        _move("finish", "owner", {PROCESSING}, {SUCCEEDED, FAILED_FINAL}, "owner token"),
        _move("release", "owner", {PROCESSING}, {FAILED_RETRYABLE}, "owner token (lease mode)"),
        _move("discard", "owner", {PROCESSING}, {ABSENT}, "owner token (lease mode)"),
        _move(
            "recover",
            "recovery",
            {PROCESSING},
            {SUCCEEDED, FAILED_RETRYABLE, NEEDS_REVIEW},
            "row lock; lease expired; version; a new owner token fences the old owner",
        ),
        _move(
            "postpone",
            "recovery",
            {PROCESSING},
            {PROCESSING},
            "row lock; lease expired; version; the owner token is kept",
        ),
        _move(
            "resolve",
            "operator",
            {PROCESSING, NEEDS_REVIEW},
            {SUCCEEDED, FAILED_RETRYABLE, FAILED_FINAL},
            "version; a PROCESSING record only once its lease expired; a new owner token",
        ),
        _move("purge", "purge", set(PURGEABLE), {ABSENT}, "expires_at passed; skips locked rows"),
    )
}


def allowed(move: str, source: str, target: str) -> bool:
    """``move`` takes a record from ``source`` to ``target`` in the table."""
    entry = MOVES[move]
    return source in entry.sources and target in entry.targets
