"""OpenTelemetry spans: one per protected request or function, with its decision.

Optional: with ``opentelemetry-api`` installed (the ``otel`` extra) each call of
``protect`` or of an ``@idempotent_function``/``IdempotentTask`` runs in a span
named ``idempotency <operation>``; without it, ``span`` does nothing. What the
protocol decided reaches the span through the signals the logs hear too
(``connect`` wires them in ``IdempotencyConfig.ready``), and through the error
that ends the call. The key and the scope are never attributes: only a keyed
digest of the two (``idempotency.key_digest``), which correlates the retries of
one key and cannot be turned back into it. docs/tracing.md lists the attributes.
"""

from __future__ import annotations

import hashlib
import hmac
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from idempotency import signals
from idempotency.exceptions import (
    IdempotencyError,
    KeyInUse,
    KeyReused,
    KeyUnderReview,
    LeaseLost,
)
from idempotency.stores import records_database, store_for
from idempotency.stores.errors import is_outage

try:
    from opentelemetry import trace
except ImportError:  # the ``otel`` extra is not installed: no spans
    trace = None  # type: ignore[assignment]

# The providers of the API alone, before (or without) an SDK: their spans record nothing.
_NOT_RECORDING: tuple[type, ...] = (
    (trace.ProxyTracerProvider, trace.NoOpTracerProvider) if trace is not None else ()
)

TRACER_NAME = "idempotency"

# The decisions, from the least to the most telling: a call that met several
# (recovered, then replayed) reports the last one of this list it met.
UNKEYED = "unkeyed"  # an optional key left out: the view ran unprotected
EXECUTED = "executed"
REPLAYED = "replayed"
RECOVERED = "recovered"
CONFLICT = "conflict"
UNDER_REVIEW = "under_review"  # the first attempt's outcome waits for an operator
REUSED = "reused"
INVALID = "invalid"
LEASE_LOST = "lease_lost"
OUTAGE = "outage"
DECISIONS = (
    UNKEYED,
    EXECUTED,
    REPLAYED,
    RECOVERED,
    CONFLICT,
    UNDER_REVIEW,
    REUSED,
    INVALID,
    LEASE_LOST,
    OUTAGE,
)


@dataclass
class _Call:
    """What the signals of the traced call said, until its span ends."""

    span: Any
    decision: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)

    def decide(self, decision: str, **attributes: Any) -> None:
        if self.decision is None or DECISIONS.index(decision) >= DECISIONS.index(self.decision):
            self.decision = decision
        self.attributes.update({f"idempotency.{name}": value for name, value in attributes.items()})


_CURRENT: ContextVar[_Call | None] = ContextVar("idempotency_span", default=None)


def enabled() -> bool:
    return trace is not None


def unkeyed() -> None:
    """The traced request carried no key and its view runs unprotected."""
    if call := _CURRENT.get():
        call.decide(UNKEYED)


_NO_SPAN = nullcontext()


def span(operation: str, mode: str, using: str | None = None) -> AbstractContextManager[None]:
    """The span of one protected call; errors pass through it unchanged.

    Nothing at all while no SDK is set up (OpenTelemetry's API alone hands out
    spans that record nothing): a protected request pays for tracing only where
    someone reads the spans.
    """
    if trace is None or isinstance(trace.get_tracer_provider(), _NOT_RECORDING):
        return _NO_SPAN
    return _span(operation, mode, using)


@contextmanager
def _span(operation: str, mode: str, using: str | None) -> Iterator[None]:
    assert trace is not None
    tracer = trace.get_tracer(TRACER_NAME)
    attributes = {
        "idempotency.operation": operation,
        "idempotency.mode": mode,
        "db.system": store_for(records_database(using)).db_system,
    }
    with tracer.start_as_current_span(
        f"idempotency {operation}",
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        if not current.is_recording():  # sampled out: nothing the signals say is kept
            yield
            return
        call = _Call(current)
        token = _CURRENT.set(call)
        try:
            yield
        except BaseException as exc:
            _ended_by(call, exc)
            raise
        finally:
            _CURRENT.reset(token)
            _finish(call)


def _ended_by(call: _Call, exc: BaseException) -> None:
    if is_outage(exc):  # DatabaseUnavailable too
        call.decide(OUTAGE)
    elif isinstance(exc, LeaseLost):
        call.decide(LEASE_LOST)
    elif isinstance(exc, KeyInUse):
        call.decide(CONFLICT, retry_after=exc.retry_after)
    elif isinstance(exc, KeyUnderReview):
        call.decide(UNDER_REVIEW)
    elif isinstance(exc, KeyReused):
        call.decide(REUSED)
    elif isinstance(exc, IdempotencyError):
        call.decide(INVALID, error=exc.code)  # a missing or malformed key, no scope
    if isinstance(exc, IdempotencyError) and not (isinstance(exc, LeaseLost) or is_outage(exc)):
        return  # the client's to fix, or a retry to make: not the service's error
    call.span.record_exception(exc)
    assert trace is not None
    call.span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))


def _finish(call: _Call) -> None:
    if call.decision is not None:
        call.span.set_attribute("idempotency.decision", call.decision)
    for name, value in call.attributes.items():
        call.span.set_attribute(name, value)


def key_digest(scope: str, key: str) -> str:
    """HMAC-SHA256 of the scope and key under ``SECRET_KEY``, shortened: one per key."""
    message = f"{scope}\0{key}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()[:32]


def _current(operation: Any) -> _Call | None:
    call = _CURRENT.get()
    if call is None or "idempotency.key_digest" in call.attributes:
        return call
    if getattr(operation, "key", None) is not None:
        call.attributes["idempotency.key_digest"] = key_digest(operation.scope, operation.key)
    return call


def on_claimed(sender: Any, operation: Any, **kwargs: Any) -> None:
    if call := _current(operation):
        reclaimed, replaced = bool(kwargs.get("reclaimed")), bool(kwargs.get("replaced"))
        call.decide(EXECUTED, reclaimed=reclaimed, replaced=replaced)


def on_replayed(sender: Any, record: Any, operation: Any, **kwargs: Any) -> None:
    if call := _current(operation):
        call.decide(REPLAYED, status=str(record.status))


def on_key_in_use(sender: Any, operation: Any, **kwargs: Any) -> None:
    if call := _current(operation):
        call.decide(CONFLICT, retry_after=int(kwargs.get("retry_after") or 0))


def on_key_under_review(sender: Any, operation: Any, **kwargs: Any) -> None:
    if call := _current(operation):
        call.decide(UNDER_REVIEW)


def on_key_reused(sender: Any, operation: Any, **kwargs: Any) -> None:
    if call := _current(operation):
        call.decide(REUSED)


def on_completed(sender: Any, operation: Any, **kwargs: Any) -> None:
    if call := _current(operation):
        call.attributes["idempotency.status"] = str(kwargs.get("status", ""))


def on_recovered(sender: Any, **kwargs: Any) -> None:
    # Sent by recovery passes too, outside any traced call: those have no span here.
    if call := _CURRENT.get():
        call.decide(RECOVERED, recovery_outcome=str(kwargs.get("outcome", "")))


def on_database_unavailable(sender: Any, operation: Any, **kwargs: Any) -> None:
    if call := _current(operation):
        call.decide(OUTAGE, retry_after=int(kwargs.get("retry_after") or 0))


def connect() -> None:
    """Hear the protocol's signals; nothing to hear without OpenTelemetry."""
    if trace is None:
        return
    signals.connect_receivers(sys.modules[__name__], "idempotency.tracing")
