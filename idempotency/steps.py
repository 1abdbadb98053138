"""Calls to other idempotent APIs: a key per step that survives a crash, and recorded steps.

Lease-mode work that calls a provider with idempotency keys of its own (a payment
API, another service built with this library) takes each call's key from its
attempt: ``attempt.step_key("charge")``. The key is the same for every attempt of
the same request (a retry after a crash, a takeover after the lease ran out, a
release for retry by recovery), so the provider sees one call however often the
work runs; another request, scope, step or position gets another key.

The derivation is a stable contract (docs/downstream.md), kept across releases:

- each request's record gets a seed, 32 random bytes, the first time one of its
  steps is keyed; it is written (committed, fenced by the attempt's lease) before
  the key is handed out, and kept until the record is purged or replaced by a new
  request (its ``created_at`` changes, which starts a new seed);
- a step's key is ``"idem_"`` followed by the 64 hex digits of
  ``HMAC-SHA256(seed, message)``, where ``message`` is the UTF-8 JSON text
  ``["idempotency-step/1", scope, key, name, position]`` (no spaces, non-ASCII
  characters unescaped; ``position`` is an integer or ``null``).

Neither ``SECRET_KEY`` nor any setting enters it: a rotation changes no key. The
key reveals nothing of the scope, the client's key or the project.

``attempt.step(name, run)`` also records ``run``'s JSON result, fenced by the
lease; a later attempt of the same request gets it back without calling ``run``.
Rows live in ``IdempotencyStep``, a table of their own (see the model for why),
which the records' store reads and writes (``Store.seed``, ``plant_seed``,
``recorded_step``, ``record_step``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Callable
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections
from django.utils import timezone

from idempotency.conf import idempotency_settings
from idempotency.exceptions import LeaseLost
from idempotency.models import IdempotencyRecord
from idempotency.resolvers import Resolution
from idempotency.stores import records_database, store_for

__all__ = [
    "KEY_PREFIX",
    "effects_carry_step_keys",
    "NotInAttempt",
    "StepNotRecorded",
    "current",
    "derive",
    "key_for_record",
    "step",
    "step_key",
]

T = TypeVar("T")

logger = logging.getLogger("idempotency")

KEY_PREFIX = "idem_"
VERSION = "idempotency-step/1"
SEED_BYTES = 32


class _Operation(Protocol):
    scope: str
    key: str
    mode: str
    database: str
    store: Any


class AttemptLike(Protocol):
    """What a step needs of ``Attempt`` (imported by name, it would import this module back)."""

    operation: Any
    record: IdempotencyRecord
    owner_token: bytes

    def step_key(self, name: str, position: int | None = None) -> str: ...

    def step(
        self,
        name: str,
        run: Callable[[str], T],
        *,
        position: int | None = None,
        record: bool = True,
    ) -> T: ...


class NotInAttempt(RuntimeError):
    """A step outside a protected attempt: no attempt running, or one in atomic mode.

    A programming error, not the client's: no ``IdempotencyError``, whose codes the
    adapters answer as the client's (4xx); this one is the server's (500).
    """

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(
            detail
            or "Steps are taken from a running lease-mode attempt: call them from the work of "
            "a view protected with mode='lease' (request.idempotency), an "
            "@idempotent_function(mode='lease') (idempotency.steps.current()), an "
            "IdempotentTask with idempotency_mode='lease' (self.idempotency, bind=True) or an "
            "@idempotent_task(mode='lease') (context.idempotency, takes_context=True)."
        )


class StepNotRecorded(ValueError):
    """A step's result that cannot be recorded: not JSON, or larger than the limit."""


# The attempt whose work runs in this context, for code that is not handed it
# (``idempotency.steps.current()``): set by ``execute`` around the work. A
# ``ContextVar``, so that it follows the work into the threads and tasks it is
# copied to, and never leaks to another request's.
running_attempt: ContextVar[AttemptLike | None] = ContextVar("idempotency_attempt", default=None)


def current() -> AttemptLike:
    """The attempt whose work is running here, for code that was not handed it."""
    attempt = running_attempt.get()
    if attempt is None:
        raise NotInAttempt()
    return attempt


def derive(seed: str, scope: str, key: str, name: str, position: int | None) -> str:
    """The step key, from the request's seed (hex): the stable contract above."""
    message = json.dumps(
        [VERSION, scope, key, name, position], ensure_ascii=False, separators=(",", ":")
    ).encode()
    return KEY_PREFIX + hmac.new(bytes.fromhex(seed), message, hashlib.sha256).hexdigest()


def step_key(attempt: AttemptLike, name: str, position: int | None = None) -> str:
    """The key of step ``name`` (at ``position``) of ``attempt``'s request; see the module."""
    _check_step(name, position)
    operation: _Operation = attempt.operation
    return derive(_seed(attempt), operation.scope, operation.key, name, position)


def step(
    attempt: AttemptLike,
    name: str,
    run: Callable[[str], T],
    *,
    position: int | None = None,
    record: bool = True,
) -> T:
    """``run(step_key)``, once per request when ``record``: its JSON result is recorded.

    A later attempt of the same request gets the recorded result (decoded from
    JSON) without calling ``run``. A result that is not recorded (``record=False``,
    or the attempt lost its lease before it could be) runs again on the next
    attempt, with the same key.
    """
    key = step_key(attempt, name, position)  # fenced: a stale owner gets LeaseLost here
    store = attempt.operation.store
    if record:
        stored = store.recorded_step(attempt.record.pk, key)
        if stored:  # JSON text is never empty
            return json.loads(stored)  # type: ignore[no-any-return]
    value = run(key)
    if record:
        written = store.record_step(
            attempt.record.pk,
            attempt.owner_token,
            name=name,
            position=position,
            step_key=key,
            result=_encoded(name, value),
        )
        if not written:
            raise _lease_lost()
    return value


