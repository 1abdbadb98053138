"""System checks for the ``IDEMPOTENCY`` setting (ids ``idempotency.E001``...)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from importlib import import_module
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, DatabaseError, router
from django.urls import URLPattern, URLResolver, get_resolver

from idempotency.compat import non_atomic_aliases
from idempotency.conf import DEFAULTS, FORBIDDEN_REPLAY_HEADERS, is_header_name, load_callable
from idempotency.models import PURGEABLE, IdempotencyRecord
from idempotency.stores import store_for

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


@register(Tags.urls)
def check_views(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    user = getattr(settings, "IDEMPOTENCY", {})
    return _lease_views_under_atomic_requests(user if isinstance(user, dict) else {})


@register(Tags.database)
def check_database(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """Run by ``migrate`` and ``check --database``: these checks ask the database."""
    user = getattr(settings, "IDEMPOTENCY", {})
    alias = _records_alias(user if isinstance(user, dict) else {})
    if alias not in (databases or ()):
        return []
    return _session_time_zone(alias)


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


def _header(user: dict[str, Any]) -> list[CheckMessage]:
    value = user.get("HEADER", DEFAULTS["HEADER"])
    if is_header_name(value):
        return []
    return [
        Error(
            f"IDEMPOTENCY['HEADER'] should be an HTTP header name, not {value!r}.",
            hint="A header name is a token (RFC 9110): letters, digits and !#$%&'*+-.^_`|~, "
            "no spaces or colons; for example 'Idempotency-Key'.",
            id="idempotency.E003",
        )
    ]


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


def _records_alias(user: dict[str, Any]) -> str:
    alias = user.get("DATABASE") or router.db_for_write(IdempotencyRecord) or DEFAULT_DB_ALIAS
    return str(alias)


def _lease_mode_under_atomic_requests(user: dict[str, Any]) -> list[CheckMessage]:
    # The request's transaction would hold the claim until the response: lease mode
    # would silently become atomic mode, its lease and fencing of no use.
    if user.get("MODE") != "lease":
        return []
    alias = _records_alias(user)
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


def _lease_views_under_atomic_requests(user: dict[str, Any]) -> list[CheckMessage]:
    # What W001 says of a global MODE, for each view that sets mode="lease" itself:
    # its first request would raise ImproperlyConfigured (a 500).
    alias = _records_alias(user)
    if not settings.DATABASES.get(alias, {}).get("ATOMIC_REQUESTS"):
        return []
    messages: list[CheckMessage] = []
    try:
        patterns = get_resolver().url_patterns
    except Exception:
        return []  # Django's own URL checks report a URLconf that does not import
    for route, callback in _url_callbacks(patterns, ""):
        if alias in non_atomic_aliases(callback):
            continue
        for name in _lease_handlers(callback):
            messages.append(
                Error(
                    f"{name} (URL {route or '/'}) runs in lease mode, but "
                    f"DATABASES[{alias!r}]['ATOMIC_REQUESTS'] is True: its claim would only "
                    "commit with the whole request, and each request raises "
                    "ImproperlyConfigured.",
                    hint="Decorate the view with @transaction.non_atomic_requests (outermost, "
                    "above @api_view or on the viewset's as_view()), or use atomic mode.",
                    id="idempotency.E031",
                )
            )
    return messages


def _url_callbacks(
    patterns: Sequence[URLPattern | URLResolver], prefix: str
) -> Iterator[tuple[str, Callable[..., Any]]]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _url_callbacks(pattern.url_patterns, route)
        else:
            yield route, pattern.callback


def _lease_handlers(callback: Callable[..., Any]) -> Iterator[str]:
    """The names of the lease-mode handlers a URL's view function serves."""
    candidates: list[Any] = [callback]
    view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if view_class is not None:
        candidates += [getattr(view_class, method, None) for method in ("post", "put", "patch")]
        candidates += [getattr(view_class, action, None) for action in _actions(callback)]
        if getattr(view_class, "idempotency_mode", None) == "lease":
            yield view_class.__qualname__
    for candidate in list(candidates):
        # What a wrapper closes over: DRF's @api_view handler calls the function given,
        # a django-ninja path view holds its operations.
        for cell in getattr(candidate, "__closure__", None) or ():
            inner = cell.cell_contents
            candidates.append(inner)
            candidates += [
                getattr(op, "view_func", None) for op in getattr(inner, "operations", ())
            ]
    for handler in candidates:
        options = getattr(handler, "idempotency_options", None)
        if getattr(options, "mode", None) == "lease":
            yield getattr(handler, "__qualname__", repr(handler))


