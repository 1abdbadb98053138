"""Protocol errors as HTTP answers: RFC 9457 ``application/problem+json`` and their statuses."""

from __future__ import annotations

import json

from django.http import HttpResponse

from idempotency.exceptions import (
    IdempotencyError,
)

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