def key_for_record(record: IdempotencyRecord, name: str, position: int | None = None) -> str | None:
    """The key step ``name`` had for ``record``'s request, for a resolver to ask the provider.

    ``None`` when no step of that request was ever keyed: the provider never
    received a call keyed for it. Reads only; no lease needed.
    """
    _check_step(name, position)
    seed = store_for(record._state.db or records_database(record=record)).seed(record.pk)
    if seed is None:
        return None
    return derive(seed, record.scope, record.idem_key, name, position)


def effects_carry_step_keys(record: IdempotencyRecord) -> Resolution:
    """A resolver: release a lost attempt for a retry, each of its external effects keyed.

    The operation's work says so by sending ``attempt.step_key(...)`` with every call
    to another idempotent API (and by keeping its own writes safe to repeat): a retry
    sends the same keys, so each provider answers it with what the lost attempt did
    and does nothing twice. "Not done" here means "safe to run again".

    Answers "unknown" (asked again, then an operator's) once the request's first step
    key is older than ``STEP_KEY_WINDOW``: the provider may have forgotten it by now,
    and a retry would do the work again.
    """
    store = store_for(record._state.db or records_database(record=record))
    first_keyed = store.seeded_at(record.pk)  # the seed is written before any step key
    if first_keyed is None:
        return Resolution.not_done()  # no step was ever keyed: nothing left the process
    window = idempotency_settings.STEP_KEY_WINDOW
    if window is not None and timezone.now() - first_keyed >= timedelta(seconds=window):
        logger.warning(
            "idempotency record %s keyed its first step more than STEP_KEY_WINDOW (%s s) "
            "ago: its provider may have forgotten the key, so it is not released for retry",
            record.pk,
            window,
            extra={"scope": record.scope, "record": record.pk},
        )
        return Resolution.unknown()
    return Resolution.not_done()


def _check_step(name: object, position: object) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"A step's name should be a non-empty string naming the call, such as "
            f'step_key("charge"), not {name!r}; for a step repeated in one attempt, '
            'give its position too: step_key("refund", position=i).'
        )
    if len(name) > 255:
        raise ValueError(
            f"A step's name has at most 255 characters, not {len(name)}: name the call, "
            "not its data (a loop over items gives position=)."
        )
    if position is not None and (
        isinstance(position, bool) or not isinstance(position, int) or position < 0
    ):
        raise TypeError(
            f"A step's position should be None or an integer >= 0 (the index of the "
            f"repeated call in this attempt), not {position!r}."
        )


def _check_attempt(attempt: AttemptLike) -> None:
    if getattr(getattr(attempt, "operation", None), "mode", None) != "lease":
        raise NotInAttempt(
            "Steps need a lease-mode attempt: in atomic mode a crash rolls the record back, "
            "and the step's key with it, so a retry would call the provider with a new key. "
            "Protect the work with mode='lease'."
        )


def _seed(attempt: AttemptLike) -> str:
    """The request's seed: read (fenced by the lease), or written the first time."""
    _check_attempt(attempt)
    operation, pk, token = attempt.operation, attempt.record.pk, attempt.owner_token
    seed: str | None = operation.store.seed(pk, token)
    if seed is not None:
        return seed
    if connections[operation.database].in_atomic_block:
        # The seed must be committed before its key reaches a provider: rolled back
        # with the caller's transaction, the retry's key would differ.
        raise NotInAttempt(
            "The first step key of a request is written before it is handed out, so it "
            "cannot be taken inside transaction.atomic() on the records' database: take "
            "it before the transaction (key = attempt.step_key(...)), then open it."
        )
    seed = operation.store.plant_seed(pk, token, secrets.token_hex(SEED_BYTES))
    if seed is None:
        raise _lease_lost()
    return seed


def _lease_lost() -> LeaseLost:
    return LeaseLost(
        "This attempt no longer holds the record (its lease ran out and another attempt "
        "took it over, or the attempt has finished): it may not take more steps. Renew "
        "the lease (attempt.renew()) during long work, or give it a longer lease_seconds."
    )


def _encoded(name: str, value: Any) -> str:
    try:
        text = json.dumps(value, cls=DjangoJSONEncoder)
    except (TypeError, ValueError) as error:
        raise StepNotRecorded(
            f"Step {name!r} returned {type(value).__name__}, which is not JSON ({error}): "
            "return what a later attempt needs as JSON data (a dict of the provider's ids), "
            "or pass record=False."
        ) from error
    limit = idempotency_settings.MAX_RESPONSE_BYTES
    if len(text.encode()) > limit:
        raise StepNotRecorded(
            f"Step {name!r} returned {len(text.encode())} bytes of JSON, more than "
            f"MAX_RESPONSE_BYTES ({limit}): record what a later attempt needs (the "
            "provider's ids), raise MAX_RESPONSE_BYTES, or pass record=False."
        )
    return text
