"""The HTTP layer shared by the view decorator and the framework adapters.

It reads the key, scope and fingerprint from a request, runs the view through
``core.execute``, snapshots responses and replays them, and renders errors.
It needs nothing but Django: what Django REST framework adds (``request.data``,
``APIException``, renderers, its exception handler) comes from the DRF adapter,
``idempotency.drf``, through the ``FrameworkAdapter`` registry below.

``protect``, ``aprotect`` and ``IdempotencyOptions`` are the stable entry points
for adapters (the DRF mixin, ``@idempotent``, other frameworks' decorators).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import BadRequest, ImproperlyConfigured, PermissionDenied
from django.db import connections, transaction
from django.http import Http404, HttpRequest, HttpResponse, RawPostDataException
from django.http.multipartparser import MultiPartParserError
from django.http.request import HttpHeaders
from django.http.response import HttpResponseBase

from idempotency import tracing
from idempotency.checks import validate_settings
from idempotency.compat import mark_logged, non_atomic_aliases, query_parsed
from idempotency.conf import FORBIDDEN_REPLAY_HEADERS, idempotency_settings, load_callable
from idempotency.core import (
    Attempt,
    Operation,
    Outcome,
    StoredResponse,
    database_unavailable,
    execute,
)
from idempotency.exceptions import (
    OUTAGE_ERRORS,
    IdempotencyError,
    KeyMissing,
    ScopeUnavailable,
)
from idempotency.fingerprint import canonical, fingerprint, parse_json
from idempotency.keys import checked_key, parse_key, validate_key
from idempotency.models import IdempotencyRecord, Status
from idempotency.options import IdempotencyOptions

V = TypeVar("V", bound=Callable[..., Any])

logger = logging.getLogger("idempotency")

if TYPE_CHECKING:
    from rest_framework.request import Request

    # A Django request, or DRF's wrapper of one (which keeps it in ``_request``).
    AnyRequest: TypeAlias = HttpRequest | Request
else:
    AnyRequest = HttpRequest
ViewCall = Callable[[], HttpResponseBase]
AsyncViewCall = Callable[[], Awaitable[HttpResponseBase]]

REPLAYED_HEADER = "Idempotent-Replayed"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# An HTML form, which cannot send headers, may carry the key in this field instead
# (the DRF browsable API's forms do). It is not part of the fingerprint.
KEY_FORM_FIELD = "_idempotency_key"
# Form fields that are not the request's business content: left out of the fingerprint.
_FORM_ONLY_FIELDS = (KEY_FORM_FIELD, "csrfmiddlewaretoken")
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")

_ERROR_STATUS = {
    "idempotency_key_missing": 400,
    "idempotency_key_invalid": 400,
    "idempotency_request_invalid": 400,
    "idempotency_scope_unavailable": 403,
    "idempotency_key_in_use": 409,
    "idempotency_lease_lost": 409,
    "idempotency_key_reused": 422,
    "database_unavailable": 503,
}


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
    if _django_request(request).method in SAFE_METHODS:
        return view()  # a plain view also renders its page or form: no key, no record
    validate_settings()
    name = options.operation or default_operation
    try:
        with tracing.span(name, options.mode or idempotency_settings.MODE):
            json_body(request)  # too deep to read: refused before any parser or key function
            key = read_key(request, options)
            if key is None:
                tracing.unkeyed()
                result: HttpResponseBase | _ClientError | None = None
            else:
                result = _execute(request, view, options, key, name)
        if result is None:
            return view()
    except OUTAGE_ERRORS as exc:  # first: a DatabaseUnavailable is one too
        return outage_response(request, exc)
    except IdempotencyError as error:
        return error_response(request, error)
    if isinstance(result, _ClientError):
        raise result.exception  # the framework renders it, as without the decorator
    return result


def _execute(
    request: AnyRequest, view: ViewCall, options: IdempotencyOptions, key: str, name: str
) -> HttpResponseBase | _ClientError:
    operation = build_operation(request, options, key, name)
    if operation.mode == "lease":
        refuse_request_transaction(request, operation)
    return execute(
        operation,
        lambda attempt: _run_view(request, attempt, view),
        decide=lambda result, attempt: (
            None
            if isinstance(result, _ClientError)
            else decide_outcome(request, result, attempt, options)
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
    if _django_request(request).method in SAFE_METHODS:
        return await view()  # nothing to record: no thread needed

    async def await_view() -> HttpResponseBase:
        return await view()

    def run_view() -> HttpResponseBase:
        return async_to_sync(await_view)()

    return await sync_to_async(protect, thread_sensitive=True)(
        request, run_view, options, default_operation
    )


def read_key(request: AnyRequest, options: IdempotencyOptions) -> str | None:
    if options.key is None:
        return header_key(request, options.header, options.required)
    function = load_callable(options.key, "key")
    key = function(request)
    if key is not None:
        validate_key(checked_key(key, function), max_length=idempotency_settings.MAX_KEY_LENGTH)
        return str(key)
    if _required(options.required):
        name = getattr(function, "__qualname__", repr(function))
        raise KeyMissing(f"{KeyMissing.default_detail} The key function {name} found none (None).")
    return None


def header_key(request: AnyRequest, header: str | None, required: bool | None) -> str | None:
    """The key of the ``header`` header (default ``HEADER``), or of the form's key field."""
    name = _meta_name(header or idempotency_settings.HEADER)
    raw = _django_request(request).META.get(name)
    if raw is None:
        raw = _form_key(request)
    if raw is not None:
        return parse_key(raw, max_length=idempotency_settings.MAX_KEY_LENGTH)
    if _required(required):
        raise KeyMissing()
    return None


