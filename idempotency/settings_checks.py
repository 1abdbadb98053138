"""Validation of the ``IDEMPOTENCY`` setting, value by value (ids ``idempotency.E0xx``).

It lives beside ``conf``, which reads the values, because the protocol needs it
on the hot path: ``validate_settings`` runs on first use, so a deployment that
skips the system checks (``--skip-checks``, a bare WSGI server) still refuses a
setting nobody meant. What depends on the rest of the deployment (databases,
the URLconf, which caches are shared) is checked by ``idempotency.checks``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from importlib import import_module
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from idempotency.conf import (
    DEFAULTS,
    FORBIDDEN_REPLAY_HEADERS,
    IN_FLIGHT,
    MODES,
    OMITTED_HEADER,
    error_format,
    idempotency_settings,
    is_header_name,
    load_callable,
)
from idempotency.models import PURGEABLE, IdempotencyRecord, Status

Check = Callable[[dict[str, Any]], list[CheckMessage]]


def _error(msg: str, *, id: str, hint: str | None = None) -> list[CheckMessage]:
    """One error, as a check returns it (``id`` as Django's ``Error`` names it)."""
    return [Error(msg, hint=hint, id=id)]


def closest(value: object, candidates: Iterable[str]) -> str | None:
    """The candidate ``value`` was most likely meant to be (a typo, another case), or None."""
    if not isinstance(value, str):
        return None
    # Compared case-blind, so "lock_timeout" finds "LOCK_TIMEOUT"; the candidate is
    # returned as written.
    by_folded = {str(candidate).casefold(): str(candidate) for candidate in candidates}
    found = difflib.get_close_matches(value.casefold(), list(by_folded), n=1, cutoff=0.6)
    return by_folded[found[0]] if found else None


def did_you_mean(value: object, candidates: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the closest candidate, or nothing when none is close."""
    match = closest(value, candidates)
    return f" (did you mean {match!r}?)" if match is not None else ""


def settings_messages(user: object) -> list[CheckMessage]:
    """What is wrong with ``user`` (``settings.IDEMPOTENCY``), one message per bad value."""
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
    named = [f"{key}{did_you_mean(key, DEFAULTS)}" for key in unknown]
    return _error(
        f"IDEMPOTENCY has unknown keys: {', '.join(named)}.",
        hint="Rename each to the valid key it was meant to be (an unknown key is never read: "
        f"its default applies). Valid keys are: {', '.join(sorted(DEFAULTS))}.",
        id="idempotency.E002",
    )


def _header(user: dict[str, Any]) -> list[CheckMessage]:
    value = user.get("HEADER", DEFAULTS["HEADER"])
    if is_header_name(value):
        return []
    return _error(
        f"IDEMPOTENCY['HEADER'] should be an HTTP header name, not {value!r}.",
        hint="A header name is a token (RFC 9110): letters, digits and !#$%&'*+-.^_`|~, "
        "no spaces or colons; for example 'Idempotency-Key'.",
        id="idempotency.E003",
    )


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


def _optional_positive_number(name: str, error_id: str, hint: str) -> Check:
    def check(user: dict[str, Any]) -> list[CheckMessage]:
        value = user.get(name, DEFAULTS[name])
        if value is None or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        ):
            return []
        return _error(
            f"IDEMPOTENCY[{name!r}] should be a positive number or None, not {value!r}.",
            hint=hint,
            id=error_id,
        )

    return check


def _boolean(name: str, error_id: str) -> Check:
    def check(user: dict[str, Any]) -> list[CheckMessage]:
        if isinstance(user.get(name, DEFAULTS[name]), bool):
            return []
        return [Error(f"IDEMPOTENCY[{name!r}] should be True or False.", id=error_id)]

    return check


def _choice(name: str, choices: Sequence[str], error_id: str) -> Check:
    def check(user: dict[str, Any]) -> list[CheckMessage]:
        value = user.get(name, DEFAULTS[name])
        if value in choices:
            return []
        return _error(
            f"IDEMPOTENCY[{name!r}] should be one of {', '.join(map(repr, choices))}, "
            f"not {value!r}{did_you_mean(value, choices)}.",
            id=error_id,
        )

    return check


def _callable_path(name: str, error_id: str) -> Check:
    def check(user: dict[str, Any]) -> list[CheckMessage]:
        try:
            load_callable(user.get(name, DEFAULTS[name]), name)
        except (ImproperlyConfigured, ValueError) as exc:
            return _error(
                f"IDEMPOTENCY[{name!r}] should be a callable or the dotted path of one.",
                hint=str(exc),
                id=error_id,
            )
        return []

    return check


def _replayed_header(user: dict[str, Any]) -> list[CheckMessage]:
    value = user.get("REPLAYED_HEADER", DEFAULTS["REPLAYED_HEADER"])
    key_header = str(user.get("HEADER", DEFAULTS["HEADER"])).lower()
    if is_header_name(value) and value.lower() not in {key_header, OMITTED_HEADER.lower()}:
        return []
    return _error(
        f"IDEMPOTENCY['REPLAYED_HEADER'] should be an HTTP header name of its own, not {value!r}.",
        hint="The response header that marks a replay: 'Idempotent-Replayed' (Stripe's, the "
        "default) or 'Idempotency-Replayed' (the IETF draft's conformance profile); neither "
        f"HEADER nor {OMITTED_HEADER!r}.",
        id="idempotency.E037",
    )


def _max_key_length(user: dict[str, Any]) -> list[CheckMessage]:
    # A longer key would pass validation and then fail the insert (a 500 on PostgreSQL).
    column = IdempotencyRecord._meta.get_field("idem_key").max_length or 255
    value = user.get("MAX_KEY_LENGTH", DEFAULTS["MAX_KEY_LENGTH"])
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= column:
        return []
    return _error(
        f"IDEMPOTENCY['MAX_KEY_LENGTH'] should be an integer from 1 to {column}.",
        hint=f"Keys are stored in a column of {column} characters.",
        id="idempotency.E004",
    )


def _replay_headers(user: dict[str, Any]) -> list[CheckMessage]:
    names = user.get("REPLAY_HEADERS", DEFAULTS["REPLAY_HEADERS"])
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        return _error(
            "IDEMPOTENCY['REPLAY_HEADERS'] should be a list of strings.", id="idempotency.E012"
        )
    forbidden = sorted(n for n in names if n.lower() in FORBIDDEN_REPLAY_HEADERS)
    if forbidden:
        return _error(
            f"IDEMPOTENCY['REPLAY_HEADERS'] should not name per-session headers: "
            f"{', '.join(forbidden)}.",
            hint="Cookies and credentials are never stored or replayed; remove them.",
            id="idempotency.E013",
        )
    return []


_RETENTION_HINT = (
    "Map SUCCEEDED, FAILED_FINAL or FAILED_RETRYABLE to seconds (a number >= 0) or None "
    "(kept forever); PROCESSING and NEEDS_REVIEW records are never purged."
)


def _retention(user: dict[str, Any]) -> list[CheckMessage]:
    """Each window, each entry: the message names the one that is wrong."""
    per_operation = user.get("OPERATION_RETENTION", {})
    if not isinstance(per_operation, dict):
        return _error(
            "IDEMPOTENCY['OPERATION_RETENTION'] should be a dict of operation names to "
            f"retention windows, not {per_operation!r}.",
            hint=f"For example {{'orders.create': {{'SUCCEEDED': 3600}}}}. {_RETENTION_HINT}",
            id="idempotency.E014",
        )
    windows = {"IDEMPOTENCY['RETENTION']": user.get("RETENTION", {})}
    windows.update(
        (f"IDEMPOTENCY['OPERATION_RETENTION'][{operation!r}]", window)
        for operation, window in per_operation.items()
    )
    messages: list[CheckMessage] = []
    for name, window in windows.items():
        messages += _window_messages(name, window)
    return messages


def _window_messages(name: str, window: Any) -> list[CheckMessage]:
    if not isinstance(window, dict):
        return _error(
            f"{name} should be a dict of statuses to seconds, not {window!r}.",
            hint=_RETENTION_HINT,
            id="idempotency.E014",
        )
    messages: list[CheckMessage] = []
    for status, seconds in window.items():
        if status not in PURGEABLE and status not in Status.values:
            # Not a status at all: a typo ("SUCCEDED"), whose window would never apply.
            messages += _error(
                f"{name} has an unknown status {status!r}{did_you_mean(status, PURGEABLE)}.",
                hint=f"Rename it to the status it was meant to be. {_RETENTION_HINT}",
                id="idempotency.E038",
            )
        elif status not in PURGEABLE:
            messages += _error(
                f"{name}[{status!r}]: {status} records are never purged.",
                hint=f"Remove the entry. {_RETENTION_HINT}",
                id="idempotency.E014",
            )
        elif not _valid_seconds(seconds):
            messages += _error(
                f"{name}[{status!r}] should be seconds (a number >= 0) or None, not {seconds!r}.",
                hint=_RETENTION_HINT,
                id="idempotency.E014",
            )
    return messages


def _valid_seconds(seconds: Any) -> bool:
    if seconds is None:
        return True
    return isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0


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
    return _error(
        f"IDEMPOTENCY['DATABASE'] should name an alias of DATABASES, not {alias!r}"
        f"{did_you_mean(alias, settings.DATABASES)}.",
        hint="The record must live in the same database as the business data.",
        id="idempotency.E017",
    )


def drf_installed() -> bool:
    try:
        import_module("rest_framework")
    except ImportError:
        return False
    return True


def _error_format(user: dict[str, Any]) -> list[CheckMessage]:
    value = user.get("ERROR_FORMAT", DEFAULTS["ERROR_FORMAT"])
    try:
        error_format(value)
    except (ImproperlyConfigured, ValueError) as exc:
        return _error(
            "IDEMPOTENCY['ERROR_FORMAT'] should be 'problem', 'drf', or a renderer: a callable "
            f"(request, error, status) -> response, or its dotted path; not {value!r}.",
            hint=str(exc),
            id="idempotency.E011",
        )
    return []


def _drf_error_format(user: dict[str, Any]) -> list[CheckMessage]:
    if user.get("ERROR_FORMAT") != "drf" or drf_installed():
        return []
    return _error(
        "IDEMPOTENCY['ERROR_FORMAT'] = 'drf' needs Django REST framework, which is not installed.",
        hint="pip install 'django-idempotency[drf]', or use the default 'problem' format.",
        id="idempotency.E028",
    )


def _run_in_lease_mode(user: dict[str, Any]) -> list[CheckMessage]:
    if user.get("IN_FLIGHT") != "run" or user.get("MODE", DEFAULTS["MODE"]) != "lease":
        return []
    return _error(
        "IDEMPOTENCY['IN_FLIGHT'] = 'run' should not be the default of lease mode: it lets "
        "duplicates run their work before one is recorded, which only atomic mode takes back.",
        hint="Use 'wait' or 'conflict' with MODE 'lease', or give 'run' only to atomic views "
        "(in_flight='run').",
        id="idempotency.E040",
    )


def _replay_cache(user: dict[str, Any]) -> list[CheckMessage]:
    alias = user.get("REPLAY_CACHE")
    if alias is None or (isinstance(alias, str) and alias in settings.CACHES):
        return []
    return _error(
        f"IDEMPOTENCY['REPLAY_CACHE'] should name an alias of CACHES or be None, not {alias!r}"
        f"{did_you_mean(alias, settings.CACHES)}.",
        hint="Add the cache to CACHES (a shared one: Redis, Memcached, the database).",
        id="idempotency.E029",
    )


def _transaction_pooling(user: dict[str, Any]) -> list[CheckMessage]:
    value = user.get("TRANSACTION_POOLING")
    if value is None or isinstance(value, bool):
        return []
    return _error(
        f"IDEMPOTENCY['TRANSACTION_POOLING'] should be True, False or None, not {value!r}.",
        hint="None (the default) infers it from DATABASES[alias]"
        "['DISABLE_SERVER_SIDE_CURSORS'] of the records' database.",
        id="idempotency.E033",
    )


def _shards(user: dict[str, Any]) -> list[CheckMessage]:
    """``SHARDS`` is ``None`` or a list of aliases of ``DATABASES``."""
    value = user.get("SHARDS")
    if value is None:
        return []
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(alias, str) and alias in settings.DATABASES for alias in value)
    ):
        return []
    return [
        Error(
            f"IDEMPOTENCY['SHARDS'] should be None or a non-empty list of aliases of DATABASES, "
            f"not {value!r}.",
            hint="List every database that holds records: recovery and purge visit each.",
            id="idempotency.E035",
        )
    ]


def _write_guard(user: dict[str, Any]) -> list[CheckMessage]:
    value = user.get("WRITE_GUARD")
    if value is None or isinstance(value, bool):
        return []
    return [
        Error(
            f"IDEMPOTENCY['WRITE_GUARD'] should be True, False or None, not {value!r}.",
            hint="None (the default) refuses cross-database writes under DEBUG and in tests.",
            id="idempotency.E036",
        )
    ]


CHECKS: list[Check] = [
    _unknown_keys,
    _header,
    _replayed_header,
    _max_key_length,
    _boolean("REQUIRE_KEY", "idempotency.E005"),
    _choice("MODE", MODES, "idempotency.E006"),
    _positive_number("LOCK_TIMEOUT", "idempotency.E007"),
    _positive_number("RETRY_AFTER", "idempotency.E008", integer=True),
    _positive_number("LEASE_SECONDS", "idempotency.E009"),
    _positive_number("MAX_RESPONSE_BYTES", "idempotency.E010", integer=True),
    _error_format,
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
    _positive_number("PURGE_BATCH_SECONDS", "idempotency.E039"),
    _positive_number("RESOLVE_RETRY_SECONDS", "idempotency.E025"),
    _non_negative_number("WAIT_SECONDS", "idempotency.E026"),
    _positive_number("MAX_WAITERS", "idempotency.E027", integer=True),
    _choice("IN_FLIGHT", IN_FLIGHT, "idempotency.E032"),
    _run_in_lease_mode,
    _drf_error_format,
    _replay_cache,
    _positive_number("MAX_BODY_DEPTH", "idempotency.E030", integer=True),
    _transaction_pooling,
    _choice("READ_FIRST", ("auto", "always", "never"), "idempotency.E034"),
    _shards,
    _write_guard,
    _optional_positive_number(
        "STEP_KEY_WINDOW",
        "idempotency.E041",
        hint="Seconds the providers your step keys go to remember a key (Stripe: 86400), "
        "or None when no operation sends step keys.",
    ),
]


# The IDEMPOTENCY object last found valid: checked again only when it changes.
def validate_settings() -> None:
    """Raise ``ImproperlyConfigured`` on the first use of an invalid ``IDEMPOTENCY``.

    The system checks say the same at start-up; this catches a deployment that
    skips them (``--skip-checks``, a bare WSGI server), instead of serving with
    a setting nobody meant (``MODE: "leased"``). The entry points call it while
    ``idempotency_settings.validated`` is false: once per change of the settings.
    """
    user = getattr(settings, "IDEMPOTENCY", None)
    found = settings_messages({} if user is None else user)
    errors = [message for message in found if message.is_serious()]
    if errors:
        raise ImproperlyConfigured(
            " ".join(
                f"{error.msg}{f' {error.hint}' if error.hint else ''} ({error.id})"
                for error in errors
            )
        )
    idempotency_settings.validated = True


def _forget_valid(*, setting: str, **kwargs: Any) -> None:
    if setting in ("IDEMPOTENCY", "DATABASES", "CACHES"):  # what the checks read
        idempotency_settings.validated = False


setting_changed.connect(_forget_valid)
