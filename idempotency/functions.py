"""``@idempotent_function``: the plain-Python entry point, for Celery tasks and consumers.

A message handler keyed by a stable event id runs its effect once; every
redelivery returns the first run's (JSON) result without running again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder

from idempotency.conf import idempotency_settings
from idempotency.core import Attempt, Mode, Operation, Outcome, StoredResponse, execute
from idempotency.fingerprint import canonical, fingerprint
from idempotency.keys import validate_key
from idempotency.models import IdempotencyRecord, Status
from idempotency.resolvers import ResolverSpec, register

F = TypeVar("F", bound=Callable[..., Any])
ArgsTo = Callable[..., str]

_JSON_CONTENT_TYPE = ("Content-Type", "application/json")


def idempotent_function(
    *,
    scope: str | ArgsTo,
    key: ArgsTo,
    operation: str | None = None,
    mode: Mode | None = None,
    lease_seconds: float | None = None,
    lock_timeout: float | None = None,
    resolver: ResolverSpec | None = None,
) -> Callable[[F], F]:
    """Run the decorated function once per (scope, key); repeats return the first result.

    ``key`` (and ``scope``, when callable) receive the function's arguments. The
    fingerprint is the canonical form of the arguments: the same key with other
    arguments raises ``KeyReused``; a repeat during the first run raises
    ``KeyInUse``. The result must be JSON-serialisable; repeats get it decoded
    from JSON (tuples come back as lists). An exception records nothing.

    In lease mode, ``resolver`` says what happened to a run whose lease was lost
    (``idempotency.resolvers``); a "done" answer's response body is the JSON result
    repeats get.
    """

    def decorator(func: F) -> F:
        name = operation or f"{func.__module__}.{func.__qualname__}"
        if resolver is not None:
            register(name, resolver)  # recovery finds it in any process that imports func

        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            call_key = str(key(*args, **kwargs))
            validate_key(call_key, max_length=idempotency_settings.MAX_KEY_LENGTH)
            call = Operation(
                scope=str(scope(*args, **kwargs) if callable(scope) else scope),
                key=call_key,
                request_hash=fingerprint([canonical({"args": list(args), "kwargs": kwargs})]),
                name=name,
                mode=mode or idempotency_settings.MODE,  # type: ignore[arg-type]
                lease_seconds=lease_seconds,
                lock_timeout=lock_timeout,
                resolver=resolver,
            )
            return execute(
                call,
                lambda attempt: func(*args, **kwargs),
                decide=_record_result,
                replay=_stored_result,
            )

        return wrapper  # type: ignore[return-value]

    return decorator


def _record_result(value: Any, attempt: Attempt) -> Outcome:
    body = json.dumps(value, cls=DjangoJSONEncoder).encode()
    return Outcome(
        status=Status.SUCCEEDED,
        response=StoredResponse(
            status=200, headers=[("Content-Type", "application/json")], body=body
        ),
        resource_id=attempt.resource_id,
    )


def _stored_result(record: IdempotencyRecord) -> Any:
    return json.loads(bytes(record.response_body)) if record.response_body is not None else None
