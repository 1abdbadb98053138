"""OpenAPI fragments that describe a protected operation, for any schema generator.

Plain dicts (OpenAPI 3.0 and 3.1 alike), shared by the drf-spectacular and the
django-ninja integrations: the key header with the operation's expiry policy,
the problem responses with their codes, ``Retry-After`` on 409 and 503, and on 2xx
the replay marker (``REPLAYED_HEADER``, ``Idempotent-Replayed`` by default) and
``Idempotency-Replay: omitted``. A status the framework answers too (DRF's 400
and ninja's 422 validation errors) documents both bodies as ``oneOf``
alternatives, so a generated client parses either.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from idempotency.conf import OMITTED_HEADER, idempotency_settings, retention_for
from idempotency.http import SAFE_METHODS
from idempotency.models import Status
from idempotency.options import IdempotencyOptions

Schema = dict[str, Any]

PROBLEM_MEDIA_TYPE = "application/problem+json"
JSON_MEDIA_TYPE = "application/json"
PROBLEM_COMPONENT = "IdempotencyProblem"
VALIDATION_COMPONENT = "ValidationError"
HTTP_ERROR_COMPONENT = "HttpError"

# The stable codes each status can carry, in the order the docs list them.
ERROR_CODES: dict[int, tuple[str, ...]] = {
    400: ("idempotency_key_missing", "idempotency_key_invalid"),
    409: ("idempotency_key_in_use", "idempotency_key_under_review", "idempotency_lease_lost"),
    422: ("idempotency_key_reused",),
    503: ("database_unavailable", "outcome_unknown"),
}

_ERROR_DESCRIPTIONS = {
    400: "The idempotency key is missing or malformed.",
    409: "A request with this idempotency key is still in flight: retry after `Retry-After`; "
    "or its outcome is unknown and waits for an operator (`idempotency_key_under_review`, "
    "without `Retry-After`): a retry gets the same answer until the operator has settled it.",
    422: "This idempotency key was already used with a different request.",
    503: "The database failed under the request; retry with the same key after "
    "`Retry-After`. `outcome_unknown`: the connection was lost while the outcome was "
    "being committed, so it may have been recorded; the retry gets it if it was, and "
    "runs the request if it was not. Never retry with a new key.",
}


def error_schema() -> Schema:
    """The body of every idempotency error: the problem's, or the one the renderer declares.

    An ``ERROR_FORMAT`` renderer (a callable) declares its body by an ``openapi_schema``
    attribute, a JSON schema (and a ``media_type``, ``application/json`` by default).
    """
    declared = _declared(idempotency_settings.ERROR_FORMAT)
    return copy.deepcopy(declared[0]) if declared else problem_schema()


def error_media_type() -> str:
    declared = _declared(idempotency_settings.ERROR_FORMAT)
    return declared[1] if declared else PROBLEM_MEDIA_TYPE


def _declared(render: Any) -> tuple[Schema, str] | None:
    schema = getattr(render, "openapi_schema", None) if callable(render) else None
    if not isinstance(schema, dict):
        return None
    return schema, str(getattr(render, "media_type", JSON_MEDIA_TYPE))


def problem_schema() -> Schema:
    """The body of every idempotency error (RFC 9457 problem details plus ``code``)."""
    codes = ", ".join(f"`{code}`" for codes in ERROR_CODES.values() for code in codes)
    return {
        "type": "object",
        "properties": {
            "type": {"type": "string", "example": "urn:idempotency:error:idempotency_key_reused"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            # Described, not an enum: a client must accept codes added later.
            "code": {"type": "string", "description": f"Stable machine-readable code: {codes}."},
        },
        "required": ["type", "title", "status", "detail", "code"],
    }


def drf_validation_error_schema() -> Schema:
    """The body of DRF's own 400: a serializer's errors, or ``detail`` for an unparsable body.

    Its values are never numbers, a problem's ``status`` always is: a body is one or the other.
    """
    return {
        "type": "object",
        "description": "Django REST framework's validation error: for each field that failed, "
        "its messages (`non_field_errors` for the whole body; an object for a nested one), "
        "or `detail` for a body that could not be parsed.",
        "additionalProperties": {
            "oneOf": [
                {"type": "array", "items": {}},
                {"type": "string"},
                {"type": "object"},
            ]
        },
    }


def ninja_validation_error_schema() -> Schema:
    """The body of django-ninja's own 422: one entry per invalid input, under ``detail``."""
    return {
        "type": "object",
        "description": "django-ninja's validation error: one entry per input that failed, "
        "with where it is (`loc`), a message (`msg`) and pydantic's error type (`type`).",
        "properties": {
            "detail": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "type": {"type": "string"},
                        "loc": {
                            "type": "array",
                            "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                        },
                        "msg": {"type": "string"},
                    },
                    "required": ["type", "loc", "msg"],
                },
            }
        },
        "required": ["detail"],
    }


