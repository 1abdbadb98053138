"""Every answer the library writes: the outcome policy and the snapshot of a response it
records, the replay of a recorded one, and the errors (RFC 9457 problems, or the
framework's own format) including the 503 of a database outage.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.http import HttpResponse
from django.http.response import HttpResponseBase

from idempotency.adapters import AnyRequest, adapters, django_request_of, stored_representation
from idempotency.compat import mark_logged
from idempotency.conf import (
    FORBIDDEN_REPLAY_HEADERS,
    OMITTED_HEADER,
    error_format,
    idempotency_settings,
    load_callable,
)
from idempotency.exceptions import IdempotencyError
from idempotency.models import IdempotencyRecord, Status
from idempotency.options import IdempotencyOptions
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Attempt
from idempotency.protocol.execute import database_unavailable

logger = logging.getLogger("idempotency")


# The default name of the replay marker; the ``REPLAYED_HEADER`` setting names the one sent.
REPLAYED_HEADER = "Idempotent-Replayed"


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


def outcome_of(
    request: AnyRequest,
    response: HttpResponseBase,
    attempt: Attempt,
    options: IdempotencyOptions,
) -> Outcome | None:
    """What ``response`` is recorded as, by the view's outcome policy; ``None``: nothing."""
    policy = options.outcome_policy or idempotency_settings.OUTCOME_POLICY
    if not callable(policy):  # a view's dotted path, imported once
        policy = load_callable(policy, "outcome_policy")
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
    """The recorded answer, marked as a replay (``REPLAYED_HEADER: true``).

    A body that was not stored (larger than ``MAX_RESPONSE_BYTES``, streamed) is
    replayed empty, and says so: ``Idempotency-Replay: omitted``.
    """
    stored = record.response_body
    omitted = stored is None
    body = b"" if stored is None else bytes(stored)
    response = HttpResponse(body, status=record.response_status or 200)
    if omitted:
        del response["Content-Type"]
    marker = idempotency_settings.REPLAYED_HEADER
    ours = {marker.lower(), OMITTED_HEADER.lower()}  # set below, never as the view set them
    for name, value in record.response_headers:
        if name.lower() not in FORBIDDEN_REPLAY_HEADERS and name.lower() not in ours:
            response[name] = value
    response[marker] = "true"
    if omitted:
        response[OMITTED_HEADER] = "omitted"
    return response


# --- errors ------------------------------------------------------------------------------

_ERROR_STATUS = {
    "idempotency_key_missing": 400,
    "idempotency_key_invalid": 400,
    "idempotency_request_invalid": 400,
    "idempotency_scope_unavailable": 403,
    "idempotency_key_in_use": 409,
    # 409 too: a conflict with the record's state, which a retry does not change; without
    # Retry-After, which would invite a client's SDK to poll until an operator acts.
    "idempotency_key_under_review": 409,
    "idempotency_lease_lost": 409,
    "idempotency_key_reused": 422,
    "database_unavailable": 503,
    "outcome_unknown": 503,
}


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


def use_error_format(request: AnyRequest, chosen: Any) -> None:
    """Render ``request``'s protocol errors as ``chosen`` (a view's ``error_format``) says.

    Kept on the request: errors are rendered where they are caught, which may be
    outside the entry point that knows the view's options. ``None``: ``ERROR_FORMAT``.
    """
    if chosen is not None:
        django_request_of(request)._idempotency_error_format = chosen  # type: ignore[attr-defined]


def error_response(request: AnyRequest, error: IdempotencyError) -> HttpResponseBase:
    name = _error_format(request)
    if callable(name):
        return _rendered(name, request, error)
    for adapter in adapters():
        if adapter.error_format == name:
            rendered = adapter.error_response(request, error)
            if rendered is not None:
                return rendered
    return problem_response(error)  # "problem", or a format whose adapter is missing (E028)


def _error_format(request: AnyRequest) -> Any:
    chosen = getattr(django_request_of(request), "_idempotency_error_format", None)
    if chosen is None:
        return idempotency_settings.ERROR_FORMAT
    try:
        return error_format(chosen, "error_format")
    except ImproperlyConfigured:  # a view's dotted path, imported at its first error
        logger.exception("error_format %r cannot be used; answered with the problem", chosen)
        return "problem"


def _rendered(
    render: Callable[..., Any], request: AnyRequest, error: IdempotencyError
) -> HttpResponseBase:
    """The project's rendering of ``error``; the problem if the renderer fails (never a 500)."""
    try:
        response = render(request, error, error_status(error))
        if not isinstance(response, HttpResponseBase):
            raise TypeError(f"it returned {type(response).__name__}, not an HttpResponse")
    except Exception:
        name = getattr(render, "__qualname__", repr(render))
        logger.exception("ERROR_FORMAT renderer %s failed; answered with the problem", name)
        return problem_response(error)
    retry_after = getattr(error, "retry_after", None)  # KeyInUse, DatabaseUnavailable
    if retry_after is not None and not response.has_header("Retry-After"):
        response["Retry-After"] = str(retry_after)
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
