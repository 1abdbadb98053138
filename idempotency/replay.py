"""The recorded response and its replay: the outcome policy, the snapshot, the replayed answer."""

from __future__ import annotations

import logging

from django.http import HttpResponse
from django.http.response import HttpResponseBase

from idempotency.adapters import AnyRequest, stored_representation
from idempotency.conf import (
    FORBIDDEN_REPLAY_HEADERS,
    OMITTED_HEADER,
    idempotency_settings,
    load_callable,
)
from idempotency.models import IdempotencyRecord, Status
from idempotency.options import IdempotencyOptions
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Attempt

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