def ninja_http_error_schema() -> Schema:
    """The body of django-ninja's ``HttpError``: its 400 for a body it cannot read, for one.

    Nothing but ``detail``: a problem, which has ``detail`` too, is never one.
    """
    return {
        "type": "object",
        "description": "django-ninja's error for a request it could not read (`HttpError`).",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
        "additionalProperties": False,
    }


def protects(method: str) -> bool:
    """Whether a protected view runs ``method`` through the protocol (safe methods never do)."""
    return method.upper() not in SAFE_METHODS


def key_parameter(options: IdempotencyOptions, operation: str) -> Schema | None:
    """The key header, or ``None`` when the view reads its key elsewhere (``key=``).

    ``operation`` is the name its records are kept under: its retention windows
    are the expiry policy the description publishes.
    """
    if options.key is not None:
        return None
    required = (
        options.required if options.required is not None else idempotency_settings.REQUIRE_KEY
    )
    return {
        "name": options.header or idempotency_settings.HEADER,
        "in": "header",
        "required": required,
        "description": (
            "A unique value the client generates for one intent and sends again, unchanged, "
            "with every retry of it: repeats get the first attempt's response. "
            + expiry_policy(options.operation or operation)
        ),
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": idempotency_settings.MAX_KEY_LENGTH,
        },
    }


def expiry_policy(operation: str) -> str:
    """How long a key is remembered, from the operation's retention windows."""
    succeeded = retention_for(operation, Status.SUCCEEDED)
    final = retention_for(operation, Status.FAILED_FINAL)
    if succeeded == final:
        kept = f"for {_duration(succeeded)} after it was recorded"
    else:
        kept = (
            f"for {_duration(succeeded)} after a success and "
            f"{_duration(final)} after a final failure"
        )
    return (
        f"Keys expire: the first response is replayed {kept}; after that the key is "
        "forgotten and a request with it is a new request."
    )


def _duration(window: timedelta | None) -> str:
    if window is None:
        return "as long as an operator keeps it (no expiry)"
    seconds = int(window.total_seconds())
    for unit, length in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= length and seconds % length == 0:
            count = seconds // length
            return f"{count} {unit}{'s' if count != 1 else ''} ({seconds} s)"
    return f"{seconds} seconds"


def error_responses(
    problem: Schema, framework: dict[int, tuple[Schema, str]] | None = None
) -> dict[int, Schema]:
    """The 400, 409, 422 and 503 responses; ``problem`` is the body schema or a ``$ref`` to it.

    ``framework`` maps a status the framework answers too to its own body's schema
    and a description: that status gets both bodies as ``oneOf`` alternatives,
    under both media types (a generated client reads one schema per response).
    """
    responses = {}
    for status, codes in ERROR_CODES.items():
        listed = ", ".join(f"`{code}`" for code in codes)
        description = f"{_ERROR_DESCRIPTIONS[status]} Codes: {listed}."
        content: Schema = {error_media_type(): {"schema": problem}}
        if framework and status in framework:
            other, explained = framework[status]
            description = f"{description} Or {explained}"
            either = {"oneOf": [problem, other]}
            content = {error_media_type(): {"schema": either}, JSON_MEDIA_TYPE: {"schema": either}}
        response: Schema = {"description": description, "content": content}
        if status in (409, 503):
            response["headers"] = {"Retry-After": retry_after_header()}
        responses[status] = response
    return responses


def retry_after_header() -> Schema:
    return {
        "description": "Seconds to wait before retrying with the same key (absent on "
        "`idempotency_key_under_review`, which no wait resolves).",
        "schema": {"type": "integer", "minimum": 1},
    }


def replayed_header() -> Schema:
    return {
        "description": "`true` when this is the recorded response of an earlier request "
        "with the same key; absent on the first execution.",
        "schema": {"type": "string", "enum": ["true"]},
    }


def omitted_header() -> Schema:
    return {
        "description": "`omitted` on a replay whose body was not stored (larger than the "
        "server's `MAX_RESPONSE_BYTES`): the status and headers are the first response's, "
        "the body is empty. Absent otherwise.",
        "schema": {"type": "string", "enum": ["omitted"]},
    }


def success_headers(statuses: Iterable[int | str]) -> dict[int | str, Schema]:
    """The replay marker (``REPLAYED_HEADER``) and ``Idempotency-Replay`` on each 2xx."""
    headers = {
        idempotency_settings.REPLAYED_HEADER: replayed_header(),
        OMITTED_HEADER: omitted_header(),
    }
    return {
        status: {"headers": dict(headers)} for status in statuses if str(status).startswith("2")
    }
