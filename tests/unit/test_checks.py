"""System checks: every ``idempotency.E0xx`` id, triggered by a bad setting."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import INFO, WARNING, run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

import idempotency.checks
import idempotency.settings_checks

BAD_SETTINGS: list[tuple[str, Any]] = [
    ("idempotency.E001", ["not", "a", "dict"]),
    ("idempotency.E002", {"LOCK_TIMOUT": 1}),
    ("idempotency.E003", {"HEADER": ""}),
    ("idempotency.E003", {"HEADER": 42}),
    ("idempotency.E003", {"HEADER": "Idempotency Key"}),
    ("idempotency.E003", {"HEADER": "Idempotency-Key:"}),
    ("idempotency.E003", {"HEADER": "Clé"}),
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
    ("idempotency.E011", {"ERROR_FORMAT": "myproject.errors.no_such_renderer"}),
    ("idempotency.E011", {"ERROR_FORMAT": "idempotency.conf.DEFAULTS"}),  # not callable
    ("idempotency.E011", {"ERROR_FORMAT": 42}),
    ("idempotency.E012", {"REPLAY_HEADERS": "Location"}),
    ("idempotency.E012", {"REPLAY_HEADERS": ["Location", 1]}),
    ("idempotency.E013", {"REPLAY_HEADERS": ["Location", "Set-Cookie"]}),
    ("idempotency.E013", {"REPLAY_HEADERS": ["authorization"]}),
    ("idempotency.E014", {"RETENTION": {"PROCESSING": 60}}),
    ("idempotency.E014", {"RETENTION": {"SUCCEEDED": -1}}),
    ("idempotency.E014", {"RETENTION": {"SUCCEEDED": "1d"}}),
    ("idempotency.E014", {"OPERATION_RETENTION": {"orders": {"NEEDS_REVIEW": 60}}}),
    ("idempotency.E014", {"OPERATION_RETENTION": ["orders"]}),
    ("idempotency.E014", {"OPERATION_RETENTION": {"orders": 60}}),
    ("idempotency.E038", {"RETENTION": {"SUCCEDED": 60}}),
    ("idempotency.E038", {"OPERATION_RETENTION": {"orders": {"failed_final": 60}}}),
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
    ("idempotency.E030", {"MAX_BODY_DEPTH": 0}),
    ("idempotency.E030", {"MAX_BODY_DEPTH": "100"}),
    ("idempotency.E032", {"IN_FLIGHT": "409"}),
    ("idempotency.E032", {"IN_FLIGHT": True}),
    ("idempotency.E040", {"IN_FLIGHT": "run", "MODE": "lease"}),
    ("idempotency.E033", {"TRANSACTION_POOLING": "transaction"}),
    ("idempotency.E034", {"READ_FIRST": True}),
    ("idempotency.E034", {"READ_FIRST": "sometimes"}),
    ("idempotency.E035", {"SHARDS": "default"}),
    ("idempotency.E035", {"SHARDS": ["default", "no-such-alias"]}),
    ("idempotency.E035", {"SHARDS": []}),
    ("idempotency.E036", {"WRITE_GUARD": "on"}),
    ("idempotency.E037", {"REPLAYED_HEADER": "Idempotency Replayed"}),
    ("idempotency.E037", {"REPLAYED_HEADER": None}),
    ("idempotency.E037", {"REPLAYED_HEADER": "idempotency-key"}),  # the key's own header
    ("idempotency.E037", {"REPLAYED_HEADER": "Idempotency-Replay"}),  # the omitted marker
    ("idempotency.E039", {"PURGE_BATCH_SECONDS": 0}),
    ("idempotency.E039", {"PURGE_BATCH_SECONDS": "0.25"}),
    ("idempotency.E039", {"PURGE_BATCH_SECONDS": True}),
    ("idempotency.E041", {"STEP_KEY_WINDOW": 0}),
    ("idempotency.E041", {"STEP_KEY_WINDOW": "24h"}),
    ("idempotency.E041", {"STEP_KEY_WINDOW": True}),
]


@pytest.mark.parametrize(
    "renderer", ["idempotency.response.problem_response", lambda request, error, status: None]
)
def test_a_renderer_is_an_error_format(renderer):
    with override_settings(IDEMPOTENCY={"ERROR_FORMAT": renderer}):
        assert our_errors() == []


@pytest.mark.parametrize("name", ["Idempotency-Replayed", "Idempotent-Replayed", "X-Replayed"])
def test_a_replay_marker_of_its_own_is_accepted(name):
    with override_settings(IDEMPOTENCY={"REPLAYED_HEADER": name}):
        assert our_errors() == []


def our_errors() -> list[str]:
    return [m.id for m in run_checks() if (m.id or "").startswith("idempotency.")]


def ids_in_checks_modules() -> set[str]:
    modules = (idempotency.checks, idempotency.settings_checks)
    source = "".join(Path(module.__file__ or "").read_text() for module in modules)
    return set(re.findall(r"idempotency\.E\d{3}", source))


@pytest.mark.parametrize(("error_id", "setting"), BAD_SETTINGS)
def test_bad_setting_is_reported_by_id(error_id, setting):
    with override_settings(IDEMPOTENCY=setting):
        assert our_errors() == [error_id]


def test_every_check_id_is_tested():
    # E028 needs DRF missing: below, and for real in tests/deployment/test_without_drf.py.
    # E031 needs a URLconf: test_lease_views_under_atomic_requests_are_each_reported.
    tested = {error_id for error_id, _ in BAD_SETTINGS} | {"idempotency.E028", "idempotency.E031"}
    assert ids_in_checks_modules() == tested


def test_drf_error_format_needs_drf(monkeypatch):
    monkeypatch.setattr(idempotency.settings_checks, "drf_installed", lambda: False)
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
        "OPERATION_RETENTION": {"tests.lease_order": {"FAILED_RETRYABLE": 0}},
        "STEP_KEY_WINDOW": None,  # no operation sends step keys: retryable records may go
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
    assert "IDEMPOTENCY['MODE'] should be one of 'atomic', 'lease', not 'eventual'." in str(
        caught.value
    )


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


def test_unknown_key_names_the_key_it_was_meant_to_be():
    with override_settings(IDEMPOTENCY={"LOCK_TIMOUT": 1, "require_key": False, "COLOUR": 1}):
        (message,) = [m for m in run_checks() if m.id == "idempotency.E002"]
    assert "LOCK_TIMOUT (did you mean 'LOCK_TIMEOUT'?)" in message.msg
    assert "require_key (did you mean 'REQUIRE_KEY'?)" in message.msg
    assert "COLOUR," in message.msg  # close to nothing: no guess


@pytest.mark.parametrize(
    ("setting", "named", "bad", "meant"),
    [
        ({"RETENTION": {"SUCCEDED": 60}}, "IDEMPOTENCY['RETENTION']", "SUCCEDED", "SUCCEEDED"),
        (
            {"OPERATION_RETENTION": {"orders": {"FAILED_FINALE": 60}}},
            "IDEMPOTENCY['OPERATION_RETENTION']['orders']",
            "FAILED_FINALE",
            "FAILED_FINAL",
        ),
    ],
)
def test_a_typo_in_a_retention_window_names_the_key_and_the_status_meant(
    setting, named, bad, meant
):
    with override_settings(IDEMPOTENCY=setting):
        (message,) = [m for m in run_checks() if m.id == "idempotency.E038"]
    assert message.msg == f"{named} has an unknown status {bad!r} (did you mean {meant!r}?)."


def test_a_bad_retention_value_names_its_entry():
    with override_settings(IDEMPOTENCY={"RETENTION": {"SUCCEEDED": -1, "PROCESSING": 5}}):
        messages = [m.msg for m in run_checks() if m.id == "idempotency.E014"]
    assert messages == [
        "IDEMPOTENCY['RETENTION']['SUCCEEDED'] should be seconds (a number >= 0) or None, not -1.",
        "IDEMPOTENCY['RETENTION']['PROCESSING']: PROCESSING records are never purged.",
    ]


@pytest.mark.parametrize(
    ("setting", "value", "meant"),
    [
        ("MODE", "leased", "lease"),
        ("IN_FLIGHT", "Conflict", "conflict"),
        ("DATABASE", "defualt", "default"),
    ],
)
def test_a_misspelled_choice_or_alias_names_the_one_meant(setting, value, meant):
    with override_settings(IDEMPOTENCY={setting: value}):
        (message,) = [m for m in run_checks() if (m.id or "").startswith("idempotency.E")]
    assert f"not {value!r} (did you mean {meant!r}?)" in message.msg


def test_a_typo_is_refused_on_first_use_too():
    with (
        override_settings(IDEMPOTENCY={"RETENTION": {"SUCCEDED": 60}}),
        pytest.raises(ImproperlyConfigured, match=r"did you mean 'SUCCEEDED'\?"),
    ):
        idempotency.settings_checks.validate_settings()


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("IDEMPOTENTCY", "Rename it to IDEMPOTENCY"),
        ("IDEMPOTANCY", "Rename it to IDEMPOTENCY"),
        ("IDEMPOTENCE", "Rename it to IDEMPOTENCY"),
        ("IDEMPOTENCY_SETTINGS", "Rename it to IDEMPOTENCY"),
        ("IDEMPOTENCY_CONFIG", "Rename it to IDEMPOTENCY"),
        ("IDEMPOTENCY_REQUIRE_KEY", "IDEMPOTENCY = {'REQUIRE_KEY': ...}"),
        ("IDEMPOTENCY_HEADER", "IDEMPOTENCY = {'HEADER': ...}"),
    ],
)
def test_a_setting_named_almost_idempotency_is_warned_about(name, fix):
    with override_settings(**{name: {"REQUIRE_KEY": False}}):
        (message,) = [m for m in run_checks() if m.id == "idempotency.W008"]
    assert message.level == WARNING
    assert message.msg.startswith(f"The setting {name} is not read by django-idempotency")
    assert fix in message.hint


def test_settings_of_other_names_are_not_warned_about():
    # IDEMPOTENCY_BEAT_SCHEDULE: imported into settings as docs/operations-tasks.md shows.
    with override_settings(
        IDEMPOTENCY={}, IDENTITY_PROVIDER="x", ITEMS_PER_PAGE=3, IDEMPOTENCY_BEAT_SCHEDULE={}
    ):
        assert [m for m in run_checks() if m.id == "idempotency.W008"] == []


@pytest.mark.parametrize("handler", ["myproject.api.errors.handler", lambda exc, context: None])
def test_a_project_exception_handler_is_told_about_error_format(handler):
    with override_settings(REST_FRAMEWORK={"EXCEPTION_HANDLER": handler}):
        (message,) = [m for m in run_checks() if m.id == "idempotency.I001"]
    assert message.level == INFO
    assert "ERROR_FORMAT'] = 'drf'" in message.hint


@pytest.mark.parametrize(
    ("framework", "idempotency"),
    [
        ({}, {}),
        ({"EXCEPTION_HANDLER": "rest_framework.views.exception_handler"}, {}),
        ({"EXCEPTION_HANDLER": "idempotency.drf.exception_handler"}, {}),
        ({"EXCEPTION_HANDLER": "myproject.api.errors.handler"}, {"ERROR_FORMAT": "drf"}),
        # "problem" written out: a choice, not a default nobody looked at.
        ({"EXCEPTION_HANDLER": "myproject.api.errors.handler"}, {"ERROR_FORMAT": "problem"}),
    ],
)
def test_the_error_format_info_is_only_for_a_default_left_beside_a_handler(framework, idempotency):
    with override_settings(REST_FRAMEWORK=framework, IDEMPOTENCY=idempotency):
        assert [m for m in run_checks() if m.id == "idempotency.I001"] == []


@override_settings(ROOT_URLCONF="tests.support.check_urls")
def test_lease_views_under_atomic_requests_are_each_reported(monkeypatch):
    assert [m for m in run_checks() if m.id == "idempotency.E031"] == []
    monkeypatch.setitem(settings.DATABASES["default"], "ATOMIC_REQUESTS", True)
    messages = [m for m in run_checks() if m.id == "idempotency.E031"]
    reported = sorted(m.msg.split(" (URL")[0] for m in messages)
    # Not plain_lease_outside (non_atomic_requests), not plain_atomic (atomic mode).
    assert reported == ["LeaseViewSet", "drf_lease", "ninja_lease", "plain_lease"]
    assert all("@transaction.non_atomic_requests" in (m.hint or "") for m in messages)
    assert "URL drf/" in next(m.msg for m in messages if m.msg.startswith("drf_lease"))


def test_the_header_setting_accepts_any_header_name():
    with override_settings(IDEMPOTENCY={"HEADER": "X-Idempotency_Key.v2"}):
        assert our_errors() == []


def test_a_per_view_header_must_be_a_header_name():
    from idempotency import IdempotencyOptions

    with pytest.raises(ValueError, match="header should be an HTTP header name"):
        IdempotencyOptions(header="Idempotency Key")


@pytest.mark.mariadb
@pytest.mark.django_db
def test_a_session_clock_off_utc_is_warned_about():
    from django.db import connection

    from idempotency.checks import check_database

    assert check_database(databases=["default"]) == []
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+02:00'")
    try:
        (message,) = check_database(databases=["default"])
        assert check_database(databases=[]) == []  # only when asked to query the database
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET time_zone = '+00:00'")
    assert message.id == "idempotency.W003"
    assert "7200 seconds off UTC" in message.msg
    assert "SET time_zone" in message.hint


def test_other_databases_have_no_session_clock_to_check():
    from idempotency.stores.generic import GenericStore
    from idempotency.stores.postgres import PostgresStore

    # PostgreSQL and SQLite store timestamps with their zone, or in UTC.
    assert GenericStore("default").clock_offset() is None
    assert PostgresStore("default").clock_offset() is None


def pooling_warnings() -> list[Any]:
    return [m for m in run_checks() if m.id in ("idempotency.W005", "idempotency.W006")]


def test_transaction_pooling_without_disabled_server_side_cursors_is_warned(monkeypatch):
    monkeypatch.delitem(settings.DATABASES["default"], "DISABLE_SERVER_SIDE_CURSORS", raising=False)
    # Whatever this run connects with (the prepared-statements pass): W006 is tested below.
    monkeypatch.setitem(settings.DATABASES["default"], "OPTIONS", {})
    with override_settings(IDEMPOTENCY={"TRANSACTION_POOLING": True}):
        (message,) = pooling_warnings()
    assert message.id == "idempotency.W005"
    assert "DISABLE_SERVER_SIDE_CURSORS'] = True" in message.hint
    with override_settings(IDEMPOTENCY={"TRANSACTION_POOLING": False}):
        assert pooling_warnings() == []


def test_prepared_statements_behind_a_transaction_pooler_are_warned(monkeypatch):
    default = settings.DATABASES["default"]
    monkeypatch.setitem(default, "DISABLE_SERVER_SIDE_CURSORS", True)  # pooled, inferred
    monkeypatch.setitem(default, "OPTIONS", {"server_side_binding": True, "prepare_threshold": 0})
    (message,) = pooling_warnings()
    assert message.id == "idempotency.W006"
    assert "max_prepared_statements" in message.hint
    # Without server-side binding nothing is prepared.
    monkeypatch.setitem(default, "OPTIONS", {"prepare_threshold": 0})
    assert pooling_warnings() == []


def test_transaction_pooling_is_inferred_from_disabled_server_side_cursors(monkeypatch):
    from idempotency.stores import transaction_pooled

    default = settings.DATABASES["default"]
    monkeypatch.setitem(default, "DISABLE_SERVER_SIDE_CURSORS", False)
    assert not transaction_pooled("default")
    monkeypatch.setitem(default, "DISABLE_SERVER_SIDE_CURSORS", True)
    assert transaction_pooled("default")
    with override_settings(IDEMPOTENCY={"TRANSACTION_POOLING": False}):
        assert not transaction_pooled("default")


# --- the records table migrated (a database check) ------------------------------------


def _w007(databases: list[str]) -> list[Any]:
    from idempotency.checks import check_database

    return [m for m in check_database(databases=databases) if m.id == "idempotency.W007"]


@pytest.mark.django_db
def test_a_migrated_records_table_is_not_reported():
    assert _w007(["default"]) == []


@pytest.mark.django_db(transaction=True)
def test_unapplied_migrations_are_reported_by_check_database_and_by_migrate(unmigrated):
    (message,) = _w007(["default"])
    assert "DATABASES['default']" in message.msg and "0001_initial" in message.msg
    assert message.hint == "Run `manage.py migrate idempotency --database default`."
    assert _w007([]) == []  # only when asked to query the database

    checked = StringIO()
    call_command("check", databases=["default"], stdout=checked, stderr=checked)
    assert "idempotency.W007" in checked.getvalue()
    # A warning, not an error: ``migrate`` runs the check first, and must not be stopped by it.
    migrated = StringIO()
    call_command("migrate", "idempotency", skip_checks=False, stdout=migrated, stderr=migrated)
    assert "idempotency.W007" in migrated.getvalue()
    assert _w007(["default"]) == []


@pytest.mark.django_db
@override_settings(REST_FRAMEWORK={"EXCEPTION_HANDLER": "myproject.api.errors.handler"})
def test_after_migrate_check_database_reports_only_the_projects_own_choices():
    # docs/quickstart.md: W007 is gone once migrated; I001 stays while a handler of the
    # project's own sits beside the default ERROR_FORMAT, until the project chooses.
    checked = StringIO()
    call_command("check", databases=["default"], stdout=checked, stderr=checked)
    assert "idempotency.W007" not in checked.getvalue()
    assert "idempotency.I001" in checked.getvalue()
    with override_settings(IDEMPOTENCY={"ERROR_FORMAT": "drf"}):
        chosen = StringIO()
        call_command("check", databases=["default"], stdout=chosen, stderr=chosen)
    assert "no issues" in chosen.getvalue()


@pytest.mark.django_db(transaction=True)
def test_a_records_table_dropped_behind_the_migrations_back_is_reported(records_table_dropped):
    (message,) = _w007(["default"])
    assert "table idempotency_idempotencyrecord missing" in message.msg


# --- retryable records shorter than the providers' window (step keys) -----------------------


def step_key_warnings() -> list[Any]:
    return [m for m in run_checks() if m.id == "idempotency.W010"]


@pytest.mark.parametrize(
    "setting",
    [
        {},  # one day each: Stripe's window
        {"RETENTION": {"FAILED_RETRYABLE": None}},  # kept until an operator acts
        {"RETENTION": {"FAILED_RETRYABLE": 3600}, "STEP_KEY_WINDOW": None},
        {"RETENTION": {"FAILED_RETRYABLE": 3600}, "STEP_KEY_WINDOW": 3600},
    ],
)
def test_retryable_records_as_long_as_the_step_key_window_pass(setting):
    with override_settings(IDEMPOTENCY=setting):
        assert step_key_warnings() == []


def test_retryable_records_shorter_than_the_step_key_window_are_warned_about():
    with override_settings(IDEMPOTENCY={"RETENTION": {"FAILED_RETRYABLE": 3600}}):
        (message,) = step_key_warnings()
    assert message.level == WARNING
    assert message.msg.startswith("IDEMPOTENCY['RETENTION']['FAILED_RETRYABLE'] is 3600 seconds")
    assert "STEP_KEY_WINDOW (86400 seconds)" in message.msg
    assert "new step keys" in message.msg
    assert "STEP_KEY_WINDOW" in (message.hint or "")


def test_an_operations_retryable_window_is_checked_too():
    setting = {
        "OPERATION_RETENTION": {"tests.lease_order": {"FAILED_RETRYABLE": 600}},
        "STEP_KEY_WINDOW": 1800,
    }
    with override_settings(IDEMPOTENCY=setting):
        (message,) = step_key_warnings()
    assert "IDEMPOTENCY['OPERATION_RETENTION']['tests.lease_order']['FAILED_RETRYABLE']" in (
        message.msg
    )
    assert "1800 seconds" in message.msg


# --- operations the settings name -------------------------------------------------------------


SHIPPED_RESOLVER = "idempotency.steps.effects_carry_step_keys"


def operation_warnings() -> list[Any]:
    return [m for m in run_checks() if m.id == "idempotency.W009"]


@override_settings(ROOT_URLCONF="tests.support.operation_urls")
def test_every_kind_of_operation_the_project_declares_may_be_named():
    from tests.support.operation_urls import DECLARED

    setting = {
        "OPERATION_RETENTION": {name: {"SUCCEEDED": 60} for name in DECLARED},
        "RESOLVERS": dict.fromkeys(DECLARED, SHIPPED_RESOLVER),
    }
    with override_settings(IDEMPOTENCY=setting):
        assert operation_warnings() == []


@pytest.mark.parametrize(
    ("setting", "meant"),
    [
        ("OPERATION_RETENTION", "tests.support.operation_urls.Orders.create"),
        ("RESOLVERS", "tests.support.operation_urls.Shipments.dispatch_now"),
    ],
)
@override_settings(ROOT_URLCONF="tests.support.operation_urls")
def test_a_misspelled_operation_is_named_with_the_one_meant(setting, meant):
    typo = meant.replace("Orders.create", "orders.craete").replace("dispatch_now", "dispatch")
    value = {"SUCCEEDED": 60} if setting == "OPERATION_RETENTION" else SHIPPED_RESOLVER
    with override_settings(IDEMPOTENCY={setting: {typo: value}}):
        (message,) = operation_warnings()
    assert message.level == WARNING
    assert message.msg.startswith(f"IDEMPOTENCY[{setting!r}] names the operation {typo!r}")
    assert (message.hint or "").startswith(f"Did you mean {meant!r}?")


def test_an_operation_nothing_resembles_is_named_without_a_guess():
    with override_settings(IDEMPOTENCY={"RESOLVERS": {"zzz": SHIPPED_RESOLVER}}):
        (message,) = operation_warnings()
    assert "'zzz'" in message.msg and "lost leases go to review" in message.msg
    assert not (message.hint or "").startswith("Did you mean")


def test_a_settings_dict_with_errors_is_not_checked_for_operation_names():
    # E014 says what is wrong with the window; the name is looked at once it is valid.
    bad = {"OPERATION_RETENTION": {"no.such.operation": {"NEEDS_REVIEW": 60}}}
    with override_settings(IDEMPOTENCY=bad):
        assert operation_warnings() == []
        assert our_errors() == ["idempotency.E014"]


# A throwaway project in a process of its own, as a user meets it: only what its URLconf
# and settings import is declared there.
PROJECT_SETTINGS = """
import shop.celery  # as a project's __init__ loads its Celery app

