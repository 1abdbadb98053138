"""The optional Prometheus counters: fed by the signals, labelled by operation and outcome only."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from idempotency import signals
from idempotency.contrib import prometheus
from idempotency.contrib.prometheus import SignalCounters
from idempotency.models import IdempotencyRecord, Status
from idempotency.protocol import Operation
from tests.support.processes import ROOT, process_env, python

OPERATION = Operation(
    scope="user:1:orders.create", key="k-1", request_hash="ab" * 16, name="orders"
)
RECORD = IdempotencyRecord(scope=OPERATION.scope, idem_key="k-1", status=Status.SUCCEEDED)


@pytest.fixture
def metrics() -> Iterator[tuple[SignalCounters, CollectorRegistry]]:
    registry = CollectorRegistry()
    counters = SignalCounters(registry)
    counters.connect()
    yield counters, registry
    counters.disconnect()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def send_one_of_each() -> None:
    sender = IdempotencyRecord
    signals.record_claimed.send(sender, record=RECORD, operation=OPERATION, reclaimed=False)
    signals.record_claimed.send(sender, record=RECORD, operation=OPERATION, reclaimed=True)
    signals.record_claimed.send(
        sender, record=RECORD, operation=OPERATION, reclaimed=False, replaced=True
    )
    signals.response_replayed.send(sender, record=RECORD, operation=OPERATION)
    signals.key_in_use.send(sender, operation=OPERATION, retry_after=3)
    signals.key_under_review.send(sender, record=RECORD, operation=OPERATION)
    signals.key_reused.send(sender, record=RECORD, operation=OPERATION)
    signals.record_completed.send(
        sender, record=RECORD, operation=OPERATION, status=Status.FAILED_FINAL
    )
    signals.record_recovered.send(sender, record=RECORD, operation="orders", outcome="released")
    signals.records_purged.send(sender, count=5, dry_run=False)
    signals.records_purged.send(sender, count=7, dry_run=True)


def test_each_signal_is_counted_by_operation_and_outcome(metrics):
    _, registry = metrics
    send_one_of_each()
    expected = {
        ("idempotency_claims_total", "claimed"): 1,
        ("idempotency_claims_total", "reclaimed"): 1,
        ("idempotency_claims_total", "replaced"): 1,
        ("idempotency_replays_total", "succeeded"): 1,
        ("idempotency_conflicts_total", "in_use"): 1,
        ("idempotency_conflicts_total", "under_review"): 1,
        ("idempotency_conflicts_total", "key_reused"): 1,
        ("idempotency_completions_total", "failed_final"): 1,
        ("idempotency_recoveries_total", "released"): 1,
    }
    for (name, outcome), count in expected.items():
        assert value(registry, name, operation="orders", outcome=outcome) == count
    assert value(registry, "idempotency_purged_records_total") == 5  # dry runs excluded


def test_keys_and_scopes_never_become_labels(metrics):
    _, registry = metrics
    send_one_of_each()
    for family in registry.collect():
        for sample in family.samples:
            assert set(sample.labels) <= {"operation", "outcome"}
            assert "k-1" not in sample.labels.values()
            assert OPERATION.scope not in sample.labels.values()


def test_disconnect_stops_counting(metrics):
    counters, registry = metrics
    counters.disconnect()
    send_one_of_each()
    assert (
        value(registry, "idempotency_claims_total", operation="orders", outcome="claimed") is None
    )


def test_enable_counts_on_the_default_registry_once():
    first = prometheus.enable()
    try:
        assert prometheus.enable() is first  # no duplicate registration
        before = REGISTRY.get_sample_value(
            "idempotency_conflicts_total", {"operation": "orders", "outcome": "in_use"}
        )
        signals.key_in_use.send(IdempotencyRecord, operation=OPERATION, retry_after=1)
        after = REGISTRY.get_sample_value(
            "idempotency_conflicts_total", {"operation": "orders", "outcome": "in_use"}
        )
        assert after == (before or 0) + 1
    finally:
        prometheus.disable()


# docs/observability.md's first way: the app in INSTALLED_APPS. Django imports the app's
# module while it populates the registry, so each case runs in a fresh process.
INSTALLED_SETTINGS = """
SECRET_KEY = "prometheus-installed"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "idempotency",
    "idempotency.contrib.prometheus",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
ROOT_URLCONF = "prometheus_installed_settings"
urlpatterns = []
USE_TZ = True
"""


@pytest.fixture
def installed(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "prometheus_installed_settings.py").write_text(INSTALLED_SETTINGS)
    return process_env(
        database=False,
        DJANGO_SETTINGS_MODULE="prometheus_installed_settings",
        PYTHONPATH=f"{tmp_path}:{ROOT}",
    )


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        python(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_app_in_installed_apps_lets_manage_py_commands_run(installed):
    checked = run(installed, "-m", "django", "check")
    assert checked.returncode == 0, checked.stderr
    assert "System check identified no issues" in checked.stdout


def test_the_app_in_installed_apps_counts_from_the_start(installed):
    script = textwrap.dedent("""
        import django

        django.setup()
        from prometheus_client import REGISTRY

        from idempotency import signals
        from idempotency.models import IdempotencyRecord

        signals.key_reused.send(IdempotencyRecord, record=None, operation="orders")
        labels = {"operation": "orders", "outcome": "key_reused"}
        print(REGISTRY.get_sample_value("idempotency_conflicts_total", labels))
    """)
    counted = run(installed, "-c", script)
    assert counted.returncode == 0, counted.stderr
    assert counted.stdout.strip() == "1.0"
