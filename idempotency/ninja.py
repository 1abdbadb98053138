"""django-ninja integration: ``@idempotent`` for ninja operations, sync and async.

Put it *under* ``@api.post(...)`` (or a router's): ninja authenticates, throttles
and validates the input before it calls the operation, so none of that touches
the record. The decorator turns what the operation returns into the response
ninja would send (the operation's response schema, its renderer) and records
*that*; a replay is that stored response, which ninja passes through as is.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextlib import suppress
from contextvars import ContextVar
from dataclasses import replace
from functools import partial, wraps
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import Error as DjangoDatabaseError
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from ninja import NinjaAPI
from ninja.decorators import decorate_view
from ninja.operation import AsyncOperation, Operation
from pydantic import BaseModel

from idempotency import openapi
from idempotency.compat import ninja_response, on_ninja_operation
from idempotency.conf import idempotency_settings
from idempotency.exceptions import IdempotencyError, RequestInvalid
from idempotency.http import (
    SAFE_METHODS,
    aprotect,
    decorate,
    default_scope,
    error_response,
    json_body,
    outage_response,
    protect,
)
from idempotency.operations import declare
from idempotency.options import IdempotencyOptions
from idempotency.resolvers import register
from idempotency.response import use_error_format
from idempotency.stores.errors import OUTAGE_CLASSES, is_outage

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from idempotency.options import OptionArgs

F = TypeVar("F", bound=Callable[..., Any])

# The bound operation serving the current request: ninja clones every operation
# when it mounts a router, so the one that converts results is known only per call.
_CURRENT: ContextVar[Operation] = ContextVar("idempotency_ninja_operation")


@overload
def idempotent(view: F, /) -> F: ...


@overload
def idempotent(view: None = None, /, **options: Unpack[OptionArgs]) -> Callable[[F], F]: ...


def idempotent(view: F | None = None, /, **options: Unpack[OptionArgs]) -> F | Callable[[F], F]:
    """Make a ninja operation safe to retry; the options are those of ``idempotency.idempotent``.

    ``@idempotent`` alone uses the settings.
    """
    given = IdempotencyOptions(**options)  # the options: idempotency.options
    given = replace(given, scope=given.scope or auth_scope)

    def decorator(view: F) -> F:
        if hasattr(view, "_ninja_operation"):
            raise ImproperlyConfigured(
                f"Put @idempotent under @api.<method>(...), not above it ({view.__qualname__}): "
                "ninja has already registered the unprotected function."
            )
        default_operation = f"{view.__module__}.{view.__qualname__}"
        declare(given.operation or default_operation)
        if given.resolver is not None:
            # So that recovery, in a worker that never serves this operation, finds it.
            register(given.operation or default_operation, given.resolver)
        wrap = _async_wrapper if inspect.iscoroutinefunction(view) else _sync_wrapper
        wrapper: Any = wrap(view, given, default_operation)
        _keep_signature(wrapper, view)
        wrapper.idempotency_options = given
        name = given.operation or default_operation
        on_ninja_operation(wrapper, partial(_describe, options=given, name=name))
        decorate_view(_serving)(wrapper)
        return wrapper  # type: ignore[return-value]

    return decorate(view, decorator)


def answer_outages(api: NinjaAPI) -> None:
    """Make every operation of ``api`` answer a database outage with 503 and Retry-After.

    Protected operations do so by themselves; this covers the others (lists, reads)
    and their authentication.
    """
    for error in OUTAGE_CLASSES:
        api.add_exception_handler(error, _outage_handler)


def _outage_handler(request: HttpRequest, exc: Exception | type[Exception]) -> HttpResponse:
    assert isinstance(exc, Exception)  # ninja passes the exception raised
    if not is_outage(exc):
        raise exc  # as if no handler were registered: ninja's own answer, or Django's 500
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
                return ninja_response(operation, request, result, temporal)
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
                return ninja_response(operation, request, result, temporal)
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
    if isinstance(exc, IdempotencyError) or is_outage(exc):
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
            refused = _unreadable(request, operation)
            if refused is not None:
                return refused
            token = _CURRENT.set(operation)
            try:
                return await run(request, *args, **kwargs)
            except DjangoDatabaseError as exc:  # ninja's authentication runs before the operation
                if not is_outage(exc):
                    raise
                return await sync_to_async(outage_response)(request, exc)
            finally:
                _CURRENT.reset(token)

        return serve_async

    @wraps(run)
    def serve(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        refused = _unreadable(request, operation)
        if refused is not None:
            return refused
        token = _CURRENT.set(operation)
        try:
            return run(request, *args, **kwargs)
        except DjangoDatabaseError as exc:  # ninja's authentication runs before the operation
            if not is_outage(exc):
                raise
            return outage_response(request, exc)
        finally:
            _CURRENT.reset(token)

    return serve


def _unreadable(request: HttpRequest, operation: Operation) -> HttpResponseBase | None:
    """The problem answer to a JSON body nested too deeply or not UTF-8, before ninja parses it.

    Rendered as the operation's ``error_format`` says, as its other errors are.
    """
    if request.method in SAFE_METHODS:
        return None
    options = getattr(operation.view_func, "idempotency_options", None)
    use_error_format(request, getattr(options, "error_format", None))
    try:
        json_body(request)
    except RequestInvalid as error:
        return error_response(request, error)
    return None


def _keep_signature(wrapper: Callable[..., Any], view: Callable[..., Any]) -> None:
    # Ninja resolves string annotations (``from __future__ import annotations``) in
    # the globals of the function it is given, which would be this module's: hand it
    # the view's own annotations, evaluated where the view was written.
    with suppress(NameError):  # a name defined later in the module: ninja resolves it
        wrapper.__signature__ = inspect.signature(view, eval_str=True)  # type: ignore[attr-defined]


def _describe(operation: Operation, options: IdempotencyOptions, name: str) -> None:
    """Adds the key header, the problem responses and the replay header to ninja's schema.

    Ninja answers 400 (a body it cannot read) and 422 (its validation error) itself:
    both bodies are documented there.
    """
    if not any(openapi.protects(method) for method in operation.methods):
        return
    statuses = [status for status in operation.response_models if isinstance(status, int)]
    shared = _share_components(operation)
    problem, validation, unreadable = (
        [_ref(name) for name in _DEFINITIONS]
        if shared
        else [definition() for definition in _DEFINITIONS.values()]
    )
    framework = {
        400: (unreadable, "django-ninja could not read the request (`HttpError`)."),
        422: (
            validation,
            "the request did not pass django-ninja's validation (`ValidationError`).",
        ),
    }
    errors = openapi.error_responses(problem, framework)
    for status in set(errors) & set(statuses):
        # The operation documents this status itself: its body stays, the problem is added.
        errors[status] = {
            "content": {openapi.error_media_type(): {"schema": problem}},
            **({"headers": errors[status]["headers"]} if "headers" in errors[status] else {}),
        }
    extra: dict[str, Any] = {"responses": {**openapi.success_headers(statuses), **errors}}
    parameter = openapi.key_parameter(options, name)
    if parameter is not None:
        extra["parameters"] = [parameter]
    _merge(extra, operation.openapi_extra or {})
    operation.openapi_extra = extra


# The components a protected operation refers to: the problem, then ninja's own errors.
_DEFINITIONS: dict[str, Callable[[], dict[str, Any]]] = {
    openapi.PROBLEM_COMPONENT: openapi.error_schema,
    openapi.VALIDATION_COMPONENT: openapi.ninja_validation_error_schema,
    openapi.HTTP_ERROR_COMPONENT: openapi.ninja_http_error_schema,
}


def _ref(component: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{component}"}


def _share_components(operation: Operation) -> bool:
    """Put ``IdempotencyProblem`` and ninja's errors among the schema's components.

    An operation's ``openapi_extra`` cannot add components, but its response
    models' JSON schemas can (ninja moves their ``$defs`` there): one of them is
    given a subclass that validates the same and adds the definitions. False
    when the operation has no response model (the schemas are then inline).
    """
    for status, model in operation.response_models.items():
        if isinstance(model, type) and issubclass(model, BaseModel):
            operation.response_models[status] = _with_definitions(model)
            return True
    return False


def _with_definitions(model: type[BaseModel]) -> type[BaseModel]:
    if getattr(model, "_idempotency_definitions", False):
        return model

    class Described(model):  # type: ignore[valid-type,misc]
        _idempotency_definitions: ClassVar[bool] = True

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            schema = super().model_json_schema(*args, **kwargs)
            definitions = schema.setdefault("$defs", {})
            for name, definition in _DEFINITIONS.items():
                definitions.setdefault(name, definition())
            return schema

    Described.__name__ = Described.__qualname__ = model.__name__
    return Described


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """The operation's own ``openapi_extra`` wins over ours, key by key."""
    for name, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(name), dict):
            _merge(into[name], value)
        elif isinstance(value, list) and isinstance(into.get(name), list):
            into[name] = [*into[name], *value]
        else:
            into[name] = value
