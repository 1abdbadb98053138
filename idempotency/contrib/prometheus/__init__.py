"""Count the idempotency signals with prometheus-client.

Install it with ``pip install "django-idempotency[prometheus]"``.

Enable it by adding ``"idempotency.contrib.prometheus"`` to ``INSTALLED_APPS``, or
by calling ``enable()`` once at start-up. The counters are labelled by
``operation`` (the operation's name, a bounded set chosen in code) and
``outcome`` only: the key and the scope are unbounded and never become labels.
Expose them the way the project already exposes prometheus-client metrics
(e.g. ``prometheus_client.start_http_server`` or django-prometheus's view).
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal
from prometheus_client import REGISTRY, CollectorRegistry, Counter

# Nothing here may import the models (idempotency.logs does): Django imports this
# module to find its AppConfig, before the app registry is ready.
from idempotency import signals
from idempotency.signals import operation_name

LABELS = ("operation", "outcome")


class SignalCounters:
    """prometheus-client counters fed by the idempotency signals."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        def counter(name: str, documentation: str, labels: tuple[str, ...] = LABELS) -> Counter:
            return Counter(name, documentation, labels, registry=registry)

        self.claims = counter(
            "idempotency_claims",
            "Records claimed to run the work (outcome: claimed, reclaimed, replaced).",
        )
        self.replays = counter(
            "idempotency_replays",
            "Repeats answered from the stored outcome (outcome: the stored status).",
        )
        self.conflicts = counter(
            "idempotency_conflicts",
            "Repeats refused (outcome: in_use and under_review for 409, key_reused for 422).",
        )
        self.completions = counter(
            "idempotency_completions",
            "Attempts that recorded their outcome (outcome: succeeded, failed_final, "
            "failed_retryable).",
        )
        self.recoveries = counter(
            "idempotency_recoveries",
            "Expired or stuck records settled by recovery (outcome: succeeded, released, "
            "needs_review, unknown).",
        )
        self.purged = counter(
            "idempotency_purged_records", "Records deleted by purge (dry runs excluded).", ()
        )
        # Labelled by operation alone: the caller would be unbounded (docs/rollout.md
        # logs it instead).
        self.unkeyed = counter(
            "idempotency_unkeyed_requests",
            "Requests served unprotected because they sent no key (REQUIRE_KEY = False).",
            ("operation",),
        )

    def receivers(self) -> list[tuple[Signal, Any]]:
        return signals.receivers_of(self)

    def connect(self) -> None:
        for signal, receiver in self.receivers():
            signal.connect(receiver, weak=False, dispatch_uid=self._uid(receiver))

    def disconnect(self) -> None:
        for signal, receiver in self.receivers():
            signal.disconnect(dispatch_uid=self._uid(receiver))

    def _uid(self, receiver: Any) -> str:
        return f"idempotency.prometheus.{id(self)}.{receiver.__name__}"

    def on_claimed(self, sender: Any, operation: Any = None, **kwargs: Any) -> None:
        outcome = "claimed"
        if kwargs.get("reclaimed"):
            outcome = "reclaimed"
        elif kwargs.get("replaced"):
            outcome = "replaced"
        self.claims.labels(operation_name(operation), outcome).inc()

    def on_replayed(self, sender: Any, operation: Any = None, **kwargs: Any) -> None:
        status = getattr(kwargs.get("record"), "status", "")
        self.replays.labels(operation_name(operation), str(status).lower()).inc()

    def on_key_in_use(self, sender: Any, operation: Any = None, **kwargs: Any) -> None:
        self.conflicts.labels(operation_name(operation), "in_use").inc()

    def on_key_under_review(self, sender: Any, operation: Any = None, **kwargs: Any) -> None:
        self.conflicts.labels(operation_name(operation), "under_review").inc()

    def on_key_reused(self, sender: Any, operation: Any = None, **kwargs: Any) -> None:
        self.conflicts.labels(operation_name(operation), "key_reused").inc()

    def on_completed(self, sender: Any, operation: Any = None, **kwargs: Any) -> None:
        status = str(kwargs.get("status", "")).lower()
        self.completions.labels(operation_name(operation), status).inc()

    def on_recovered(self, sender: Any, operation: Any = None, **kwargs: Any) -> None:
        outcome = str(kwargs.get("outcome", ""))
        self.recoveries.labels(operation_name(operation), outcome).inc()

    def on_purged(self, sender: Any, **kwargs: Any) -> None:
        if not kwargs.get("dry_run"):
            self.purged.inc(int(kwargs.get("count", 0)))

    def on_unkeyed(self, sender: Any, operation: Any = None, **kwargs: Any) -> None:
        self.unkeyed.labels(operation_name(operation)).inc()


_enabled: SignalCounters | None = None


def enable() -> SignalCounters:
    """Count the signals on the default registry; calling it again changes nothing."""
    global _enabled
    if _enabled is None:
        _enabled = SignalCounters()
    _enabled.connect()
    return _enabled


def disable() -> None:
    """Stop counting (the counters stay registered, with their values)."""
    if _enabled is not None:
        _enabled.disconnect()