SECRET_KEY = "operation-names"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rest_framework",
    "idempotency",
    "shop",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
ROOT_URLCONF = "shop.urls"
USE_TZ = True
IDEMPOTENCY = {
    "OPERATION_RETENTION": {"shop.urls.OrderViewset.create": {"SUCCEEDED": 7 * 86400}},
    "RESOLVERS": {
        "shop.urls.OrderViewSet.craete": "idempotency.steps.effects_carry_step_keys",
        "shop.tasks.ship": "idempotency.steps.effects_carry_step_keys",
        "shop.tasks.shpi": "idempotency.steps.effects_carry_step_keys",
    },
}
"""

PROJECT_URLS = """
from django.urls import path
from rest_framework import viewsets
from rest_framework.response import Response

from idempotency import IdempotentCreateMixin


class OrderViewSet(IdempotentCreateMixin, viewsets.ViewSet):
    def create(self, request):
        return Response(status=201)


urlpatterns = [path("orders/", OrderViewSet.as_view({"post": "create"}))]
"""

# Imported by no URL: Celery's autodiscovery finds it, and so does the check.
PROJECT_TASKS = """
from celery import shared_task

from idempotency.celery import IdempotentTask


@shared_task(base=IdempotentTask, idempotency_key=lambda order: order, idempotency_mode="lease")
def ship(order):
    pass
