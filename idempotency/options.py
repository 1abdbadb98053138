"""The per-call options, declared once: what every entry point takes.

``IdempotencyOptions`` holds them (names, types, defaults, validation) for the
Django and ninja decorators, ``idempotent_function``, ``IdempotentTask``,
``idempotent_task`` and the DRF mixins. ``OptionArgs`` is the same list as
keyword arguments, for ``**options: Unpack[OptionArgs]``: a type checker cannot
derive one from the other, so the two stand together here and a test keeps them
alike. Adding an option is an edit of both, of ``APPLIES`` below, and of its docs.

``None`` (and ``()`` for ``exclude``) means "use the ``IDEMPOTENCY`` setting".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypedDict

from idempotency.conf import (
    ERROR_FORMATS,
    IN_FLIGHT,
    MODES,
    InFlight,
    Mode,
    is_header_name,
)

if TYPE_CHECKING:
    from django.http.response import HttpResponseBase

    from idempotency.models import Status
    from idempotency.resolvers import ResolverSpec


class OptionArgs(TypedDict, total=False):
    """The options as keyword arguments; see ``IdempotencyOptions`` for their meaning."""

    operation: str | None
    header: str | None
    required: bool | None
    key: Callable[..., str | None] | str | None
    scope: Callable[..., str] | str | None
    fingerprint: Callable[..., Any] | str | None
    fields: Collection[str] | None
    exclude: Collection[str]
    mode: Mode | None
    lease_seconds: float | None
    lock_timeout: float | None
    outcome_policy: Callable[[HttpResponseBase], Status | None] | str | None
    resolver: ResolverSpec | None
    wait_seconds: float | None
    in_flight: InFlight | None
    using: str | None
    error_format: str | Callable[..., HttpResponseBase] | None


@dataclass(frozen=True)
class IdempotencyOptions:
    """One entry point's options; ``None`` means "use the ``IDEMPOTENCY`` setting".

    ``key``, ``scope`` and ``fingerprint`` are callables (or dotted paths to them)
    of the request for a view, of the arguments for a function or task (whose
    ``scope`` may also be the scope itself, a string).
    """

    operation: str | None = None
    header: str | None = None
    required: bool | None = None
    key: Callable[..., str | None] | str | None = None
    scope: Callable[..., str] | str | None = None
    fingerprint: Callable[..., Any] | str | None = None
    fields: Collection[str] | None = None
    exclude: Collection[str] = ()
    mode: Mode | None = None
    lease_seconds: float | None = None
    lock_timeout: float | None = None
    outcome_policy: Callable[[HttpResponseBase], Status | None] | str | None = None
    resolver: ResolverSpec | None = None
    wait_seconds: float | None = None
    in_flight: InFlight | None = None
    # The database alias of the records (and, in atomic mode, of the work's writes):
    # None asks the DATABASE setting, else the router (docs/databases.md).
    using: str | None = None
    # How this view's protocol errors are rendered: "problem", "drf", or a renderer
    # ``(request, error, status) -> response`` (or its dotted path); None: ERROR_FORMAT.
    error_format: str | Callable[..., HttpResponseBase] | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode should be one of {MODES}, not {self.mode!r}.")
        if self.header is not None and not is_header_name(self.header):
            raise ValueError(
                f"header should be an HTTP header name such as 'Idempotency-Key', not "
                f"{self.header!r}: a token of letters, digits and !#$%&'*+-.^_`|~ (RFC 9110)."
            )
        if self.wait_seconds is not None and not self.wait_seconds >= 0:
            raise ValueError(f"wait_seconds should be a number >= 0, not {self.wait_seconds!r}.")
        if self.in_flight is not None and self.in_flight not in IN_FLIGHT:
            raise ValueError(f"in_flight should be one of {IN_FLIGHT}, not {self.in_flight!r}.")
        if not _error_format_shape(self.error_format):
            raise ValueError(
                "error_format should be 'problem', 'drf', a callable (request, error, status) "
                f"-> response or its dotted path, not {self.error_format!r}."
            )
        if self.in_flight == "run" and self.mode == "lease":
            raise ValueError(RUN_IN_LEASE_MODE)
        if self.in_flight == "conflict" and self.wait_seconds:
            raise ValueError(
                "in_flight='conflict' answers 409 at once: give it or wait_seconds, not both."
            )


RUN_IN_LEASE_MODE = (
    "in_flight='run' lets duplicates run their work before one is recorded, which only "
    "atomic mode can take back (the losers' writes roll back): give lease mode "
    "in_flight='wait' or 'conflict'."
)


def _error_format_shape(value: object) -> bool:
    # A dotted path is imported when an error is first rendered (idempotency.adapters).
    return (
        value is None
        or callable(value)
        or (isinstance(value, str) and "." in value)
        or (value in ERROR_FORMATS)
    )


OPTION_NAMES: tuple[str, ...] = tuple(field.name for field in fields(IdempotencyOptions))

# Which entry point takes which option. A function's or task's call has no header,
# no response to judge or render, and its operation is its name (a task's, Celery's name).
_FUNCTION = frozenset(OPTION_NAMES) - {"header", "required", "outcome_policy", "error_format"}
APPLIES: Mapping[str, frozenset[str]] = {
    "idempotent": frozenset(OPTION_NAMES),
    "ninja": frozenset(OPTION_NAMES),
    "idempotent_function": _FUNCTION,
    "IdempotentTask": _FUNCTION - {"operation"},
    "idempotent_task": _FUNCTION,
    # key, scope, fingerprint and outcome_policy: the view's get_idempotency_* hooks.
    "IdempotentMixin": frozenset(OPTION_NAMES) - {"key", "scope", "fingerprint", "outcome_policy"},
}

ATTRIBUTE_PREFIX = "idempotency_"


def refuse_unknown(entry_point: str, given: Collection[str], spelling: str = "{}") -> None:
    """A ``TypeError`` naming the options ``entry_point`` does not take, if ``given`` has any."""
    unknown = sorted(set(given) - APPLIES[entry_point])
    if unknown:
        taken = ", ".join(spelling.format(name) for name in sorted(APPLIES[entry_point]))
        wrong = ", ".join(spelling.format(name) for name in unknown)
        raise TypeError(f"{entry_point} takes no {wrong}; its options are {taken}.")


def options_from_attributes(entry_point: str, owner: Any, **given: Any) -> IdempotencyOptions:
    """The options set as ``idempotency_<name>`` attributes of ``owner`` (a class), validated.

    A DRF view's and a Celery task's way to set them. An ``idempotency_*`` attribute
    that names no option of ``entry_point`` is refused (a typo would be ignored).
    ``given`` wins over the attributes.
    """
    found = {
        name[len(ATTRIBUTE_PREFIX) :]
        for klass in type.mro(owner)
        for name in vars(klass)
        if name.startswith(ATTRIBUTE_PREFIX)
    }
    refuse_unknown(entry_point, found - _EXTRA_ATTRIBUTES, ATTRIBUTE_PREFIX + "{}")
    names = found & APPLIES[entry_point]
    values = {name: _static(owner, ATTRIBUTE_PREFIX + name) for name in names}
    return IdempotencyOptions(**{**values, **given})


# Attributes of the entry points' own that share the prefix but are not options.
_EXTRA_ATTRIBUTES = frozenset({"resolved_actions"})


def _static(owner: Any, name: str) -> Any:
    # Read a function stored on the class as given, not as a method bound to it.
    for klass in type.mro(owner):
        if name in vars(klass):
            value = vars(klass)[name]
            return value.__func__ if isinstance(value, staticmethod) else value
    raise AttributeError(name)
