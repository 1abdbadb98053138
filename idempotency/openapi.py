"""OpenAPI fragments that describe a protected operation, for any schema generator.

Plain dicts (OpenAPI 3.0 and 3.1 alike), shared by the drf-spectacular and the
django-ninja integrations: the key header, the problem responses with their
codes, ``Retry-After`` on 409 and ``Idempotent-Replayed`` on 2xx.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from idempotency.conf import idempotency_settings
from idempotency.http import REPLAYED_HEADER, SAFE_METHODS, IdempotencyOptions

Schema = dict[str, Any]

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_COMPONENT = "IdempotencyProblem"

# The stable codes each status can carry, in the order the docs list them.
ERROR_CODES: dict[int, tuple[str, ...]] = {
    400: ("idempotency_key_missing", "idempotency_key_invalid"),
    409: ("idempotency_key_in_use", "idempotency_lease_lost"),
    422: ("idempotency_key_reused",),
}

_ERROR_DESCRIPTIONS = {
    400: "The idempotency key is missing or malformed.",
    409: "A request with this idempotency key is still in flight; retry after `Retry-After`.",
    422: "This idempotency key was already used with a different request.",
}


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


def protects(method: str) -> bool:
    """Whether a protected view runs ``method`` through the protocol (safe methods never do)."""
    return method.upper() not in SAFE_METHODS


def key_parameter(options: IdempotencyOptions) -> Schema | None:
    """The key header, or ``None`` when the view reads its key elsewhere (``key=``)."""
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
            "with every retry of it: repeats get the first attempt's response."
        ),
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": idempotency_settings.MAX_KEY_LENGTH,
        },
    }


def error_responses(problem: Schema) -> dict[int, Schema]:
    """The 400, 409 and 422 responses; ``problem`` is the body schema or a ``$ref`` to it."""
    responses = {}
    for status, codes in ERROR_CODES.items():
        listed = ", ".join(f"`{code}`" for code in codes)
        response: Schema = {
            "description": f"{_ERROR_DESCRIPTIONS[status]} Codes: {listed}.",
            "content": {PROBLEM_MEDIA_TYPE: {"schema": problem}},
        }
        if status == 409:
            response["headers"] = {"Retry-After": retry_after_header()}
        responses[status] = response
    return responses


def retry_after_header() -> Schema:
    return {
        "description": "Seconds to wait before retrying with the same key.",
        "schema": {"type": "integer", "minimum": 1},
    }


def replayed_header() -> Schema:
    return {
        "description": "`true` when this is the recorded response of an earlier request "
        "with the same key; absent on the first execution.",
        "schema": {"type": "string", "enum": ["true"]},
    }


def success_headers(statuses: Iterable[int | str]) -> dict[int | str, Schema]:
    """``Idempotent-Replayed`` on each 2xx among ``statuses``."""
    return {
        status: {"headers": {REPLAYED_HEADER: replayed_header()}}
        for status in statuses
        if str(status).startswith("2")
    }
