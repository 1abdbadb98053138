"""``idempotency_settings`` keeps converted values, and forgets them whenever Django says so."""

from __future__ import annotations

from django.test import override_settings

from idempotency.conf import idempotency_settings


def test_a_kept_setting_follows_override_settings():
    assert idempotency_settings.HEADER == "Idempotency-Key"  # read and kept
    with override_settings(IDEMPOTENCY={"HEADER": "X-Request-Key", "LOCK_TIMEOUT": 0.5}):
        assert idempotency_settings.HEADER == "X-Request-Key"
        assert idempotency_settings.LOCK_TIMEOUT == 0.5
    assert idempotency_settings.HEADER == "Idempotency-Key"
    assert idempotency_settings.LOCK_TIMEOUT == 2.0


def test_a_kept_callable_follows_the_settings_fixture(settings):
    def scope(request, operation):
        return "fixed"

    assert idempotency_settings.SCOPE_FUNCTION.__name__ == "default_scope"
    settings.IDEMPOTENCY = {"SCOPE_FUNCTION": scope}
    assert idempotency_settings.SCOPE_FUNCTION is scope


def test_kept_values_are_converted_once():
    with override_settings(IDEMPOTENCY={"REPLAY_HEADERS": ["Location", "Set-Cookie"]}):
        first = idempotency_settings.REPLAY_HEADERS
        assert first == frozenset({"location"})  # per-session headers never replayed
        assert idempotency_settings.REPLAY_HEADERS is first
