"""What the protocol runs: an ``Operation`` (one business intent) and its ``Attempt``.

An adapter builds the ``Operation`` complete (scope, key, request hash and the
per-call options, each falling back to its setting) and hands it to ``execute``;
the work gets the ``Attempt`` that holds the record. What an attempt's outcome is
written as, the record's columns, is said once here (``Attempt.columns``,
``response_columns``), for the finish and for recovery's and operators' moves alike.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache, partial
from typing import Any, Literal, TypeVar

from idempotency.conf import InFlight, Mode, idempotency_settings
from idempotency.exceptions import LeaseLost
from idempotency.fingerprint import DIGEST_BYTES, digest_of
from idempotency.models import IdempotencyRecord
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.resolvers import ResolverSpec
from idempotency.stores import Store, records_database, store_for

T = TypeVar("T")


@dataclass(frozen=True)
class Operation:
    """One business intent: who (scope), which key, and what exactly (request_hash)."""

    scope: str
    key: str
    # The fingerprint: its first 128 bits are kept (hexadecimal text is taken too).
    request_hash: bytes
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

    # Known once the rest is, read by the claim: where its record lives and the
    # store of that database, the lease a claim takes (lease mode; None in atomic
    # mode), and how long a claim waits on the row lock of a concurrent attempt.
    database: str = field(init=False, repr=False, compare=False)
    store: Store = field(init=False, repr=False, compare=False)
    lease: timedelta | None = field(init=False, repr=False, compare=False)
    lock_wait: float = field(init=False, repr=False, compare=False)
    # Atomic mode with IN_FLIGHT "run": the finished record is inserted once, at the end
    # of the work's transaction, instead of claimed first and finished.
    writes_once: bool = field(init=False, repr=False, compare=False)

    @classmethod
    def of(
        cls, options: Any, scope: str, key: str, request_hash: str | bytes, name: str, **where: str
    ) -> Operation:
        """The operation of one call made with an entry point's ``options``.

        ``options`` is an ``IdempotencyOptions`` (or anything with its protocol
        options: mode, lease_seconds, lock_timeout, resolver, wait_seconds,
        in_flight, using); ``where`` is the request's method and path.
        """
        return cls(
            scope=scope,
            key=key,
            request_hash=request_hash,  # type: ignore[arg-type]  # made bytes by __post_init__
            name=name,
            mode=options.mode or idempotency_settings.MODE,  # type: ignore[arg-type]  # checked: E006
            lease_seconds=options.lease_seconds,
            lock_timeout=options.lock_timeout,
            resolver=options.resolver,
            wait_seconds=options.wait_seconds,
            in_flight=options.in_flight,
            using=options.using,
            **where,
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", bounded_scope(self.scope))
        if not isinstance(self.request_hash, bytes):  # hexadecimal text, as a caller may give it
            object.__setattr__(self, "request_hash", digest_of(self.request_hash))
        database = records_database(self.using, scope=self.scope)
        object.__setattr__(self, "database", database)
        object.__setattr__(self, "store", store_for(database))
        lease = lease_length(self) if self.mode == "lease" else None
        object.__setattr__(self, "lease", lease)
        object.__setattr__(self, "lock_wait", self._lock_wait())
        if self.in_flight == "run" and self.mode == "lease":
            raise ValueError(
                "in_flight='run' lets duplicates run their work before one is recorded, "
                "which only atomic mode takes back: give lease mode 'wait' or 'conflict'."
            )
        # IN_FLIGHT "run" set project-wide leaves a lease-mode view waiting ("wait").
        chosen = self.in_flight or idempotency_settings.IN_FLIGHT
        object.__setattr__(self, "writes_once", self.mode == "atomic" and chosen == "run")

    def _lock_wait(self) -> float:
        if self.conflict_at_once:
            return 0.0
        if self.lock_timeout is not None:
            return self.lock_timeout
        return float(idempotency_settings.LOCK_TIMEOUT)

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


# The random token of a new attempt (``new_owner_token()``): only the attempt holding it
# may write its record. Sixteen bytes, the record's ``owner_token``.
new_owner_token: Callable[[], bytes] = partial(secrets.token_bytes, DIGEST_BYTES)


Taken = Literal["new", "reclaimed", "replaced"]


@dataclass
class Attempt:
    """The claim held by the running work; lets long work renew its lease."""

    operation: Operation
    record: IdempotencyRecord
    owner_token: bytes
    resource_id: str = ""
    started: float = field(default_factory=time.monotonic)  # this process's clock, for durations
    # How the claim took the record: a new one, a FAILED_RETRYABLE one claimed again, or an
    # expired one taken over as a new request's (what ``record_claimed`` says).
    taken: Taken = "new"

    def columns(self, outcome: Outcome) -> dict[str, Any]:
        """The record's columns that hold ``outcome`` (its resource id, else the attempt's)."""
        return {
            "status": str(outcome.status),
            **response_columns(outcome.response),
            "resource_id": (outcome.resource_id or self.resource_id)[:255],
        }

    def renew(self, seconds: float | None = None) -> None:
        if self.operation.mode != "lease":
            return
        lease = lease_length(self.operation, seconds)
        if not self.operation.store.renew(self.record.pk, self.owner_token, lease):
            raise LeaseLost()

    # Calls to other idempotent APIs (idempotency.steps, imported here: it cannot import
    # this module back).

    def step_key(self, name: str, position: int | None = None) -> str:
        """The key for step ``name`` of this request: the same for every attempt of it."""
        from idempotency import steps

        return steps.step_key(self, name, position)

    def step(
        self,
        name: str,
        run: Callable[[str], T],
        *,
        position: int | None = None,
        record: bool = True,
    ) -> T:
        """``run(step_key)``, its JSON result recorded so that a later attempt does not rerun it."""
        from idempotency import steps

        return steps.step(self, name, run, position=position, record=record)


def lease_length(operation: Operation, seconds: float | None = None) -> timedelta:
    length = seconds or operation.lease_seconds or idempotency_settings.LEASE_SECONDS
    return timedelta(seconds=length)


def response_columns(response: StoredResponse | None) -> dict[str, Any]:
    """The record's columns that hold ``response``, what repeats are answered with (or none)."""
    if response is None:
        return {"response_status": None, "response_headers": [], "response_body": None}
    return {
        "response_status": response.status,
        "response_headers": [list(pair) for pair in response.headers],
        "response_body": response.body,
    }
