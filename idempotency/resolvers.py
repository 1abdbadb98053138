"""The resolver contract: after a lost lease, ask the business facts what happened.

A resolver is a callable ``(record) -> Resolution``. It looks (read-only) at the
business data for the record's scope and key and answers:

- ``Resolution.done(resource_id, response=...)``: the effect happened; the
  record becomes ``SUCCEEDED`` and ``response`` (if given) is replayed;
- ``Resolution.not_done()``: the effect did not happen; the key may run again
  (``FAILED_RETRYABLE``);
- ``Resolution.unknown()``: cannot tell yet; asked again later, and after
  ``MAX_RESOLVE_ATTEMPTS`` unknown answers the record waits for an operator.

A view names its resolver (``resolver=`` on ``@idempotent``, or
``idempotency_resolver`` on a DRF view); otherwise
``IDEMPOTENCY["RESOLVERS"][operation_name]`` is used.

``effects_carry_step_keys`` is one the library ships, for work whose every
external effect carries its step key (docs/downstream.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from idempotency.conf import idempotency_settings, load_callable
from idempotency.operations import declare

if TYPE_CHECKING:
    from idempotency.models import IdempotencyRecord
    from idempotency.outcomes import StoredResponse

logger = logging.getLogger("idempotency")

Answer = Literal["done", "not_done", "unknown"]


@dataclass(frozen=True)
class Resolution:
    """A resolver's answer about one record."""

    answer: Answer
    resource_id: str = ""
    response: StoredResponse | None = None

    @classmethod
    def done(cls, resource_id: object = "", response: StoredResponse | None = None) -> Resolution:
        return cls("done", resource_id=str(resource_id), response=response)

    @classmethod
    def not_done(cls) -> Resolution:
        return cls("not_done")

    @classmethod
    def unknown(cls) -> Resolution:
        return cls("unknown")


def effects_carry_step_keys(record: IdempotencyRecord) -> Resolution:
    """Release a lost attempt for a retry: each of its external effects carried a step key.

    The operation's work says so by sending ``attempt.step_key(...)`` with every call
    to another idempotent API (and by keeping its own writes safe to repeat): a retry
    sends the same keys, so each provider answers it with what the lost attempt did
    and does nothing twice. "Not done" here means "safe to run again".

    Answers "unknown" (asked again, then an operator's) once the request's first step
    key is older than ``STEP_KEY_WINDOW``: the provider may have forgotten it by now,
    and a retry would do the work again.
    """
    first_keyed = _first_step_keyed(record)
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


def _first_step_keyed(record: IdempotencyRecord) -> datetime | None:
    """When ``record``'s request wrote its seed (``idempotency.steps``): before any step key."""
    # Imported here: the resolver contract imports no model (IdempotencyRecord is a type only).
    from idempotency.models import IdempotencyStep

    # The seed row: no step key, written for the record's current request (its created_at).
    seed = IdempotencyStep.objects.using(record._state.db or "default").filter(
        record_id=record.pk, step_key="", request_started=F("record__created_at")
    )
    return seed.values_list("created_at", flat=True).first()


Resolver = Callable[["IdempotencyRecord"], Resolution]
# A resolver, or the dotted path of one.
ResolverSpec = Resolver | str

_registry: dict[str, ResolverSpec] = {}


def register(operation: str, resolver: ResolverSpec) -> None:
    """Name ``resolver`` as the one for ``operation`` (views do this when they are defined)."""
    declare(operation)  # an operation of the project's, whoever registers its resolver
    _registry[operation] = resolver


def resolver_for(operation: str, explicit: ResolverSpec | None = None) -> Resolver | None:
    """The resolver of ``operation``: the explicit one, a view's, or the setting's; else None."""
    if explicit is not None:
        return load_callable(explicit, "resolver")
    spec = _registry.get(operation)
    if spec is None and operation not in idempotency_settings.RESOLVERS:
        _discover_views()
        spec = _registry.get(operation)
    if spec is not None:
        return load_callable(spec, "resolver")
    setting = idempotency_settings.RESOLVERS.get(operation)
    if setting is None:
        return None
    return load_callable(setting, f"RESOLVERS[{operation!r}]")


def ask(resolver: Resolver, record: IdempotencyRecord) -> Resolution:
    """The resolver's answer; a resolver that fails or answers nonsense means "unknown"."""
    try:
        # A savepoint: a resolver's failed query must not abort the caller's transaction.
        with transaction.atomic(using=record._state.db):
            resolution = resolver(record)
    except Exception:
        logger.exception(
            "idempotency resolver failed", extra={"scope": record.scope, "record": record.pk}
        )
        return Resolution.unknown()
    if not isinstance(resolution, Resolution):
        logger.error(
            "idempotency resolver returned %r, not a Resolution",
            resolution,
            extra={"scope": record.scope, "record": record.pk},
        )
        return Resolution.unknown()
    return resolution


@lru_cache(maxsize=1)
def _discover_views() -> None:
    # Views register their resolvers when their module is imported. A Celery
    # worker or a management command never imports the URLconf on its own, so
    # recovery loads it once, the way the admin autodiscovers.
    from django.urls import get_resolver

    try:
        get_resolver().url_patterns  # noqa: B018 - importing the views is the point
    except Exception:
        logger.exception("idempotency could not import the URLconf to find view resolvers")
