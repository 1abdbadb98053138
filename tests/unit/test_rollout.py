"""The rollout of docs/rollout.md: unkeyed requests served and counted, then refused.

While ``REQUIRE_KEY`` is False a request without a key runs unprotected; the
``request_unkeyed`` signal, the ``idempotency`` logger and the Prometheus counter
each see it, so an operator can tell which endpoints still get requests without one
before requiring keys.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import RequestFactory, override_settings
from prometheus_client import CollectorRegistry
from rest_framework.test import APIClient

from idempotency import idempotent, signals
from idempotency.contrib.prometheus import SignalCounters
from idempotency.models import IdempotencyRecord
from tests.support.factories import UserFactory
from tests.support.processes import ROOT, process_env, python

ORDER = {"sku": "rollout", "quantity": 1}
OBSERVE = {"REQUIRE_KEY": False}


@pytest.fixture
def api(db: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(UserFactory())
    return client


@pytest.fixture
def unkeyed() -> Iterator[list[dict[str, Any]]]:
    received: list[dict[str, Any]] = []

    def receive(sender: Any, signal: Any, **kwargs: Any) -> None:
        received.append({"sender": sender, **kwargs})

    signals.request_unkeyed.connect(receive, weak=False, dispatch_uid="test_rollout")
    yield received
    signals.request_unkeyed.disconnect(dispatch_uid="test_rollout")


@override_settings(IDEMPOTENCY=OBSERVE)
def test_a_request_without_a_key_is_served_and_signalled(api, unkeyed):
    assert api.post("/orders/", ORDER, format="json").status_code == 201

    (event,) = unkeyed
    assert event["sender"] is IdempotencyRecord
    assert event["operation"] == "tests.testapp.views.OrderViewSet.create"
    # Django's request, also under DRF: what a receiver reads (user, headers) is on it.
    assert event["request"].method == "POST" and event["request"].path == "/orders/"
    assert event["request"].user.is_authenticated
    assert not IdempotencyRecord.objects.exists()


@override_settings(IDEMPOTENCY=OBSERVE)
def test_a_request_with_a_key_is_protected_and_not_signalled(api, unkeyed):
    headers = {"Idempotency-Key": "rollout-1"}
    first = api.post("/orders/", ORDER, format="json", headers=headers)
    again = api.post("/orders/", ORDER, format="json", headers=headers)

    assert (first.status_code, again.status_code) == (201, 201)
    assert again["Idempotent-Replayed"] == "true"
    assert unkeyed == []


def test_once_keys_are_required_the_same_request_is_refused(api, unkeyed):
    response = api.post("/orders/", ORDER, format="json")

    assert response.status_code == 400
    assert response.json()["code"] == "idempotency_key_missing"
    assert unkeyed == []


@override_settings(IDEMPOTENCY=OBSERVE)
def test_a_plain_view_signals_too(db, unkeyed):
    @idempotent(scope=lambda request, operation: f"test:{operation}")
    def view(request: Any) -> Any:
        from django.http import JsonResponse

        return JsonResponse({}, status=201)

    assert view(RequestFactory().post("/plain-rollout/")).status_code == 201
    (event,) = unkeyed
    assert event["request"].path == "/plain-rollout/"


@override_settings(IDEMPOTENCY=OBSERVE)
def test_the_logger_logs_each_unkeyed_request(api, caplog):
    with caplog.at_level(logging.INFO, logger="idempotency"):
        api.post("/orders/", ORDER, format="json")

    (logged,) = [r for r in caplog.records if getattr(r, "event", "") == "idempotency.unkeyed"]
    assert logged.levelno == logging.INFO
    assert logged.getMessage() == (
        "idempotency unkeyed operation=tests.testapp.views.OrderViewSet.create "
        "method=POST path=/orders/"
    )
    assert (logged.method, logged.path) == ("POST", "/orders/")  # type: ignore[attr-defined]


@override_settings(IDEMPOTENCY=OBSERVE)
def test_prometheus_counts_unkeyed_requests_by_operation(api):
    registry = CollectorRegistry()
    counters = SignalCounters(registry)
    counters.connect()
    try:
        api.post("/orders/", ORDER, format="json")
        api.post("/orders/", ORDER, format="json")
        api.post("/orders/", ORDER, format="json", headers={"Idempotency-Key": "rollout-2"})
    finally:
        counters.disconnect()

    operation = "tests.testapp.views.OrderViewSet.create"
    labels = {"operation": operation}
    assert registry.get_sample_value("idempotency_unkeyed_requests_total", labels) == 2
    assert (
        registry.get_sample_value("idempotency_claims_total", {**labels, "outcome": "claimed"}) == 1
    )


# docs/rollout.md, "Seeing the log line": in a process of its own, Django's logging set up
# by django.setup() from the settings alone, as a deployed project's is.
DOCS = ROOT / "docs" / "rollout.md"

PROJECT_SETTINGS = """
SECRET_KEY = "rollout-logging"
DEBUG = False
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "idempotency"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
IDEMPOTENCY = {"REQUIRE_KEY": False}
"""

KEYLESS_REQUEST = """
import django

django.setup()
from django.http import HttpResponse
from django.test import RequestFactory

from idempotency import idempotent


@idempotent(scope=lambda request, operation: "partner:acme")
def create_order(request):
    return HttpResponse(status=201)


assert create_order(RequestFactory().post("/orders/")).status_code == 201
"""


def docs_logging_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    (snippet,) = [block for block in blocks if block.startswith("LOGGING = {")]
    return snippet


def keyless_request_logs(tmp_path: Path, settings: str) -> str:
    (tmp_path / "rollout_settings.py").write_text(settings)
    env = process_env(
        database=False, DJANGO_SETTINGS_MODULE="rollout_settings", PYTHONPATH=f"{tmp_path}:{ROOT}"
    )
    ran = subprocess.run(
        python("-c", KEYLESS_REQUEST), cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stderr


def test_djangos_default_logging_drops_the_unkeyed_line(tmp_path):
    assert "idempotency unkeyed" not in keyless_request_logs(tmp_path, PROJECT_SETTINGS)


def test_the_documented_logging_setting_shows_the_unkeyed_line(tmp_path):
    logged = keyless_request_logs(tmp_path, PROJECT_SETTINGS + docs_logging_snippet())
    assert "idempotency unkeyed operation=__main__.create_order method=POST path=/orders/" in logged
