"""``@idempotent_function``: the plain-Python entry point, for consumers and tasks.

A message handler keyed by a stable event id runs its effect once; every
redelivery returns the first run's (JSON) result without running again.
``idempotency.celery.IdempotentTask`` applies the same ``CallGuard`` to Celery tasks.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder

from idempotency import tracing
from idempotency.conf import idempotency_settings
from idempotency.fingerprint import canonical, digest_of, fingerprint
from idempotency.keys import call_key_function, checked_key, validate_key
from idempotency.models import IdempotencyRecord, Status
from idempotency.operations import declare
from idempotency.options import IdempotencyOptions, refuse_unknown
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Attempt, Operation
from idempotency.protocol.execute import execute
from idempotency.resolvers import register

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from idempotency.options import OptionArgs

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def idempotent_function(**options: Unpack[OptionArgs]) -> Callable[[F], F]:
    """Run the decorated function once per (scope, key); repeats return the first result.

    Takes the options of ``idempotency.options`` that ``APPLIES`` gives it;
    ``scope`` and ``key`` are required. ``key`` (and ``scope``, when callable)
    receive the function's arguments. The
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
    refuse_unknown("idempotent_function", options)
    given = IdempotencyOptions(**options)

    def decorator(func: F) -> F:
        guard = CallGuard(
            name=given.operation or f"{func.__module__}.{func.__qualname__}",
            signature=inspect.signature(func),
            options=given,
        )

        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return guard.run(lambda: func(*args, **kwargs), args, kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


@dataclass(frozen=True)
class CallGuard:
    """One function's idempotency options, applied to each call of it.

    ``options.key`` is a function of the call's arguments; ``options.scope`` is
    one too, or the scope itself.
    """

    name: str
    signature: inspect.Signature
    options: IdempotencyOptions

    def __post_init__(self) -> None:
        options = self.options
        if not callable(options.key):
            raise TypeError(
                f"{self.name}: give key=, a function of the arguments that returns the key."
            )
        if not (callable(options.scope) or (isinstance(options.scope, str) and options.scope)):
            raise TypeError(
                f"{self.name}: give scope=, the scope (a string) or a function of the "
                "arguments that returns it."
            )
        if options.fingerprint is not None and (options.fields is not None or options.exclude):
            raise ValueError(f"{self.name}: give fingerprint, or fields/exclude, not both.")
        allowed = _argument_names(self.signature)
        for kind, names in (("fields", options.fields or ()), ("exclude", options.exclude)):
            if isinstance(names, str):
                raise ValueError(f"{self.name}: {kind} should be a list of names, not a string.")
            unknown = sorted(set(names) - allowed) if allowed is not None else []
            if unknown:
                raise ValueError(
                    f"{self.name}: {kind} should name its arguments, not {', '.join(unknown)}."
                )
        declare(self.name)
        if options.resolver is not None:
            register(self.name, options.resolver)  # recovery finds it in any process importing it

    def run(self, work: Callable[[], T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        """Run ``work`` (the call of the guarded function with these arguments) at most once."""
        with tracing.span(self.name, self.options.mode or idempotency_settings.MODE):
            return self._run(work, args, kwargs)

    def _run(self, work: Callable[[], T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        options = self.options
        bound = self.signature.bind(*args, **kwargs)  # a TypeError before any record
        bound.apply_defaults()
        key: Callable[..., Any] = options.key  # type: ignore[assignment]  # checked callable
        found = call_key_function(key, lambda: _call(key, bound, args, kwargs), self.name)
        call_key = checked_key(found, key, self.name)
        validate_key(call_key, max_length=idempotency_settings.MAX_KEY_LENGTH)
        scope = self._scope(bound, args, kwargs)
        call = Operation.of(options, scope, call_key, self.request_hash(args, kwargs), self.name)
        return execute(call, lambda attempt: work(), decide=_record_result, replay=_stored_result)

    def _scope(
        self, bound: inspect.BoundArguments, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> str:
        scope = self.options.scope
        if not callable(scope):
            return str(scope)
        scope = _call(scope, bound, args, kwargs)
        if not (isinstance(scope, str) and scope):
            raise ValueError(
                f"The scope function of {self.name} returned {scope!r}: it should return "
                "the scope as a non-empty string."
            )
        return scope

    def request_hash(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        options = self.options
        if options.fingerprint is not None:
            function: Callable[..., Any] = options.fingerprint  # type: ignore[assignment]
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return digest_of(fingerprint([canonical(_call(function, bound, args, kwargs))]))
        # By name, whether passed positionally or as keywords: f(a, b) is f(x=a, y=b).
        arguments = _named_arguments(self.signature, args, kwargs)
        return digest_of(
            fingerprint([canonical(arguments, include=options.fields, exclude=options.exclude)])
        )


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
    # No body, or an empty one (an operator marked the call succeeded without a result): None.
    return json.loads(bytes(record.response_body)) if record.response_body else None
