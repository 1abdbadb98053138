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

``idempotency.steps.effects_carry_step_keys`` is one the library ships, for work
whose every external effect carries its step key (docs/downstream.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from django.db import transaction

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