def _required(required: bool | None) -> bool:
    return required if required is not None else idempotency_settings.REQUIRE_KEY


@lru_cache(maxsize=16)
def _meta_name(header: str) -> str:
    # Read from META as the server put it: ``request.headers`` would copy every header first.
    return HttpHeaders.to_wsgi_name(header)


def _form_key(request: AnyRequest) -> str | None:
    if (_django_request(request).content_type or "") not in _FORM_TYPES:
        return None
    data = parsed_body(request)
    try:
        form: Mapping[str, Any] = request.POST if data is _UNPARSED else data
    except MultiPartParserError:
        return None  # no key to read; the view rejects the body
    value = form.get(KEY_FORM_FIELD)
    return None if value is None else str(value)


def build_operation(
    request: AnyRequest, options: IdempotencyOptions, key: str, name: str
) -> Operation:
    django_request = _django_request(request)
    scope_function = load_callable(options.scope or idempotency_settings.SCOPE_FUNCTION, "scope")
    return Operation(
        scope=str(scope_function(request, name)),
        key=key,
        request_hash=request_hash(request, options),
        name=name,
        method=django_request.method or "",
        path=django_request.path,
        mode=options.mode or idempotency_settings.MODE,  # type: ignore[arg-type]
        lease_seconds=options.lease_seconds,
        lock_timeout=options.lock_timeout,
        resolver=options.resolver,
        wait_seconds=options.wait_seconds,
        in_flight=options.in_flight,
    )


def request_hash(request: AnyRequest, options: IdempotencyOptions) -> str:
    if options.fingerprint is not None:
        material = load_callable(options.fingerprint, "fingerprint")(request)
        return fingerprint([material])
    return fields_hash(request, options.fields, options.exclude)


def fields_hash(
    request: AnyRequest, fields: Collection[str] | None, exclude: Collection[str]
) -> str:
    """The request's hash by ``FINGERPRINT_FUNCTION``, over ``fields`` less ``exclude``."""
    function = idempotency_settings.FINGERPRINT_FUNCTION
    return str(function(request, fields=fields, exclude=exclude))


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


