"""Make unsafe Django/DRF endpoints, Celery and Django tasks and consumers safe to retry."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from idempotency.exceptions import (
    DatabaseUnavailable,
    IdempotencyError,
    KeyInUse,
    KeyInvalid,
    KeyMissing,
    KeyReused,
    KeyUnderReview,
    LeaseLost,
    OutcomeUnknown,
    RequestInvalid,
    ScopeUnavailable,
    TransitionNotAllowed,
)
from idempotency.progress import Progress

if TYPE_CHECKING:
    from idempotency.celery import IdempotentTask as IdempotentTask  # not in __all__
    from idempotency.decorators import idempotent
    from idempotency.django_tasks import idempotent_task as idempotent_task  # not in __all__
    from idempotency.drf import (
        IdempotencyAPIException,
        IdempotentBrowsableAPIRenderer,
        IdempotentCreateMixin,
        IdempotentMixin,
    )
    from idempotency.functions import idempotent_function
    from idempotency.http import mark_final
    from idempotency.models import IdempotencyRecord, Status
    from idempotency.options import IdempotencyOptions
    from idempotency.outcomes import Outcome, StoredResponse
    from idempotency.protocol import Attempt, Operation
    from idempotency.protocol.execute import execute
    from idempotency.recovery import (
        RecoveryReport,
        ResolutionReport,
        mark_records,
        recover_expired,
        resolve_record,
        run_resolvers,
    )
    from idempotency.resolvers import Resolution, Resolver
    from idempotency.retention import purge

# Everything below touches models or DRF (only the DRF names need DRF installed), so
# it loads on first use: ``import idempotency`` must work while Django is still
# populating the app registry.
_LAZY = {
    "Attempt": "idempotency.protocol",
    "Operation": "idempotency.protocol",
    "Outcome": "idempotency.outcomes",
    "StoredResponse": "idempotency.outcomes",
    "execute": "idempotency.protocol.execute",
    "idempotent": "idempotency.decorators",
    "idempotent_function": "idempotency.functions",
    "IdempotencyAPIException": "idempotency.drf",
    "IdempotentBrowsableAPIRenderer": "idempotency.drf",
    "IdempotentTask": "idempotency.celery",  # needs Celery: left out of __all__ (star imports)
    # Needs django.tasks (Django 6) or the django-tasks backport: left out of __all__ too.
    "idempotent_task": "idempotency.django_tasks",
    "IdempotentCreateMixin": "idempotency.drf",
    "IdempotentMixin": "idempotency.drf",
    "IdempotencyOptions": "idempotency.options",
    "mark_final": "idempotency.http",
    "IdempotencyRecord": "idempotency.models",
    "Status": "idempotency.models",
    "RecoveryReport": "idempotency.recovery",
    "recover_expired": "idempotency.recovery",
    "resolve_record": "idempotency.recovery",
    "ResolutionReport": "idempotency.recovery",
    "mark_records": "idempotency.recovery",
    "run_resolvers": "idempotency.recovery",
    "Resolution": "idempotency.resolvers",
    "Resolver": "idempotency.resolvers",
    "purge": "idempotency.retention",
}

__all__ = [
    "Attempt",
    "DatabaseUnavailable",
    "IdempotencyError",
    "IdempotencyAPIException",
    "IdempotencyOptions",
    "IdempotencyRecord",
    "IdempotentBrowsableAPIRenderer",
    "IdempotentCreateMixin",
    "IdempotentMixin",
    "KeyInUse",
    "KeyInvalid",
    "KeyMissing",
    "KeyReused",
    "KeyUnderReview",
    "LeaseLost",
    "Operation",
    "Outcome",
    "OutcomeUnknown",
    "Progress",
    "RecoveryReport",
    "RequestInvalid",
    "Resolution",
    "ResolutionReport",
    "Resolver",
    "ScopeUnavailable",
    "Status",
    "StoredResponse",
    "TransitionNotAllowed",
    "execute",
    "idempotent",
    "idempotent_function",
    "mark_final",
    "mark_records",
    "purge",
    "recover_expired",
    "resolve_record",
    "run_resolvers",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'idempotency' has no attribute {name!r}")
