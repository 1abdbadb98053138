"""``protect`` and ``aprotect``: a request made idempotent, for every HTTP adapter.

The view decorator, the DRF mixins and other frameworks' adapters call ``protect``
with the view and its options. It reads the request's operation (its key, scope and
fingerprint: ``idempotency.request``), runs the view through the protocol
(``idempotency.protocol.execute``), and answers with the view's response, a replay
or an error (``idempotency.response``). It needs nothing but Django. ``protect``,
``aprotect`` and ``IdempotencyOptions`` are the stable entry points for adapters; the
names re-exported below are the settings' dotted paths
(``idempotency.http.default_scope`` and the like) and what adapters build on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import Error as DjangoDatabaseError
from django.db import connections
from django.http.response import HttpResponseBase

from idempotency import signals, tracing
from idempotency.adapters import (
    AnyRequest,
    FrameworkAdapter,
    adapters,
    django_request_of,
    is_client_error,
    parsed_body,
    register_adapter,
    stored_representation,
)
from idempotency.compat import non_atomic_aliases
from idempotency.conf import idempotency_settings
from idempotency.exceptions import IdempotencyError
from idempotency.options import IdempotencyOptions
from idempotency.protocol import Attempt, Operation
from idempotency.protocol.execute import execute
from idempotency.request import (
    KEY_FORM_FIELD,
    SAFE_METHODS,
    build_operation,
    default_fingerprint,
    default_scope,
    fields_hash,
    header_key,
    json_body,
    read_key,
    read_operation,
    request_hash,
)
from idempotency.response import (
    REPLAYED_HEADER,
    default_outcome_policy,
    error_response,
    error_status,
    mark_final,
    outage_response,
    outcome_of,
    problem_response,
    replay_response,
    snapshot,
    use_error_format,
)
from idempotency.settings_checks import validate_settings
from idempotency.stores.errors import is_outage

__all__ = [
    "KEY_FORM_FIELD",
    "REPLAYED_HEADER",
    "SAFE_METHODS",
    "AnyRequest",
    "FrameworkAdapter",
    "IdempotencyOptions",
    "adapters",
    "aprotect",
    "build_operation",
    "outcome_of",
    "decorate",
    "default_fingerprint",
    "default_outcome_policy",
    "default_scope",
    "error_response",
    "error_status",
    "fields_hash",
    "header_key",
    "is_client_error",
    "is_outage",
    "json_body",
    "mark_final",
    "outage_response",
    "parsed_body",
    "problem_response",
    "protect",
    "read_key",
    "read_operation",
    "register_adapter",
    "replay_response",
    "request_hash",
    "snapshot",
    "stored_representation",
]


V = TypeVar("V", bound=Callable[..., Any])


ViewCall = Callable[[], HttpResponseBase]


AsyncViewCall = Callable[[], Awaitable[HttpResponseBase]]


def protect(
    request: AnyRequest,
    view: ViewCall,
    options: IdempotencyOptions,
    default_operation: str,
) -> HttpResponseBase:
    """Run ``view`` idempotently for ``request``; the one entry point of every adapter.

    ``view`` is a zero-argument callable returning the view's response. Stable:
    other frameworks' adapters build on it.
    """
    if django_request_of(request).method in SAFE_METHODS:
        return view()  # a plain view also renders its page or form: no key, no record
    if not idempotency_settings.validated:
        validate_settings()
    if options.error_format is not None:
        use_error_format(request, options.error_format)
    name = options.operation or default_operation
    try:
        with tracing.span(name, options.mode or idempotency_settings.MODE):
            operation = read_operation(request, options, name)
            if operation is None:
                tracing.unkeyed()
                signals.send_unkeyed(name, request)
                result: HttpResponseBase | _ClientError | None = None
            else:
                result = _execute(request, view, options, operation)
        if result is None:
            return view()
    except DjangoDatabaseError as exc:  # first: a DatabaseUnavailable is one too
        if not is_outage(exc):
            raise
        return outage_response(request, exc)
    except IdempotencyError as error:
        return error_response(request, error)
    if isinstance(result, _ClientError):
        raise result.exception  # the framework renders it, as without the decorator
    return result


def _execute(
    request: AnyRequest, view: ViewCall, options: IdempotencyOptions, operation: Operation
) -> HttpResponseBase | _ClientError:
    if operation.mode == "lease":
        refuse_request_transaction(request, operation)
    return execute(
        operation,
        lambda attempt: _run_view(request, attempt, view),
        decide=lambda result, attempt: (
            None
            if isinstance(result, _ClientError)
            else outcome_of(request, result, attempt, options)
        ),
        replay=replay_response,
    )


async def aprotect(
    request: AnyRequest,
    view: AsyncViewCall,
    options: IdempotencyOptions,
    default_operation: str,
) -> HttpResponseBase:
    """``protect`` for an async view: ``view`` returns an awaitable of the response.

    Same semantics in both modes. The protocol is synchronous and Django's
    connections belong to a thread, so ``protect`` runs in the request's one
    sync thread (``sync_to_async(thread_sensitive=True)``) and drives the view's
    coroutine on the event loop from there (``async_to_sync``). While it waits,
    that thread serves the view's own thread-sensitive calls, so the view's
    ``await Model.objects.acreate(...)`` runs on the connection that holds the
    claim: in atomic mode, inside its transaction. Stable: other frameworks'
    adapters build on it.
    """
    if django_request_of(request).method in SAFE_METHODS:
        return await view()  # nothing to record: no thread needed

    async def await_view() -> HttpResponseBase:
        return await view()

    def run_view() -> HttpResponseBase:
        return async_to_sync(await_view)()

    return await sync_to_async(protect, thread_sensitive=True)(
        request, run_view, options, default_operation
    )


def decorate(view: Any, decorator: Callable[[V], V]) -> V | Callable[[V], V]:
    """What ``@idempotent`` returns, bare (``view`` given) or called (``view`` is None)."""
    if view is None:
        return decorator
    if not callable(view):
        raise TypeError(
            f"@idempotent takes its options by keyword, not {view!r}: write "
            "@idempotent(operation=...) or @idempotent()."
        )
    return decorator(view)


@dataclass(frozen=True)
class _ClientError:
    """A 4xx the view raised (validation, permission, not found): recorded as nothing."""

    exception: Exception


def _run_view(
    request: AnyRequest, attempt: Attempt, view: ViewCall
) -> HttpResponseBase | _ClientError:
    request.idempotency = attempt  # type: ignore[union-attr]
    try:
        return view()
    except Exception as exc:
        if not is_client_error(exc):
            raise
        # Like a returned 4xx, the key stays free for a corrected retry. Left to
        # propagate, lease mode would keep it FAILED_RETRYABLE, bound to the bad payload.
        return _ClientError(exc)


def refuse_request_transaction(request: AnyRequest, operation: Operation) -> None:
    """Lease mode inside ``ATOMIC_REQUESTS``' transaction would silently be atomic mode."""
    connection = connections[operation.database]
    if not (connection.settings_dict.get("ATOMIC_REQUESTS") and connection.in_atomic_block):
        return
    match = getattr(django_request_of(request), "resolver_match", None)
    if operation.database in non_atomic_aliases(getattr(match, "func", None)):
        return  # the transaction is the caller's own, not the request's
    raise ImproperlyConfigured(
        f"{operation.name} runs in lease mode, but ATOMIC_REQUESTS wraps it in a transaction "
        f"on {operation.database!r}, so its claim would only commit with the whole request. "
        "Decorate the view with @transaction.non_atomic_requests (or use atomic mode)."
    )