def default_scope(request: AnyRequest, operation: str) -> str:
    """``user:<pk>:<operation>``; anonymous callers have no scope and are refused."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        raise ScopeUnavailable()
    return f"user:{user.pk}:{operation}"


def default_fingerprint(
    request: AnyRequest,
    *,
    fields: Collection[str] | None = None,
    exclude: Collection[str] = (),
) -> str:
    """SHA-256 of the method, the path, the sorted query and the canonical body."""
    django_request = _django_request(request)
    # Most unsafe requests have no query string: "[]" without parsing one (unless the
    # request's GET was already made, or set by hand, when it is read as it is).
    has_query = query_parsed(django_request) or django_request.META.get("QUERY_STRING")
    query = sorted(django_request.GET.lists()) if has_query else []
    return fingerprint(
        [
            (django_request.method or "").upper(),
            django_request.path,
            json.dumps(query) if query else "[]",
            _canonical_body(request, fields, exclude),
        ]
    )


def _canonical_body(
    request: AnyRequest, fields: Collection[str] | None, exclude: Collection[str]
) -> str | bytes:
    content_type = _django_request(request).content_type or ""
    form = content_type in _FORM_TYPES
    if form:
        exclude = (*exclude, *_FORM_ONLY_FIELDS)
    exact = json_body(request)
    if exact is not _UNPARSED:
        if exact is _NOT_JSON:
            return request.body  # the view rejects it; the raw bytes still fingerprint it
        return canonical(exact, include=fields, exclude=exclude)
    data = parsed_body(request)
    if data is not _UNPARSED:
        return canonical(data, include=fields, exclude=exclude)
    if form:
        try:
            fields_and_files: dict[str, list[Any]] = dict(request.POST.lists())
            fields_and_files.update(request.FILES.lists())
        except MultiPartParserError:
            return b""
        return canonical(fields_and_files, include=fields, exclude=exclude)
    return request.body


_NOT_JSON: Any = object()


def json_body(request: AnyRequest) -> Any:
    """The JSON body parsed exactly (numbers as ``Decimal``), for the fingerprint.

    ``_UNPARSED`` when the request is not JSON or its body was already read as a
    stream (a framework's parse is used then), ``_NOT_JSON`` when it is malformed
    (the view rejects it; the raw bytes fingerprint it). ``RequestInvalid`` when it
    nests deeper than ``MAX_BODY_DEPTH``. Parsed once per request.
    """
    django_request = _django_request(request)
    cached = getattr(django_request, "_idempotency_json", _UNPARSED)
    if cached is not _UNPARSED:
        return cached
    content_type = django_request.content_type or ""
    if not (content_type == "application/json" or content_type.endswith("+json")):
        return _UNPARSED
    try:
        body = django_request.body
    except RawPostDataException:
        return _UNPARSED
    try:
        parsed = parse_json(body) if body else _NOT_JSON
    except ValueError:
        parsed = _NOT_JSON
    django_request._idempotency_json = parsed  # type: ignore[attr-defined]
    return parsed


def default_outcome_policy(response: HttpResponseBase) -> Status | None:
    """2xx succeeded; responses marked with ``mark_final`` failed for good; the rest unrecorded."""
    if getattr(response, "idempotency_final", False):
        return Status.FAILED_FINAL
    if 200 <= response.status_code < 300:
        return Status.SUCCEEDED
    return None


def mark_final(response: HttpResponseBase) -> HttpResponseBase:
    """Record this (failure) response as ``FAILED_FINAL`` and replay it to every repeat."""
    response.idempotency_final = True  # type: ignore[attr-defined]
    return response


@dataclass(frozen=True)
class _ClientError:
    """A 4xx the view raised (validation, permission, not found): recorded as nothing."""

    exception: Exception


_CLIENT_ERRORS = (Http404, PermissionDenied, BadRequest)


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
    match = getattr(_django_request(request), "resolver_match", None)
    if operation.database in non_atomic_aliases(getattr(match, "func", None)):
        return  # the transaction is the caller's own, not the request's
    raise ImproperlyConfigured(
        f"{operation.name} runs in lease mode, but ATOMIC_REQUESTS wraps it in a transaction "
        f"on {operation.database!r}, so its claim would only commit with the whole request. "
        "Decorate the view with @transaction.non_atomic_requests (or use atomic mode)."
    )


def decide_outcome(
    request: AnyRequest,
    response: HttpResponseBase,
    attempt: Attempt,
    options: IdempotencyOptions,
) -> Outcome | None:
    policy = load_callable(
        options.outcome_policy or idempotency_settings.OUTCOME_POLICY, "outcome_policy"
    )
    status = policy(response)
    if status is None:
        return None
    return Outcome(
        status=status,
        response=snapshot(request, response),
        resource_id=attempt.resource_id or _resource_id(response),
    )


def snapshot(request: AnyRequest, response: HttpResponseBase) -> StoredResponse:
    """What a repeat will get: status, safe headers and the rendered body, bounded."""
    response = stored_representation(request, response)
    # The body's media type belongs to the body: kept whatever REPLAY_HEADERS lists,
    # or a JSON body would be replayed as Django's default text/html.
    allowed = idempotency_settings.REPLAY_HEADERS | {"content-type"}
    headers = [(name, value) for name, value in response.items() if name.lower() in allowed]
    body = getattr(response, "content", None) if not response.streaming else None
    if body is None or len(body) > idempotency_settings.MAX_RESPONSE_BYTES:
        logger.warning(
            "idempotency response body not stored (streaming or larger than MAX_RESPONSE_BYTES)",
            extra={"status": response.status_code},
        )
        headers = [(name, value) for name, value in headers if name.lower() != "content-type"]
        body = None
    return StoredResponse(status=response.status_code, headers=headers, body=body)


def _resource_id(response: HttpResponseBase) -> str:
    data = getattr(response, "data", None)
    if isinstance(data, dict) and data.get("id") is not None:
        return str(data["id"])
    return str(response.get("Location", ""))


def replay_response(record: IdempotencyRecord) -> HttpResponse:
    body = bytes(record.response_body) if record.response_body is not None else b""
    response = HttpResponse(body, status=record.response_status or 200)
    if record.response_body is None:
        del response["Content-Type"]
    for name, value in record.response_headers:
        if name.lower() not in FORBIDDEN_REPLAY_HEADERS:
            response[name] = value
    response[REPLAYED_HEADER] = "true"
    return response


def outage_response(request: AnyRequest, error: Exception) -> HttpResponseBase:
    """The 503 answer to a database that failed under a protected request.

    ``error`` is the database's exception (or the protocol's ``DatabaseUnavailable``),
    raised by the protocol, the view, or what the framework ran before the view
    (DRF's or ninja's authentication). Logged once, by the ``database_unavailable``
    signal. A transaction still open around the request (``ATOMIC_REQUESTS``) is
    marked for rollback: nothing of a request answered 503 may commit.
    """
    unavailable = database_unavailable(error)
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            transaction.set_rollback(True, using=connection.alias)
    response = error_response(request, unavailable)
    mark_logged(response)  # Django's ``django.request`` logger would log this 5xx again
    return response


def error_response(request: AnyRequest, error: IdempotencyError) -> HttpResponseBase:
    name = idempotency_settings.ERROR_FORMAT
    for adapter in adapters():
        if adapter.error_format == name:
            return adapter.error_response(request, error)
    return problem_response(error)  # "problem", or a format whose adapter is missing (E028)


def error_status(error: IdempotencyError) -> int:
    return _ERROR_STATUS.get(error.code, 400)


def problem_response(error: IdempotencyError) -> HttpResponse:
    """RFC 9457 ``application/problem+json``."""
    status = error_status(error)
    body = {
        "type": f"urn:idempotency:error:{error.code}",
        "title": error.title,
        "status": status,
        "detail": error.detail,
        "code": error.code,
    }
    response = HttpResponse(
        json.dumps(body), status=status, content_type="application/problem+json"
    )
    retry_after = getattr(error, "retry_after", None)  # KeyInUse, DatabaseUnavailable
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _django_request(request: AnyRequest) -> HttpRequest:
    return getattr(request, "_request", request)


# --- framework adapters ---------------------------------------------------------------

_UNPARSED: Any = object()


class FrameworkAdapter:
    """What a framework tells the HTTP layer about its requests, responses and errors.

    Each method's default says "not mine". ``idempotency.drf`` registers DRF's
    adapter, loaded as soon as ``rest_framework`` is imported anywhere (only then
    can a DRF request or response exist). Stable for other frameworks' adapters.
    """

    #: The ``ERROR_FORMAT`` value this adapter renders, if any.
    error_format: str | None = None

    def parsed_body(self, request: AnyRequest) -> Any:
        """The framework's parse of the body, or ``_UNPARSED`` if not its request."""
        return _UNPARSED

    def is_client_error(self, exc: Exception) -> bool:
        return False

    def stored_representation(
        self, request: AnyRequest, response: HttpResponseBase
    ) -> HttpResponseBase | None:
        """Render ``response`` and return what to store for replays, or ``None``."""
        return None

    def error_response(self, request: AnyRequest, error: IdempotencyError) -> HttpResponseBase:
        return problem_response(error)


_ADAPTERS: list[FrameworkAdapter] = []


def register_adapter(adapter: FrameworkAdapter) -> None:
    if all(type(known) is not type(adapter) for known in _ADAPTERS):
        _ADAPTERS.append(adapter)


def adapters() -> list[FrameworkAdapter]:
    # Each adapter registers itself when its module is imported (AppConfig.ready).
    return _ADAPTERS


def parsed_body(request: AnyRequest) -> Any:
    for adapter in adapters():
        data = adapter.parsed_body(request)
        if data is not _UNPARSED:
            return data
    return _UNPARSED


def is_client_error(exc: Exception) -> bool:
    return isinstance(exc, _CLIENT_ERRORS) or any(
        adapter.is_client_error(exc) for adapter in adapters()
    )


def stored_representation(request: AnyRequest, response: HttpResponseBase) -> HttpResponseBase:
    for adapter in adapters():
        stored = adapter.stored_representation(request, response)
        if stored is not None:
            return stored
    render = getattr(response, "render", None)  # a TemplateResponse
    if callable(render):
        render()
    return response
