"""The HTTP layer shared by the DRF mixin and the view decorator.

It reads the key, scope and fingerprint from a request, runs the view through
``core.execute``, snapshots responses and replays them, and renders errors.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import BadRequest, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.http.response import HttpResponseBase
from rest_framework.exceptions import APIException
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from idempotency.conf import FORBIDDEN_REPLAY_HEADERS, idempotency_settings, load_callable
from idempotency.core import MODES, Attempt, Mode, Operation, Outcome, StoredResponse, execute
from idempotency.exceptions import IdempotencyError, KeyInUse, KeyMissing, ScopeUnavailable
from idempotency.fingerprint import canonical, fingerprint, parse_json
from idempotency.keys import parse_key, validate_key
from idempotency.models import IdempotencyRecord, Status
from idempotency.resolvers import ResolverSpec

logger = logging.getLogger("idempotency")

AnyRequest = HttpRequest | Request
ViewCall = Callable[[], HttpResponseBase]

REPLAYED_HEADER = "Idempotent-Replayed"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})

_ERROR_STATUS = {
    "idempotency_key_missing": 400,
    "idempotency_key_invalid": 400,
    "idempotency_scope_unavailable": 403,
    "idempotency_key_in_use": 409,
    "idempotency_lease_lost": 409,
    "idempotency_key_reused": 422,
}


@dataclass(frozen=True)
class IdempotencyOptions:
    """Per-view options; ``None`` means "use the ``IDEMPOTENCY`` setting"."""

    operation: str | None = None
    header: str | None = None
    required: bool | None = None
    key: Callable[..., str | None] | str | None = None
    scope: Callable[..., str] | str | None = None
    fingerprint: Callable[..., str | bytes] | str | None = None
    fields: Collection[str] | None = None
    exclude: Collection[str] = ()
    mode: Mode | None = None
    lease_seconds: float | None = None
    lock_timeout: float | None = None
    outcome_policy: Callable[[HttpResponseBase], Status | None] | str | None = None
    resolver: ResolverSpec | None = None
    wait_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode should be one of {MODES}, not {self.mode!r}.")
        if self.wait_seconds is not None and not self.wait_seconds >= 0:
            raise ValueError(f"wait_seconds should be a number >= 0, not {self.wait_seconds!r}.")


def protect(
    request: AnyRequest,
    view: ViewCall,
    options: IdempotencyOptions,
    default_operation: str,
) -> HttpResponseBase:
    """Run ``view`` idempotently for ``request``; the one entry point of both adapters."""
    if _django_request(request).method in SAFE_METHODS:
        return view()  # a plain view also renders its page or form: no key, no record
    try:
        key = read_key(request, options)
        if key is None:
            return view()
        operation = build_operation(request, options, key, options.operation or default_operation)
        result = execute(
            operation,
            lambda attempt: _run_view(request, attempt, view),
            decide=lambda result, attempt: (
                None
                if isinstance(result, _ClientError)
                else decide_outcome(request, result, attempt, options)
            ),
            replay=replay_response,
        )
    except IdempotencyError as error:
        return error_response(request, error)
    if isinstance(result, _ClientError):
        raise result.exception  # the framework renders it, as without the decorator
    return result


def read_key(request: AnyRequest, options: IdempotencyOptions) -> str | None:
    max_length = idempotency_settings.MAX_KEY_LENGTH
    if options.key is not None:
        key = load_callable(options.key, "key")(request)
        if key is not None:
            validate_key(str(key), max_length=max_length)
            return str(key)
    else:
        header = options.header or idempotency_settings.HEADER
        raw = _django_request(request).headers.get(header)
        if raw is not None:
            return parse_key(raw, max_length=max_length)
    required = (
        options.required if options.required is not None else idempotency_settings.REQUIRE_KEY
    )
    if required:
        raise KeyMissing()
    return None


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
    )


def request_hash(request: AnyRequest, options: IdempotencyOptions) -> str:
    if options.fingerprint is not None:
        material = load_callable(options.fingerprint, "fingerprint")(request)
        return fingerprint([material])
    function = idempotency_settings.FINGERPRINT_FUNCTION
    return str(function(request, fields=options.fields, exclude=options.exclude))


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
    query = sorted(django_request.GET.lists())
    return fingerprint(
        [
            (django_request.method or "").upper(),
            django_request.path,
            json.dumps(query),
            _canonical_body(request, fields, exclude),
        ]
    )


def _canonical_body(
    request: AnyRequest, fields: Collection[str] | None, exclude: Collection[str]
) -> str | bytes:
    if isinstance(request, Request):
        # DRF may already have consumed the stream (CSRF checks read it): use its parse.
        return canonical(request.data, include=fields, exclude=exclude)
    content_type = request.content_type or ""
    if content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        try:
            form: dict[str, list[Any]] = dict(request.POST.lists())
            form.update(request.FILES.lists())
        except MultiPartParserError:
            return b""
        return canonical(form, include=fields, exclude=exclude)
    body = request.body
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            return canonical(parse_json(body), include=fields, exclude=exclude) if body else b""
        except ValueError:
            pass  # the view rejects it; the raw bytes still fingerprint it
    return body


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


_CLIENT_ERRORS = (APIException, Http404, PermissionDenied, BadRequest)


def _run_view(
    request: AnyRequest, attempt: Attempt, view: ViewCall
) -> HttpResponseBase | _ClientError:
    request.idempotency = attempt  # type: ignore[union-attr]
    try:
        return view()
    except _CLIENT_ERRORS as exc:
        if isinstance(exc, APIException) and exc.status_code >= 500:
            raise
        # Like a returned 4xx, the key stays free for a corrected retry. Left to
        # propagate, lease mode would keep it FAILED_RETRYABLE, bound to the bad payload.
        return _ClientError(exc)


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
    _render(request, response)
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


def _render(request: AnyRequest, response: HttpResponseBase) -> None:
    if isinstance(response, Response) and not getattr(response, "accepted_renderer", None):
        view = (getattr(request, "parser_context", None) or {}).get("view")
        if view is not None:
            view.finalize_response(request, response)
    render = getattr(response, "render", None)
    if callable(render):
        render()


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


class IdempotencyAPIException(APIException):
    """A protocol error as a DRF exception, for projects that render errors themselves."""

    def __init__(self, error: IdempotencyError) -> None:
        self.status_code = _ERROR_STATUS.get(error.code, 400)
        super().__init__(detail=error.detail, code=error.code)
        if isinstance(error, KeyInUse):
            self.wait = error.retry_after


def error_response(request: AnyRequest, error: IdempotencyError) -> HttpResponseBase:
    if idempotency_settings.ERROR_FORMAT == "drf":
        return _drf_error(request, error)
    return problem_response(error)


def problem_response(error: IdempotencyError) -> HttpResponse:
    """RFC 9457 ``application/problem+json``."""
    status = _ERROR_STATUS.get(error.code, 400)
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
    if isinstance(error, KeyInUse):
        response["Retry-After"] = str(error.retry_after)
    return response


def _drf_error(request: AnyRequest, error: IdempotencyError) -> HttpResponseBase:
    exception = IdempotencyAPIException(error)
    if isinstance(request, Request):
        raise exception  # the view's handle_exception and the project's handler take it
    handler: Callable[..., Response | None] = api_settings.EXCEPTION_HANDLER  # type: ignore[assignment]
    response = handler(exception, {"request": request, "view": None, "args": (), "kwargs": {}})
    if response is None:
        return problem_response(error)
    response.accepted_renderer = JSONRenderer()
    response.accepted_media_type = "application/json"
    response.renderer_context = {"request": request, "response": response}  # type: ignore[attr-defined]
    response.render()
    return response


def _django_request(request: AnyRequest) -> HttpRequest:
    return getattr(request, "_request", request)
