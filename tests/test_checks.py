"""System checks: every ``idempotency.E0xx`` id, triggered by a bad setting."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

import idempotency.checks

BAD_SETTINGS: list[tuple[str, Any]] = [
    ("idempotency.E001", ["not", "a", "dict"]),
    ("idempotency.E002", {"LOCK_TIMOUT": 1}),
    ("idempotency.E003", {"HEADER": ""}),
    ("idempotency.E003", {"HEADER": 42}),
    ("idempotency.E004", {"MAX_KEY_LENGTH": 0}),
    ("idempotency.E004", {"MAX_KEY_LENGTH": 256}),
    ("idempotency.E004", {"MAX_KEY_LENGTH": "64"}),
    ("idempotency.E004", {"MAX_KEY_LENGTH": True}),
    ("idempotency.E005", {"REQUIRE_KEY": "yes"}),
    ("idempotency.E006", {"MODE": "eventual"}),
    ("idempotency.E007", {"LOCK_TIMEOUT": 0}),
    ("idempotency.E007", {"LOCK_TIMEOUT": -1.5}),
    ("idempotency.E008", {"RETRY_AFTER": 1.5}),
    ("idempotency.E009", {"LEASE_SECONDS": 0}),
    ("idempotency.E010", {"MAX_RESPONSE_BYTES": -1}),
    ("idempotency.E011", {"ERROR_FORMAT": "xml"}),
    ("idempotency.E012", {"REPLAY_HEADERS": "Location"}),
    ("idempotency.E012", {"REPLAY_HEADERS": ["Location", 1]}),
    ("idempotency.E013", {"REPLAY_HEADERS": ["Location", "Set-Cookie"]}),
    ("idempotency.E013", {"REPLAY_HEADERS": ["authorization"]}),
    ("idempotency.E014", {"RETENTION": {"PROCESSING": 60}}),
    ("idempotency.E014", {"RETENTION": {"SUCCEEDED": -1}}),
    ("idempotency.E014", {"RETENTION": {"SUCCEEDED": "1d"}}),
    ("idempotency.E014", {"OPERATION_RETENTION": {"orders": {"NEEDS_REVIEW": 60}}}),
    ("idempotency.E014", {"OPERATION_RETENTION": ["orders"]}),
    ("idempotency.E015", {"RESOLVERS": ["tests.resolve"]}),
    ("idempotency.E016", {"RESOLVERS": {"orders.create": "tests.no_such_module.resolve"}}),
    ("idempotency.E017", {"DATABASE": "replica"}),
    ("idempotency.E018", {"SCOPE_FUNCTION": "tests.no_such_module.scope"}),
    ("idempotency.E019", {"FINGERPRINT_FUNCTION": "idempotency.http.no_such_function"}),
    ("idempotency.E020", {"OUTCOME_POLICY": "not a dotted path"}),
    ("idempotency.E021", {"MAX_RESOLVE_ATTEMPTS": 0}),
    ("idempotency.E022", {"RELEASE_EXPIRED_WITHOUT_RESOLVER": 1}),
    ("idempotency.E023", {"RECOVERY_BATCH_SIZE": 0}),
    ("idempotency.E024", {"PURGE_BATCH_SIZE": 2.5}),
    ("idempotency.E025", {"RESOLVE_RETRY_SECONDS": -5}),
    ("idempotency.E026", {"WAIT_SECONDS": -1}),
    ("idempotency.E026", {"WAIT_SECONDS": "5"}),
    ("idempotency.E027", {"MAX_WAITERS": 0}),
    ("idempotency.E027", {"MAX_WAITERS": 2.5}),
    ("idempotency.E029", {"REPLAY_CACHE": "no-such-cache"}),
    ("idempotency.E029", {"REPLAY_CACHE": 1}),
    ("idempotency.E030", {"READ_FIRST": True}),
    ("idempotency.E030", {"READ_FIRST": "sometimes"}),
]


def our_errors() -> list[str]:
    return [m.id for m in run_checks() if (m.id or "").startswith("idempotency.")]


def ids_in_checks_module() -> set[str]:
    source = Path(idempotency.checks.__file__).read_text()
    return set(re.findall(r"idempotency\.E\d{3}", source))


@pytest.mark.parametrize(("error_id", "setting"), BAD_SETTINGS)
def test_bad_setting_is_reported_by_id(error_id, setting):
    with override_settings(IDEMPOTENCY=setting):
        assert our_errors() == [error_id]


def test_every_check_id_is_tested():
    # E028 needs DRF missing: below, and for real in tests/test_without_drf.py.
    tested = {error_id for error_id, _ in BAD_SETTINGS} | {"idempotency.E028"}
    assert ids_in_checks_module() == tested


def test_drf_error_format_needs_drf(monkeypatch):
    monkeypatch.setattr(idempotency.checks, "drf_installed", lambda: False)
    with override_settings(IDEMPOTENCY={"ERROR_FORMAT": "drf"}):
        (message,) = [m for m in run_checks() if m.id == "idempotency.E028"]
    assert "django-idempotency[drf]" in message.hint


def lease_warnings() -> list[Any]:
    return [m for m in run_checks() if m.id == "idempotency.W001"]


def test_lease_mode_under_atomic_requests_is_warned_with_the_fix(monkeypatch):
    with override_settings(IDEMPOTENCY={"MODE": "lease"}):
        assert lease_warnings() == []
        monkeypatch.setitem(settings.DATABASES["default"], "ATOMIC_REQUESTS", True)
        (message,) = lease_warnings()
    assert "@transaction.non_atomic_requests" in message.hint
    assert lease_warnings() == []  # atomic mode is what the request's transaction gives


def test_defaults_pass():
    assert our_errors() == []


@override_settings(
    IDEMPOTENCY={"REPLAY_CACHE": "replays"},
    CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "replays": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    },
)
def test_a_replay_cache_in_one_process_is_warned_about():
    assert our_errors() == ["idempotency.W002"]


@override_settings(
    IDEMPOTENCY={"REPLAY_CACHE": "replays"},
    CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "replays": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/14",
        },
    },
)
def test_a_shared_replay_cache_passes():
    assert our_errors() == []


@override_settings(
    IDEMPOTENCY={
        "HEADER": "X-Request-Key",
        "MAX_KEY_LENGTH": 64,
        "MODE": "lease",
        "LOCK_TIMEOUT": 0.5,
        "RETRY_AFTER": 3,
        "ERROR_FORMAT": "drf",
        "REPLAY_HEADERS": ["Location"],
        "RETENTION": {"SUCCEEDED": 3600, "FAILED_FINAL": None},
        "OPERATION_RETENTION": {"orders": {"FAILED_RETRYABLE": 0}},
        "DATABASE": "default",
        "SCOPE_FUNCTION": "idempotency.http.default_scope",
        "OUTCOME_POLICY": lambda response: None,
    }
)
def test_a_full_valid_configuration_passes():
    assert our_errors() == []


def test_several_errors_are_all_reported():
    with override_settings(IDEMPOTENCY={"MODE": "x", "RETRY_AFTER": 0}):
        assert sorted(our_errors()) == ["idempotency.E006", "idempotency.E008"]


def test_check_command_runs_our_checks():
    with (
        override_settings(IDEMPOTENCY={"MODE": "eventual"}),
        pytest.raises(SystemCheckError) as caught,
    ):
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert "idempotency.E006" in str(caught.value)
    assert "IDEMPOTENCY['MODE'] should be one of 'atomic', 'lease'." in str(caught.value)


def test_check_command_passes_with_defaults():
    out = StringIO()
    call_command("check", stdout=out, stderr=StringIO())
    assert "no issues" in out.getvalue()


def test_bad_dotted_path_hint_names_the_setting():
    with override_settings(IDEMPOTENCY={"SCOPE_FUNCTION": "tests.nowhere.scope"}):
        (message,) = [m for m in run_checks() if m.id == "idempotency.E018"]
    assert "SCOPE_FUNCTION" in message.hint
    assert "tests.nowhere.scope" in message.hint


def test_unknown_key_hint_lists_valid_keys():
    with override_settings(IDEMPOTENCY={"LOCK_TIMOUT": 1}):
        (message,) = [m for m in run_checks() if m.id == "idempotency.E002"]
    assert "LOCK_TIMOUT" in message.msg
    assert "LOCK_TIMEOUT" in message.hint
