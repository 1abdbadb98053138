"""Lazy access to the ``IDEMPOTENCY = {...}`` settings dict.

Nothing is read at import time. Each setting is read from ``django.conf.settings``
on its first access, converted, and kept: the hot path reads a dozen settings
per request. The kept values are dropped whenever ``setting_changed`` says
``IDEMPOTENCY`` changed (``override_settings``, pytest-django's ``settings``),
so every change made through Django is seen at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from functools import lru_cache
from typing import Any, Generic, Literal, TypeVar, overload

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

# The choices of MODE and IN_FLIGHT, as settings and as per-call options alike.
Mode = Literal["atomic", "lease"]
MODES: tuple[Mode, ...] = ("atomic", "lease")
# What a duplicate of an attempt still in flight gets: "wait" (atomic mode: for the
# row lock, up to LOCK_TIMEOUT, then the outcome; lease mode: WAIT_SECONDS) or
# "conflict" (409 with Retry-After at once, as the draft says a server SHOULD) or, in
# atomic mode only, "run" (it runs its own attempt; the record is written once, at the
# end of the transaction, and the first to commit is the outcome every other answers).
InFlight = Literal["wait", "conflict", "run"]
IN_FLIGHT: tuple[InFlight, ...] = ("wait", "conflict", "run")

DEFAULTS: dict[str, Any] = {
    "HEADER": "Idempotency-Key",
    "MAX_KEY_LENGTH": 255,
    "REQUIRE_KEY": True,
    "MODE": "atomic",
    "LOCK_TIMEOUT": 2.0,
    "RETRY_AFTER": 1,
    "WAIT_SECONDS": 0.0,
    "IN_FLIGHT": "wait",
    "MAX_WAITERS": 8,
    "LEASE_SECONDS": 60.0,
    "MAX_RESPONSE_BYTES": 256 * 1024,
    "MAX_BODY_DEPTH": 100,
    "REPLAY_HEADERS": [
        "Content-Type",
        "Content-Language",
        "Location",
        "Link",
        "ETag",
        "Last-Modified",
    ],
    "SCOPE_FUNCTION": "idempotency.http.default_scope",
    "FINGERPRINT_FUNCTION": "idempotency.http.default_fingerprint",
    "OUTCOME_POLICY": "idempotency.http.default_outcome_policy",
    "ERROR_FORMAT": "problem",
    # Stripe's name; the IETF draft's conformance profile checks "Idempotency-Replayed".
    "REPLAYED_HEADER": "Idempotent-Replayed",
    "DATABASE": None,
    "TRANSACTION_POOLING": None,
    "RESOLVERS": {},
    "MAX_RESOLVE_ATTEMPTS": 5,
    "RESOLVE_RETRY_SECONDS": 60.0,
    "RELEASE_EXPIRED_WITHOUT_RESOLVER": False,
    "RECOVERY_BATCH_SIZE": 100,
    # An upper bound: purge sizes each batch by PURGE_BATCH_SECONDS, and on PostgreSQL a
    # batch of 100,000 rows took 0.2 s (docs/retention.md).
    "PURGE_BATCH_SIZE": 100_000,
    "PURGE_BATCH_SECONDS": 0.25,
    "RETENTION": {
        "SUCCEEDED": 24 * 3600,
        "FAILED_FINAL": 24 * 3600,
        "FAILED_RETRYABLE": 24 * 3600,
    },
    "OPERATION_RETENTION": {},
    # How long the providers that step keys are sent to remember a key (Stripe: 24 hours).
    # A retryable record kept for less loses its seed while the provider would still have
    # answered a retry from the first call (check idempotency.W010); a lost attempt whose
    # first step key is older is not released by steps.effects_carry_step_keys.
    "STEP_KEY_WINDOW": 24 * 3600,
    "REPLAY_CACHE": None,
    "READ_FIRST": "auto",
    "SHARDS": None,
    "WRITE_GUARD": None,
}

# The response header that says a replay's body was not stored (``MAX_RESPONSE_BYTES``):
# ``Idempotency-Replay: omitted``, as the IETF draft's community profile names it.
OMITTED_HEADER = "Idempotency-Replay"

# Headers that carry a session or a credential: never stored, never replayed,
# whatever REPLAY_HEADERS says.
FORBIDDEN_REPLAY_HEADERS = frozenset(
    {
        "set-cookie",
        "cookie",
        "authorization",
        "proxy-authorization",
        "www-authenticate",
        "proxy-authenticate",
        "x-csrftoken",
        "idempotent-replayed",
    }
)


# RFC 9110 section 5.1: a field name is a token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def is_header_name(value: object) -> bool:
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None


V = TypeVar("V")


class _Setting(Generic[V]):
    """A property of ``Settings``: the converted value, read once and kept until a change.

    Kept in the instance's ``__dict__``, which shadows this (non-data)
    descriptor: every later read is a plain attribute lookup.
    """

    def __init__(self, convert: Callable[[Any], V]) -> None:
        self.convert = convert

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> _Setting[V]: ...
    @overload
    def __get__(self, instance: Settings, owner: type) -> V: ...
    def __get__(self, instance: Settings | None, owner: type) -> V | _Setting[V]:
        if instance is None:
            return self
        value = self.convert(instance._get(self.name))
        instance.__dict__[self.name] = value
        return value


# The ERROR_FORMAT names; any other value is a renderer, a callable or its dotted path.
ERROR_FORMATS = ("problem", "drf")


def error_format(value: Any, setting: str = "ERROR_FORMAT") -> str | Callable[..., Any]:
    """``"problem"``, ``"drf"``, or the renderer ``value`` is or names."""
    if isinstance(value, str) and value in ERROR_FORMATS:
        return value
    render = load_callable(value, setting)
    if not callable(render):
        raise ImproperlyConfigured(f"IDEMPOTENCY[{setting!r}] = {value!r} is not callable.")
    return render


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _optional_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _replay_headers(names: Sequence[str]) -> frozenset[str]:
    return frozenset(name.lower() for name in names) - FORBIDDEN_REPLAY_HEADERS


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _retention(value: Any) -> dict[str, float]:
    merged = dict(DEFAULTS["RETENTION"])
    merged.update(value)
    return merged


class Settings:
    # Whether ``settings_checks.validate_settings`` passed since the settings last
    # changed: the entry points validate while it is false, once, not per call.
    validated = False

    def _get(self, name: str) -> Any:
        user = getattr(django_settings, "IDEMPOTENCY", None)
        if not isinstance(user, Mapping):
            # Not a dict: check idempotency.E001 says so (and requests refuse to run, see
            # settings_checks.validate_settings); what reads a setting on import gets the default.
            return DEFAULTS[name]
        return user.get(name, DEFAULTS[name])

    def reload(self) -> None:
        """Forget the kept values: the next access reads ``settings.IDEMPOTENCY`` again."""
        for name in [name for name in vars(self) if name in DEFAULTS]:
            del self.__dict__[name]
        self.validated = False

    HEADER = _Setting(str)
    MAX_KEY_LENGTH = _Setting(int)
    REQUIRE_KEY = _Setting(bool)
    MODE = _Setting(str)
    LOCK_TIMEOUT = _Setting(float)
    RETRY_AFTER = _Setting(int)
    WAIT_SECONDS = _Setting(float)
    IN_FLIGHT = _Setting(str)
    MAX_WAITERS = _Setting(int)
    LEASE_SECONDS = _Setting(float)
    MAX_RESPONSE_BYTES = _Setting(int)
    MAX_BODY_DEPTH = _Setting(int)
    REPLAY_HEADERS = _Setting(_replay_headers)
    SCOPE_FUNCTION = _Setting(lambda value: load_callable(value, "SCOPE_FUNCTION"))
    FINGERPRINT_FUNCTION = _Setting(lambda value: load_callable(value, "FINGERPRINT_FUNCTION"))
    OUTCOME_POLICY = _Setting(lambda value: load_callable(value, "OUTCOME_POLICY"))
    ERROR_FORMAT = _Setting(error_format)
    REPLAYED_HEADER = _Setting(str)
    DATABASE = _Setting(_optional_str)
    TRANSACTION_POOLING = _Setting(_optional_bool)
    RESOLVERS: _Setting[dict[str, str]] = _Setting(dict)
    MAX_RESOLVE_ATTEMPTS = _Setting(int)
    RESOLVE_RETRY_SECONDS = _Setting(float)
    RELEASE_EXPIRED_WITHOUT_RESOLVER = _Setting(bool)
    RECOVERY_BATCH_SIZE = _Setting(int)
    PURGE_BATCH_SIZE = _Setting(int)
    PURGE_BATCH_SECONDS = _Setting(float)
    RETENTION = _Setting(_retention)
    OPERATION_RETENTION: _Setting[dict[str, dict[str, float]]] = _Setting(dict)
    STEP_KEY_WINDOW = _Setting(_optional_float)
    REPLAY_CACHE = _Setting(_optional_str)
    READ_FIRST = _Setting(str)
    SHARDS = _Setting(lambda value: None if value is None else tuple(value))
    WRITE_GUARD = _Setting(_optional_bool)


def load_callable(value: Any, setting: str) -> Callable[..., Any]:
    if callable(value):
        return value
    return _import(str(value), setting)


@lru_cache(maxsize=64)
def _import(path: str, setting: str) -> Callable[..., Any]:
    try:
        return import_string(path)  # type: ignore[no-any-return]
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"IDEMPOTENCY[{setting!r}] = {path!r} could not be imported: {exc}"
        ) from exc


idempotency_settings = Settings()


def retention_for(operation_name: str, status: str) -> timedelta | None:
    """How long a record in ``status`` is kept; ``None`` means until an operator acts.

    ``OPERATION_RETENTION[operation_name]`` first, then ``RETENTION``.
    """
    overrides = idempotency_settings.OPERATION_RETENTION.get(operation_name, {})
    seconds = overrides.get(status, idempotency_settings.RETENTION.get(status))
    return None if seconds is None else timedelta(seconds=float(seconds))


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "IDEMPOTENCY":
        idempotency_settings.reload()


setting_changed.connect(_reload, dispatch_uid="idempotency.conf.reload")
