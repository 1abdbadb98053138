"""System checks for the ``IDEMPOTENCY`` setting (ids ``idempotency.E001``...)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, router

from idempotency.conf import DEFAULTS, FORBIDDEN_REPLAY_HEADERS, load_callable
from idempotency.models import PURGEABLE, IdempotencyRecord

Check = Callable[[dict[str, Any]], list[CheckMessage]]


@register(Tags.compatibility)
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    user = getattr(settings, "IDEMPOTENCY", {})
    if not isinstance(user, dict):
        return [Error("IDEMPOTENCY should be a dict.", id="idempotency.E001")]
    messages: list[CheckMessage] = []
    for check in CHECKS:
        messages.extend(check(user))
    return messages


def _unknown_keys(user: dict[str, Any]) -> list[CheckMessage]:
    unknown = sorted(set(user) - set(DEFAULTS))
    if not unknown:
        return []
    return [
        Error(
            f"IDEMPOTENCY has unknown keys: {', '.join(unknown)}.",
            hint=f"Valid keys are: {', '.join(sorted(DEFAULTS))}.",
            id="idempotency.E002",
        )
    ]


def _string(name: str, error_id: str) -> Check:
    def check(user: dict[str, Any]) -> list[CheckMessage]:
        value = user.get(name, DEFAULTS[name])
        if isinstance(value, str) and value:
            return []
        return [Error(f"IDEMPOTENCY[{name!r}] should be a non-empty string.", id=error_id)]

    return check


def _positive_number(name: str, error_id: str, *, integer: bool = False) -> Check:
    def check(user: dict[str, Any]) -> list[CheckMessage]:
        value = user.get(name, DEFAULTS[name])
        number = isinstance(value, int) or (not integer and isinstance(value, float))
        if number and not isinstance(value, bool) and value > 0:
            return []
        noun = "a positive integer" if integer else "a positive number"
        return [Error(f"IDEMPOTENCY[{name!r}] should be {noun}.", id=error_id)]

    return check


def _non_negative_number(name: str, error_id: str) -> Check:
    def check(user: dict[str, Any]) -> list[CheckMessage]:
        value = user.get(name, DEFAULTS[name])
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return []
        return [Error(f"IDEMPOTENCY[{name!r}] should be a number >= 0.", id=error_id)]

    return check


def _boolean(name: str, error_id: str) -> Check:
    def check(user: dict[str, Any]) -> list[CheckMessage]:
        if isinstance(user.get(name, DEFAULTS[name]), bool):
            return []
        return [Error(f"IDEMPOTENCY[{name!r}] should be True or False.", id=error_id)]

    return check


def _choice(name: str, choices: Sequence[str], error_id: str) -> Check:
    def check(user: dict[str, Any]) -> list[CheckMessage]:
        if user.get(name, DEFAULTS[name]) in choices:
            return []
        return [
            Error(
                f"IDEMPOTENCY[{name!r}] should be one of {', '.join(map(repr, choices))}.",
                id=error_id,
            )
        ]

    return check


def _callable_path(name: str, error_id: str) -> Check:
    def check(user: dict[str, Any]) -> list[CheckMessage]:
        try:
            load_callable(user.get(name, DEFAULTS[name]), name)
        except (ImproperlyConfigured, ValueError) as exc:
            return [
                Error(
                    f"IDEMPOTENCY[{name!r}] should be a callable or the dotted path of one.",
                    hint=str(exc),
                    id=error_id,
                )
            ]
        return []

    return check


def _max_key_length(user: dict[str, Any]) -> list[CheckMessage]:
    # A longer key would pass validation and then fail the insert (a 500 on PostgreSQL).
    column = IdempotencyRecord._meta.get_field("idem_key").max_length or 255
    value = user.get("MAX_KEY_LENGTH", DEFAULTS["MAX_KEY_LENGTH"])
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= column:
        return []
    return [
        Error(
            f"IDEMPOTENCY['MAX_KEY_LENGTH'] should be an integer from 1 to {column}.",
            hint=f"Keys are stored in a column of {column} characters.",
            id="idempotency.E004",
        )
    ]


def _replay_headers(user: dict[str, Any]) -> list[CheckMessage]:
    names = user.get("REPLAY_HEADERS", DEFAULTS["REPLAY_HEADERS"])
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        return [
            Error(
                "IDEMPOTENCY['REPLAY_HEADERS'] should be a list of strings.", id="idempotency.E012"
            )
        ]
    forbidden = sorted(n for n in names if n.lower() in FORBIDDEN_REPLAY_HEADERS)
    if forbidden:
        return [
            Error(
                f"IDEMPOTENCY['REPLAY_HEADERS'] should not name per-session headers: "
                f"{', '.join(forbidden)}.",
                hint="Cookies and credentials are never stored or replayed; remove them.",
                id="idempotency.E013",
            )
        ]
    return []


def _retention(user: dict[str, Any]) -> list[CheckMessage]:
    per_operation = user.get("OPERATION_RETENTION", {})
    windows = [user.get("RETENTION", {})]
    windows += list(per_operation.values()) if isinstance(per_operation, dict) else [None]
    if all(_valid_window(window) for window in windows):
        return []
    return [
        Error(
            "IDEMPOTENCY['RETENTION'] and each IDEMPOTENCY['OPERATION_RETENTION'] value should "
            "map SUCCEEDED, FAILED_FINAL or FAILED_RETRYABLE to seconds (a number >= 0) or None.",
            hint="PROCESSING and NEEDS_REVIEW records are never purged.",
            id="idempotency.E014",
        )
    ]


def _valid_window(window: Any) -> bool:
    return isinstance(window, dict) and all(
        status in PURGEABLE
        and (
            seconds is None or (isinstance(seconds, (int, float)) and not isinstance(seconds, bool))
        )
        and (seconds is None or seconds >= 0)
        for status, seconds in window.items()
    )


def _resolvers(user: dict[str, Any]) -> list[CheckMessage]:
    resolvers = user.get("RESOLVERS", {})
    if not isinstance(resolvers, dict):
        return [Error("IDEMPOTENCY['RESOLVERS'] should be a dict.", id="idempotency.E015")]
    messages: list[CheckMessage] = []
    for operation, path in resolvers.items():
        try:
            load_callable(path, f"RESOLVERS[{operation!r}]")
        except (ImproperlyConfigured, ValueError) as exc:
            messages.append(
                Error(
                    f"IDEMPOTENCY['RESOLVERS'][{operation!r}] should be a callable or the "
                    "dotted path of one.",
                    hint=str(exc),
                    id="idempotency.E016",
                )
            )
    return messages


def _database(user: dict[str, Any]) -> list[CheckMessage]:
    alias = user.get("DATABASE")
    if alias is None or alias in settings.DATABASES:
        return []
    return [
        Error(
            f"IDEMPOTENCY['DATABASE'] should name an alias of DATABASES, not {alias!r}.",
            hint="The record must live in the same database as the business data.",
            id="idempotency.E017",
        )
    ]


def drf_installed() -> bool:
    try:
        import_module("rest_framework")
    except ImportError:
        return False
    return True


def _drf_error_format(user: dict[str, Any]) -> list[CheckMessage]:
    if user.get("ERROR_FORMAT") != "drf" or drf_installed():
        return []
    return [
        Error(
            "IDEMPOTENCY['ERROR_FORMAT'] = 'drf' needs Django REST framework, which is not "
            "installed.",
            hint="pip install 'django-idempotency[drf]', or use the default 'problem' format.",
            id="idempotency.E028",
        )
    ]


def _lease_mode_under_atomic_requests(user: dict[str, Any]) -> list[CheckMessage]:
    # The request's transaction would hold the claim until the response: lease mode
    # would silently become atomic mode, its lease and fencing of no use.
    if user.get("MODE") != "lease":
        return []
    alias = user.get("DATABASE") or router.db_for_write(IdempotencyRecord) or DEFAULT_DB_ALIAS
    if not settings.DATABASES.get(alias, {}).get("ATOMIC_REQUESTS"):
        return []
    return [
        Warning(
            f"IDEMPOTENCY['MODE'] is 'lease' but DATABASES[{alias!r}]['ATOMIC_REQUESTS'] is "
            "True: each claim would commit only with its request, as in atomic mode.",
            hint="Decorate the protected views with @transaction.non_atomic_requests (a "
            "lease-mode request in a request transaction raises ImproperlyConfigured), "
            "or leave MODE at 'atomic'.",
            id="idempotency.W001",
        )
    ]


# Caches whose entries live in one process: an operator's change, made in
# another process, could not reach them.
_PROCESS_LOCAL_CACHES = (
    "django.core.cache.backends.locmem.LocMemCache",
    "django.core.cache.backends.dummy.DummyCache",
)


def _replay_cache(user: dict[str, Any]) -> list[CheckMessage]:
    alias = user.get("REPLAY_CACHE")
    if alias is None:
        return []
    if not isinstance(alias, str) or alias not in settings.CACHES:
        return [
            Error(
                f"IDEMPOTENCY['REPLAY_CACHE'] should name an alias of CACHES or be None, "
                f"not {alias!r}.",
                hint="Add the cache to CACHES (a shared one: Redis, Memcached, the database).",
                id="idempotency.E029",
            )
        ]
    backend = settings.CACHES[alias].get("BACKEND", "")
    if backend in _PROCESS_LOCAL_CACHES:
        return [
            Warning(
                f"IDEMPOTENCY['REPLAY_CACHE'] should name a cache shared by every process, "
                f"not {backend}.",
                hint="An operator's change in one process could not reach the others' "
                "entries: use Redis, Memcached or the database cache.",
                id="idempotency.W002",
            )
        ]
    return []


CHECKS: list[Check] = [
    _unknown_keys,
    _string("HEADER", "idempotency.E003"),
    _max_key_length,
    _boolean("REQUIRE_KEY", "idempotency.E005"),
    _choice("MODE", ("atomic", "lease"), "idempotency.E006"),
    _positive_number("LOCK_TIMEOUT", "idempotency.E007"),
    _positive_number("RETRY_AFTER", "idempotency.E008", integer=True),
    _positive_number("LEASE_SECONDS", "idempotency.E009"),
    _positive_number("MAX_RESPONSE_BYTES", "idempotency.E010", integer=True),
    _choice("ERROR_FORMAT", ("problem", "drf"), "idempotency.E011"),
    _replay_headers,
    _retention,
    _resolvers,
    _database,
    _callable_path("SCOPE_FUNCTION", "idempotency.E018"),
    _callable_path("FINGERPRINT_FUNCTION", "idempotency.E019"),
    _callable_path("OUTCOME_POLICY", "idempotency.E020"),
    _positive_number("MAX_RESOLVE_ATTEMPTS", "idempotency.E021", integer=True),
    _boolean("RELEASE_EXPIRED_WITHOUT_RESOLVER", "idempotency.E022"),
    _positive_number("RECOVERY_BATCH_SIZE", "idempotency.E023", integer=True),
    _positive_number("PURGE_BATCH_SIZE", "idempotency.E024", integer=True),
    _positive_number("RESOLVE_RETRY_SECONDS", "idempotency.E025"),
    _non_negative_number("WAIT_SECONDS", "idempotency.E026"),
    _positive_number("MAX_WAITERS", "idempotency.E027", integer=True),
    _drf_error_format,
    _lease_mode_under_atomic_requests,
    _replay_cache,
    _choice("READ_FIRST", ("auto", "always", "never"), "idempotency.E030"),
]