def _actions(callback: Callable[..., Any]) -> list[str]:
    actions = getattr(callback, "actions", None)  # a DRF viewset's {method: action}
    return [str(action) for action in actions.values()] if isinstance(actions, dict) else []


def _session_time_zone(alias: str) -> list[CheckMessage]:
    try:
        clock = store_for(alias).clock_offset()
    except DatabaseError:
        return []  # Django's own checks report a database that cannot be reached
    if clock is None or not clock[1]:
        return []
    zone, offset = clock
    return [
        Warning(
            f"The session time zone of DATABASES[{alias!r}] is {zone!r}, {offset} seconds off "
            "UTC: lease ends and the purge's cut-off, computed by the database clock, would be "
            "off by as much (leases seen as expired, fresh records purged).",
            hint="Add 'init_command': \"SET time_zone = '+00:00'\" to the alias's OPTIONS "
            "(docs/databases.md).",
            id="idempotency.W003",
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


def _transaction_pooling(user: dict[str, Any]) -> list[CheckMessage]:
    value = user.get("TRANSACTION_POOLING")
    if value is not None and not isinstance(value, bool):
        return [
            Error(
                f"IDEMPOTENCY['TRANSACTION_POOLING'] should be True, False or None, not {value!r}.",
                hint="None (the default) infers it from DATABASES[alias]"
                "['DISABLE_SERVER_SIDE_CURSORS'] of the records' database.",
                id="idempotency.E033",
            )
        ]
    alias = user.get("DATABASE") or router.db_for_write(IdempotencyRecord) or DEFAULT_DB_ALIAS
    database = settings.DATABASES.get(alias, {})
    cursors_disabled = bool(database.get("DISABLE_SERVER_SIDE_CURSORS"))
    pooled = cursors_disabled if value is None else value
    if not pooled:
        return []
    messages: list[CheckMessage] = []
    if not cursors_disabled:
        messages.append(
            Warning(
                f"IDEMPOTENCY['TRANSACTION_POOLING'] is True but DATABASES[{alias!r}]"
                "['DISABLE_SERVER_SIDE_CURSORS'] is not: behind a pooler in transaction mode, "
                "QuerySet.iterator() would open a cursor on a server connection the next "
                "transaction may not get.",
                hint=f"Set DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] = True.",
                id="idempotency.W005",
            )
        )
    options = database.get("OPTIONS") or {}
    if options.get("server_side_binding") is True and options.get("prepare_threshold") is not None:
        messages.append(
            Warning(
                f"DATABASES[{alias!r}] prepares statements (server_side_binding with "
                f"prepare_threshold {options['prepare_threshold']!r}) behind a pooler in "
                "transaction mode: a statement prepared on one server connection is unknown "
                "to the next.",
                hint="Remove prepare_threshold from OPTIONS (Django's default: nothing is "
                "prepared), or run PgBouncer 1.21 or later with max_prepared_statements > 0.",
                id="idempotency.W006",
            )
        )
    return messages


CHECKS: list[Check] = [
    _unknown_keys,
    _header,
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
    _choice("IN_FLIGHT", ("wait", "conflict"), "idempotency.E032"),
    _drf_error_format,
    _lease_mode_under_atomic_requests,
    _replay_cache,
    _positive_number("MAX_BODY_DEPTH", "idempotency.E030", integer=True),
    _transaction_pooling,
    _choice("READ_FIRST", ("auto", "always", "never"), "idempotency.E034"),
]


# The IDEMPOTENCY object last found valid: checked again only when it changes.
_valid: list[object] = []


def validate_settings() -> None:
    """Raise ``ImproperlyConfigured`` on the first use of an invalid ``IDEMPOTENCY``.

    The system checks say the same at start-up; this catches a deployment that
    skips them (``--skip-checks``, a bare WSGI server), instead of serving with
    a setting nobody meant (``MODE: "leased"``).
    """
    user = getattr(settings, "IDEMPOTENCY", None)
    if _valid and _valid[0] is user:
        return
    errors = [message for message in check_settings() if message.is_serious()]
    if errors:
        raise ImproperlyConfigured(
            " ".join(
                f"{error.msg}{f' {error.hint}' if error.hint else ''} ({error.id})"
                for error in errors
            )
        )
    _valid[:] = [user]


def _forget_valid(*, setting: str, **kwargs: Any) -> None:
    if setting in ("IDEMPOTENCY", "DATABASES", "CACHES"):  # what the checks read
        _valid.clear()


setting_changed.connect(_forget_valid)
