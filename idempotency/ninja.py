"""django-ninja integration: ``@idempotent`` for ninja operations, sync and async.

Put it *under* ``@api.post(...)`` (or a router's): ninja authenticates, throttles
and validates the input before it calls the operation, so none of that touches
the record. The decorator turns what the operation returns into the response
ninja would send (the operation's response schema, its renderer) and records
*that*; a replay is that stored response, which ninja passes through as is.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection
from contextlib import suppress
from contextvars import ContextVar
from functools import partial, wraps
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from ninja import NinjaAPI
from ninja.decorators import decorate_view
from ninja.operation import AsyncOperation, Operation
from ninja.utils import contribute_operation_callback

from idempotency import openapi
from idempotency.conf import idempotency_settings
from idempotency.core import Mode
from idempotency.exceptions import OUTAGE_ERRORS, IdempotencyError
from idempotency.http import (
    IdempotencyOptions,
    aprotect,
    default_scope,
    outage_response,
    protect,
)
from idempotency.resolvers import ResolverSpec, register

F = TypeVar("F", bound=Callable[..., Any])

# The bound operation serving the current request: ninja clones every operation
# when it mounts a router, so the one that converts results is known only per call.
_CURRENT: ContextVar[Operation] = ContextVar("idempotency_ninja_operation")


def idempotent(
    *,
    operation: str | None = None,
    header: str | None = None,
    required: bool | None = None,
    key: Callable[[HttpRequest], str | None] | str | None = None,
    scope: Callable[[HttpRequest, str], str] | str | None = None,
    fingerprint: Callable[[HttpRequest], str | bytes] | str | None = None,
    fields: Collection[str] | None = None,
    exclude: Collection[str] = (),
    mode: Mode | None = None,
    lease_seconds: float | None = None,
    lock_timeout: float | None = None,
    wait_seconds: float | None = None,
    outcome_policy: Callable[[HttpResponseBase], Any] | str | None = None,
    resolver: ResolverSpec | None = None,
) -> Callable[[F], F]:
    """Make a ninja operation safe to retry; the options are those of ``idempotency.idempotent``."""
    options = IdempotencyOptions(
        operation=operation,
        header=header,
        required=required,
        key=key,
        scope=scope or auth_scope,
        fingerprint=fingerprint,
        fields=fields,
        exclude=exclude,
        mode=mode,
        lease_seconds=lease_seconds,
        lock_timeout=lock_timeout,
        wait_seconds=wait_seconds,
        outcome_policy=outcome_policy,
        resolver=resolver,
    )

    def decorator(view: F) -> F:
        if hasattr(view, "_ninja_operation"):
            raise ImproperlyConfigured(
                f"Put @idempotent under @api.<method>(...), not above it ({view.__qualname__}): "
                "ninja has already registered the unprotected function."
            )
        default_operation = f"{view.__module__}.{view.__qualname__}"
        if resolver is not None:
            # So that recovery, in a worker that never serves this operation, finds it.
            register(options.operation or default_operation, resolver)
        wrap = _async_wrapper if inspect.iscoroutinefunction(view) else _sync_wrapper
        wrapper: Any = wrap(view, options, default_operation)
        _keep_signature(wrapper, view)
        wrapper.idempotency_options = options
        contribute_operation_callback(wrapper, partial(_describe, options=options))
        decorate_view(_serving)(wrapper)
        return wrapper  # type: ignore[return-value]

    return decorator


def answer_outages(api: NinjaAPI) -> None:
    """Make every operation of ``api`` answer a database outage with 503 and Retry-After.

    Protected operations do so by themselves; this covers the others (lists, reads)
    and their authentication.
    """
    for error in OUTAGE_ERRORS:
        api.add_exception_handler(error, _outage_handler)


def _outage_handler(request: HttpRequest, exc: Exception | type[Exception]) -> HttpResponse:
    assert isinstance(exc, Exception)  # ninja passes the exception raised
    response = outage_response(request, exc)
    assert isinstance(response, HttpResponse)  # a problem, or DRF's rendered Response
    return response


def auth_scope(request: HttpRequest, operation: str) -> str:
    """``user:<pk>:<operation>`` for the user ninja's auth returned, else ``SCOPE_FUNCTION``.

    Ninja puts what the operation's auth returned in ``request.auth``, and only
    session auth also sets ``request.user``; a token is never used as a scope.
    """
    function = idempotency_settings.SCOPE_FUNCTION
    user: Any = getattr(request, "auth", None)
    pk = getattr(user, "pk", None) if getattr(user, "is_authenticated", False) is True else None
    if function is default_scope and pk is not None:
        return f"user:{pk}:{operation}"
    return str(function(request, operation))


def _sync_wrapper(
    view: Callable[..., Any], options: IdempotencyOptions, default_operation: str
) -> Callable[..., HttpResponseBase]:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        operation = _current(view)

        def respond() -> HttpResponseBase:
            temporal = _temporal_response(operation, request, kwargs)
            try:
                result = view(request, *args, **kwargs)
                _note_resource(request, result)
                return operation._result_to_response(request, result, temporal)
            except Exception as exc:
                return _client_error(operation, request, exc)

        return protect(request, respond, options, default_operation)

    return wrapper


def _async_wrapper(
    view: Callable[..., Awaitable[Any]], options: IdempotencyOptions, default_operation: str
) -> Callable[..., Awaitable[HttpResponseBase]]:
    @wraps(view)
    async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        operation = _current(view)

        async def respond() -> HttpResponseBase:
            temporal = _temporal_response(operation, request, kwargs)
            try:
                result = await view(request, *args, **kwargs)
                _note_resource(request, result)
                return operation._result_to_response(request, result, temporal)
            except Exception as exc:
                return _client_error(operation, request, exc)

        response: HttpResponseBase = await aprotect(request, respond, options, default_operation)
        return response

    return wrapper


def _current(view: Callable[..., Any]) -> Operation:
    try:
        return _CURRENT.get()
    except LookupError:
        raise ImproperlyConfigured(
            f"{view.__qualname__} was called outside a ninja operation: @idempotent from "
            "idempotency.ninja protects ninja operations; use idempotency.idempotent for views."
        ) from None


def _temporal_response(
    operation: Operation, request: HttpRequest, kwargs: dict[str, Any]
) -> HttpResponse:
    # The ``response: HttpResponse`` argument an operation may declare, to set headers.
    name = operation.signature.response_arg
    if name is not None and isinstance(kwargs.get(name), HttpResponse):
        return kwargs[name]
    return operation.api.create_temporal_response(request)


def _note_resource(request: HttpRequest, result: Any) -> None:
    """The ``id`` of what the operation returned, for operators (DRF views give ``data``)."""
    attempt = getattr(request, "idempotency", None)
    if attempt is None or attempt.resource_id or isinstance(result, HttpResponseBase):
        return
    value = result.get("id") if isinstance(result, dict) else getattr(result, "id", None)
    if value is not None:
        attempt.resource_id = str(value)


def _client_error(operation: Operation, request: HttpRequest, exc: Exception) -> HttpResponseBase:
    """A 4xx the operation raised, as ninja renders it: seen by the outcome policy, not recorded.

    Protocol errors and 5xx propagate: the first are answered by ``protect``,
    the second leave a lease-mode record retryable, as any failure does.
    """
    if isinstance(exc, (IdempotencyError, *OUTAGE_ERRORS)):
        raise exc  # an outage: answered 503 by ``protect``, never rendered as ninja's 500
    response = operation.api.on_exception(request, exc)  # re-raises what ninja does not handle
    if response.status_code >= 500:
        raise exc
    return response


def _serving(run: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``Operation.run`` (of every clone) to make the operation known to the view."""
    operation = getattr(inspect.unwrap(run), "__self__", None)
    if not isinstance(operation, Operation):
        raise ImproperlyConfigured(
            "@idempotent could not find the ninja operation it protects: a view decorator "
            "applied with decorate_view before it does not keep functools.wraps."
        )
    if isinstance(operation, AsyncOperation):

        @wraps(run)
        async def serve_async(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            token = _CURRENT.set(operation)
            try:
                return await run(request, *args, **kwargs)
            except OUTAGE_ERRORS as exc:  # ninja's authentication runs before the operation
                return await sync_to_async(outage_response)(request, exc)
            finally:
                _CURRENT.reset(token)

        return serve_async

    @wraps(run)
    def serve(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        token = _CURRENT.set(operation)
        try:
            return run(request, *args, **kwargs)
        except OUTAGE_ERRORS as exc:  # ninja's authentication runs before the operation
            return outage_response(request, exc)
        finally:
            _CURRENT.reset(token)

    return serve


def _keep_signature(wrapper: Callable[..., Any], view: Callable[..., Any]) -> None:
    # Ninja resolves string annotations (``from __future__ import annotations``) in
    # the globals of the function it is given, which would be this module's: hand it
    # the view's own annotations, evaluated where the view was written.
    with suppress(NameError):  # a name defined later in the module: ninja resolves it
        wrapper.__signature__ = inspect.signature(view, eval_str=True)  # type: ignore[attr-defined]


def _describe(operation: Operation, options: IdempotencyOptions) -> None:
    """Adds the key header, the problem responses and the replay header to ninja's schema."""
    if not any(openapi.protects(method) for method in operation.methods):
        return
    statuses = [status for status in operation.response_models if isinstance(status, int)]
    extra: dict[str, Any] = {
        "responses": {
            **openapi.success_headers(statuses),
            **openapi.error_responses(openapi.problem_schema()),
        }
    }
    parameter = openapi.key_parameter(options)
    if parameter is not None:
        extra["parameters"] = [parameter]
    _merge(extra, operation.openapi_extra or {})
    operation.openapi_extra = extra


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """The operation's own ``openapi_extra`` wins over ours, key by key."""
    for name, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(name), dict):
            _merge(into[name], value)
        elif isinstance(value, list) and isinstance(into.get(name), list):
            into[name] = [*into[name], *value]
        else:
            into[name] = value
