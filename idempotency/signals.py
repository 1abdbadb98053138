"""Signals for metrics and logs. Each is sent with ``sender=IdempotencyRecord``.

``operation`` is the ``idempotency.Operation`` being run (``.scope``, ``.key``, ``.name``)
for the protocol's signals, and the operation's name (``str``) for recovery.
In atomic mode the protocol's signals are sent inside the request's transaction:
a receiver must be quick and must not raise (an exception reaches the caller).
Keys are passed for logs and traces; never use them as metric labels.
docs/observability.md documents each one; idempotency/logs.py logs each one.
"""

from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

# Every signal is sent with ``sender=IdempotencyRecord``: Django keeps each one's
# receivers for that sender (``use_caching``, dropped on every connect and
# disconnect) instead of filtering the list of receivers on every request.

# A request claimed the record and will run the work.
# record, operation, reclaimed: bool (True when a FAILED_RETRYABLE record was re-claimed),
# replaced: bool (True when the key's record had expired: taken over as a new request's)
record_claimed = Signal(use_caching=True)
# A repeat was answered from the stored outcome; the work did not run.
# record, operation
response_replayed = Signal(use_caching=True)
# A repeat arrived while the first attempt was in flight (answered 409).
# operation, retry_after: int (seconds)
key_in_use = Signal(use_caching=True)
# A repeat arrived while the first attempt's outcome waits for an operator (NEEDS_REVIEW:
# answered 409 idempotency_key_under_review, with no Retry-After).
# record, operation
key_under_review = Signal(use_caching=True)
# The key was sent again with a different request fingerprint (answered 422).
# record, operation
key_reused = Signal(use_caching=True)
# An attempt recorded its outcome (or, in lease mode, failed and released the key).
# record, operation, status: Status (SUCCEEDED, FAILED_FINAL or FAILED_RETRYABLE)
record_completed = Signal(use_caching=True)
# The database failed under a protected call (answered 503 over HTTP); at the outcome's COMMIT,
# the error is an OutcomeUnknown: it may have landed.
# operation (None when it failed before the operation was known, e.g. in authentication),
# error: the database's exception, retry_after: int (seconds)
database_unavailable = Signal(use_caching=True)
# Recovery resolved an expired or stuck record.
# record, operation: str, outcome: idempotency.outcomes.Recovered (a str: "succeeded",
# "released", "needs_review" or "unknown")
record_recovered = Signal(use_caching=True)
# Purge deleted (or, with dry_run, counted) expired records.
# count: int, dry_run: bool
records_purged = Signal(use_caching=True)
# A request came without a key to a view whose key is optional (REQUIRE_KEY = False or
# required=False): the view ran unprotected. What a rollout counts before requiring keys.
# operation: str (the operation's name), request: HttpRequest (Django's, also under DRF)
request_unkeyed = Signal(use_caching=True)


# The receiver each signal's listeners name ``on_...``: the logs (idempotency/logs.py),
# the spans (idempotency/tracing.py) and the Prometheus metrics each define those they hear.
RECEIVER_NAMES: dict[str, Signal] = {
    "on_claimed": record_claimed,
    "on_replayed": response_replayed,
    "on_key_in_use": key_in_use,
    "on_key_under_review": key_under_review,
    "on_key_reused": key_reused,
    "on_completed": record_completed,
    "on_database_unavailable": database_unavailable,
    "on_recovered": record_recovered,
    "on_purged": records_purged,
    "on_unkeyed": request_unkeyed,
}


def operation_name(operation: Any) -> str:
    """The name a receiver reports: the protocol sends an ``Operation``, recovery a plain name."""
    return str(getattr(operation, "name", operation) or "")


def send_unkeyed(operation: str, request: Any) -> None:
    """Send ``request_unkeyed`` for ``request`` (a DRF ``Request`` or Django's own)."""
    # Imported here: this module is imported before the app registry is ready
    # (a project's receivers), the models are not.
    from idempotency.models import IdempotencyRecord

    request_unkeyed.send(
        IdempotencyRecord, operation=operation, request=getattr(request, "_request", request)
    )


def receivers_of(listener: object) -> list[tuple[Signal, Callable[..., Any]]]:
    """The ``(signal, receiver)`` pairs of ``listener``'s ``on_...`` functions or methods."""
    return [
        (signal, getattr(listener, name))
        for name, signal in RECEIVER_NAMES.items()
        if hasattr(listener, name)
    ]


def connect_receivers(listener: object, prefix: str) -> None:
    """Connect ``listener``'s receivers once, however often this runs (``dispatch_uid``)."""
    for signal, receiver in receivers_of(listener):
        signal.connect(receiver, dispatch_uid=f"{prefix}.{receiver.__name__}")