"""

PROJECT_CELERY = """
from celery import Celery

app = Celery("shop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
"""


def checked_project(tmp_path: Path, settings: str, shop: dict[str, str]) -> str:
    """``manage.py check``'s report on a project of ``settings`` and a ``shop`` app's files."""
    import subprocess

    from tests.support.processes import ROOT, process_env, python

    (tmp_path / "shop_settings.py").write_text(settings)
    package = tmp_path / "shop"
    package.mkdir()
    for name, text in {"__init__.py": "", **shop}.items():
        (package / name).write_text(text)
    env = process_env(
        database=False, DJANGO_SETTINGS_MODULE="shop_settings", PYTHONPATH=f"{tmp_path}:{ROOT}"
    )
    checked = subprocess.run(
        python("-m", "django", "check"), cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr  # warnings: the project still starts
    return checked.stderr


def test_a_fresh_project_is_told_of_its_misspelled_operations(tmp_path):
    shop = {"urls.py": PROJECT_URLS, "tasks.py": PROJECT_TASKS, "celery.py": PROJECT_CELERY}
    report = checked_project(tmp_path, PROJECT_SETTINGS, shop)
    assert report.count("(idempotency.W009)") == 3
    assert "'shop.urls.OrderViewset.create', which no view, function or task" in report
    assert "'shop.urls.OrderViewSet.craete'" in report
    assert report.count("Did you mean 'shop.urls.OrderViewSet.create'?") == 2
    assert "Did you mean 'shop.tasks.ship'?" in report  # shpi; ship itself is declared


# Django's tasks framework instead of Celery: a task its URLconf does not import either.
DJANGO_TASKS_SETTINGS = """
SECRET_KEY = "operation-names"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_tasks_db",
    "idempotency",
    "shop",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
ROOT_URLCONF = "shop.urls"
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
USE_TZ = True
IDEMPOTENCY = {
    "RESOLVERS": {
        "shop.tasks.invoice": "idempotency.steps.effects_carry_step_keys",
        "shop.tasks.invoce": "idempotency.steps.effects_carry_step_keys",
    },
}
"""

DJANGO_TASKS_TASKS = """
try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

from idempotency.django_tasks import idempotent_task


@task()
@idempotent_task(key=lambda order: order, mode="lease")
def invoice(order):
    pass
"""


def test_a_fresh_project_on_djangos_tasks_is_told_of_its_misspelled_task(tmp_path):
    shop = {"urls.py": "urlpatterns = []\n", "tasks.py": DJANGO_TASKS_TASKS}
    report = checked_project(tmp_path, DJANGO_TASKS_SETTINGS, shop)
    assert report.count("(idempotency.W009)") == 1
    assert "'shop.tasks.invoce'" in report and "Did you mean 'shop.tasks.invoice'?" in report


# --- the cluster around the records' database (W011, W012) ---------------------------------

urlpatterns: list[Any] = []  # a project without lease-mode views (ROOT_URLCONF=__name__)


def cluster_warnings() -> list[Any]:
    from idempotency.checks import check_database

    found = check_database(databases=["default"])
    return [m for m in found if m.id in ("idempotency.W011", "idempotency.W012")]


@pytest.mark.server_db
@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"MODE": "lease"})
def test_a_single_server_is_no_cluster_to_warn_about():
    from idempotency.stores import clusters

    # This machine's PostgreSQL has no standby, its MariaDB no wsrep: nothing to say.
    assert clusters.galera("default") is None
    replication = clusters.replication("default")
    assert replication is None or replication.standbys == 0
    assert cluster_warnings() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("replication", "mode", "urls", "warned"),
    [
        ((2, False), "lease", "tests.support.urls", True),
        ((1, False), "atomic", "tests.support.check_urls", True),  # lease-mode views
        ((2, True), "lease", "tests.support.urls", False),  # synchronous
        ((0, False), "lease", "tests.support.urls", False),  # no standby to fail over to
        ((2, False), "atomic", __name__, False),  # nothing in lease mode
    ],
)
def test_lease_mode_on_a_primary_with_only_asynchronous_standbys_is_warned(
    monkeypatch, replication, mode, urls, warned
):
    from idempotency.stores import clusters

    standbys, synchronous = replication
    found = clusters.Replication(standbys=standbys, synchronous=synchronous)
    monkeypatch.setattr(clusters, "replication", lambda alias: found)
    monkeypatch.setattr(clusters, "galera", lambda alias: None)
    with override_settings(IDEMPOTENCY={"MODE": mode}, ROOT_URLCONF=urls):
        messages = cluster_warnings()
    assert [m.id for m in messages] == (["idempotency.W011"] if warned else [])
    if warned:
        (message,) = messages
        assert "none synchronous" in message.msg and "twice" in message.msg
        assert "synchronous_mode" in message.hint and "atomic mode" in message.hint


@pytest.mark.django_db
@pytest.mark.parametrize(("size", "conflicts"), [(3, 0), (2, 41)])
def test_a_galera_node_is_warned_about_writers_on_other_nodes(monkeypatch, size, conflicts):
    from idempotency.stores import clusters

    monkeypatch.setattr(clusters, "replication", lambda alias: None)
    monkeypatch.setattr(clusters, "galera", lambda alias: clusters.Galera(size, conflicts))
    (message,) = cluster_warnings()
    assert message.id == "idempotency.W012"
    assert f"Galera cluster of {size} nodes" in message.msg and "GET_LOCK" in message.msg
    assert (f"seen {conflicts} certification failures" in message.msg) == bool(conflicts)
    assert "SILENCED_SYSTEM_CHECKS" in message.hint
    with override_settings(SILENCED_SYSTEM_CHECKS=["idempotency.W012"]):
        out = StringIO()
        call_command("check", databases=["default"], stdout=out, stderr=out)
    assert "W012" not in out.getvalue()


@pytest.mark.django_db
def test_a_galera_node_alone_is_no_cluster(monkeypatch):
    from idempotency.stores import clusters

    monkeypatch.setattr(clusters, "replication", lambda alias: None)
    monkeypatch.setattr(clusters, "galera", lambda alias: clusters.Galera(1, 0))
    assert cluster_warnings() == []
