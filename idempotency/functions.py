"""``@idempotent_function``: the plain-Python entry point, for consumers and tasks.

A message handler keyed by a stable event id runs its effect once; every
redelivery returns the first run's (JSON) result without running again.
``idempotency.celery.IdempotentTask`` applies the same ``CallGuard`` to Celery tasks.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder

from idempotency import tracing
from idempotency.conf import idempotency_settings
from idempotency.core import (
    MODES,
    Attempt,
    InFlight,
    Mode,
    Operation,
    Outcome,
    StoredResponse,
    check_in_flight,
    execute,
)
from idempotency.fingerprint import canonical, fingerprint
from idempotency.keys import checked_key, validate_key
from idempotency.models import IdempotencyRecord, Status
from idempotency.resolvers import ResolverSpec, register
from idempotency.settings_checks import validate_settings

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
ArgsTo = Callable[..., str]

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def idempotent_function(
    *,
    scope: str | ArgsTo,
    key: ArgsTo,
    operation: str | None = None,
    fingerprint: Callable[..., Any] | None = None,
    fields: Collection[str] | None = None,
    exclude: Collection[str] = (),
    mode: Mode | None = None,
    lease_seconds: float | None = None,
    lock_timeout: float | None = None,
    resolver: ResolverSpec | None = None,
    in_flight: InFlight | None = None,
) -> Callable[[F], F]:
    """Run the decorated function once per (scope, key); repeats return the first result.

    ``key`` (and ``scope``, when callable) receive the function's arguments. The
    fingerprint is the canonical form of the arguments, narrowed by ``fields`` or
    ``exclude`` (argument names; for a function of one argument, the top-level
    keys of the message it receives), or the canonical form of what
    ``fingerprint(*args, **kwargs)`` returns. The same key with another
    fingerprint raises ``KeyReused``; a repeat during the first run raises
    ``KeyInUse``. The result must be JSON-serialisable; repeats get it decoded
    from JSON (tuples come back as lists). An exception records nothing.

    In lease mode, ``resolver`` says what happened to a run whose lease was lost
    (``idempotency.resolvers``); a "done" answer's response body is the JSON result
    repeats get.
    """

    def decorator(func: F) -> F:
        guard = CallGuard(
            name=operation or f"{func.__module__}.{func.__qualname__}",
            scope=scope,
            key=key,
            signature=inspect.signature(func),
            fingerprint=fingerprint,
            fields=fields,
            exclude=exclude,
            mode=mode,
            lease_seconds=lease_seconds,
            lock_timeout=lock_timeout,
            resolver=resolver,
            in_flight=in_flight,
        )

        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return guard.run(lambda: func(*args, **kwargs), args, kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


@dataclass(frozen=True)
class CallGuard:
    """One function's idempotency options, applied to each call of it."""

    name: str
    scope: str | ArgsTo
    key: ArgsTo
    signature: inspect.Signature
    fingerprint: Callable[..., Any] | None = None
    fields: Collection[str] | None = None
    exclude: Collection[str] = ()
    mode: Mode | None = None
    lease_seconds: float | None = None
    lock_timeout: float | None = None
    resolver: ResolverSpec | None = None
    in_flight: InFlight | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode should be one of {MODES}, not {self.mode!r}.")
        check_in_flight(self.in_flight, None)
        if self.fingerprint is not None and (self.fields is not None or self.exclude):
            raise ValueError(f"{self.name}: give fingerprint, or fields/exclude, not both.")
        allowed = _argument_names(self.signature)
        for kind, names in (("fields", self.fields or ()), ("exclude", self.exclude)):
            if isinstance(names, str):
                raise ValueError(f"{self.name}: {kind} should be a list of names, not a string.")
            unknown = sorted(set(names) - allowed) if allowed is not None else []
            if unknown:
                raise ValueError(
                    f"{self.name}: {kind} should name its arguments, not {', '.join(unknown)}."
                )
        if self.resolver is not None:
            register(self.name, self.resolver)  # recovery finds it in any process that imports it

    def run(self, work: Callable[[], T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        """Run ``work`` (the call of the guarded function with these arguments) at most once."""
        with tracing.span(self.name, self.mode or idempotency_settings.MODE):
            return self._run(work, args, kwargs)

    def _run(self, work: Callable[[], T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        validate_settings()
        bound = self.signature.bind(*args, **kwargs)  # a TypeError before any record
        bound.apply_defaults()
        call_key = checked_key(_call(self.key, bound, args, kwargs), self.key, self.name)
        validate_key(call_key, max_length=idempotency_settings.MAX_KEY_LENGTH)
        scope = self.scope
        if callable(scope):
            scope = _call(scope, bound, args, kwargs)
            if not (isinstance(scope, str) and scope):
                raise ValueError(
                    f"The scope function of {self.name} returned {scope!r}: it should return "
                    "the scope as a non-empty string."
                )
        call = Operation(
            scope=scope,
            key=call_key,
            request_hash=self.request_hash(args, kwargs),
            name=self.name,
            mode=self.mode or idempotency_settings.MODE,  # type: ignore[arg-type]
            lease_seconds=self.lease_seconds,
            lock_timeout=self.lock_timeout,
            resolver=self.resolver,
            in_flight=self.in_flight,
        )
        return execute(call, lambda attempt: work(), decide=_record_result, replay=_stored_result)

    def request_hash(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if self.fingerprint is not None:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return fingerprint([canonical(_call(self.fingerprint, bound, args, kwargs))])
        # By name, whether passed positionally or as keywords: f(a, b) is f(x=a, y=b).
        arguments = _named_arguments(self.signature, args, kwargs)
        return fingerprint([canonical(arguments, include=self.fields, exclude=self.exclude)])


def _call(
    function: Callable[..., T],
    bound: inspect.BoundArguments,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    """Call a key, scope or fingerprint function with the call's arguments.

    By name when it takes them (``lambda order_ref, **_: order_ref`` gets the same
    ``order_ref`` from ``f("A", 1)`` and ``f(order_ref="A", amount=1)``), else
    positionally in the guarded function's order, else exactly as the call passed them.
    """
    by_name = dict(bound.arguments)
    for parameter in bound.signature.parameters.values():
        if parameter.kind is parameter.VAR_KEYWORD:
            by_name.update(by_name.pop(parameter.name, {}))
    has_var_positional = any(
        p.kind is p.VAR_POSITIONAL for p in bound.signature.parameters.values()
    )
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin such as operator.itemgetter
        return function(*bound.args, **bound.kwargs)
    candidates: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    if not has_var_positional:
        candidates.append(((), by_name))
    candidates += [(bound.args, bound.kwargs), (args, kwargs)]
    for positional, named in candidates:
        try:
            signature.bind(*positional, **named)
        except TypeError:
            continue
        return function(*positional, **named)
    return function(*args, **kwargs)  # raises the TypeError that says what is wrong


def _message_parameter(signature: inspect.Signature) -> str | None:
    """The parameter of a function of one message (an event dict), if it is one."""
    parameters = list(signature.parameters.values())
    if len(parameters) == 1 and parameters[0].kind not in _VARIADIC:
        return parameters[0].name
    return None


def _argument_names(signature: inspect.Signature) -> set[str] | None:
    """The names ``fields``/``exclude`` may use; ``None``: any (a message's keys, ``**kwargs``)."""
    parameters = signature.parameters.values()
    if _message_parameter(signature) or any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind is not p.VAR_POSITIONAL}


def _named_arguments(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The call's arguments by name, however passed; a lone message is itself the data."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    message = _message_parameter(signature)
    if message is not None:
        return bound.arguments[message]
    named = dict(bound.arguments)
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.VAR_KEYWORD:
            named.update(named.pop(parameter.name))
    return named


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
