"""OpenTelemetry spans (idempotency/tracing.py), read from the SDK's in-memory exporter."""

from __future__ import annotations

import subprocess

import pytest
from django.db import connection
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from rest_framework.test import APIClient

from idempotency import KeyInUse, KeyUnderReview, LeaseLost, Resolution, idempotent_function
from idempotency.fingerprint import canonical, digest_of, fingerprint
from idempotency.models import IdempotencyRecord
from idempotency.tracing import key_digest
from tests.support.factories import IdempotencyRecordFactory, UserFactory
from tests.support.processes import process_env, python

EXPORTER = InMemorySpanExporter()


def _export_to_memory() -> None:
    # The global provider can be set once per process: join one set before (a docs page's).
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))


_export_to_memory()

ORDER = {"sku": "traced", "quantity": 1}


@pytest.fixture(autouse=True)
def spans():
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def ours():
    return [span for span in EXPORTER.get_finished_spans() if span.name.startswith("idempotency ")]


def decisions():
    return [span.attributes.get("idempotency.decision") for span in ours()]


@pytest.fixture
def api(db):
    client = APIClient()
    client.force_authenticate(UserFactory())
    return client


def post(api, key, body=ORDER, path="/orders/"):
    return api.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_executed_then_replayed_with_operation_mode_and_vendor(api):
    assert post(api, "t-1").status_code == 201
    assert post(api, "t-1").status_code == 201

    first, replay = ours()
    assert decisions() == ["executed", "replayed"]
    assert first.name == "idempotency tests.testapp.views.OrderViewSet.create"
    assert first.attributes["idempotency.operation"] == "tests.testapp.views.OrderViewSet.create"
    assert first.attributes["idempotency.mode"] == "atomic"
    assert first.attributes["db.system"] == connection.vendor
    assert first.attributes["idempotency.status"] == "SUCCEEDED"
    assert first.attributes["idempotency.reclaimed"] is False
    assert first.attributes["idempotency.replaced"] is False
    assert replay.attributes["idempotency.status"] == "SUCCEEDED"
    # One key, one digest: the retries of a key are found together.
    assert first.attributes["idempotency.key_digest"] == replay.attributes["idempotency.key_digest"]
    assert first.status.status_code == StatusCode.UNSET


def test_reused_and_invalid_keys(api):
    post(api, "t-2")
    assert post(api, "t-2", {"sku": "other", "quantity": 1}).status_code == 422
    assert post(api, "bad key").status_code == 400
    assert api.post("/orders/", ORDER, format="json").status_code == 400  # required key missing

    assert decisions() == ["executed", "reused", "invalid", "invalid"]
    assert [span.attributes.get("idempotency.error") for span in ours()[2:]] == [
        "idempotency_key_invalid",
        "idempotency_key_missing",
    ]
    assert all(span.status.status_code == StatusCode.UNSET for span in ours())


def test_an_optional_key_left_out_is_unkeyed(api):
    assert api.post("/optional-orders/", ORDER, format="json").status_code == 201

    assert decisions() == ["unkeyed"]


def test_conflict_with_a_request_in_flight(db):
    record = IdempotencyRecordFactory(in_flight=True, operation="tests.traced.busy")

    @idempotent_function(
        scope=record.scope, key=lambda: record.idem_key, operation=record.operation
    )
    def busy() -> None:
        raise AssertionError("must not run")

    IdempotencyRecord.objects.filter(pk=record.pk).update(request_hash=_hash_of_no_arguments())
    with pytest.raises(KeyInUse):
        busy()

    (span,) = ours()
    assert span.attributes["idempotency.decision"] == "conflict"
    assert span.attributes["idempotency.retry_after"] >= 1


def test_a_key_under_review(db):
    record = IdempotencyRecordFactory(needs_review=True, operation="tests.traced.review")

    @idempotent_function(
        scope=record.scope, key=lambda: record.idem_key, operation=record.operation
    )
    def reviewed() -> None:
        raise AssertionError("must not run")

    IdempotencyRecord.objects.filter(pk=record.pk).update(request_hash=_hash_of_no_arguments())
    with pytest.raises(KeyUnderReview):
        reviewed()

    (span,) = ours()
    assert span.attributes["idempotency.decision"] == "under_review"
    assert "idempotency.retry_after" not in span.attributes
    assert span.status.status_code == StatusCode.UNSET  # the client's answer, not a failure


def _hash_of_no_arguments() -> bytes:
    # The arguments by name (idempotency.functions): none here.
    return digest_of(fingerprint([canonical({})]))


def test_a_function_executed_then_replayed(db):
    @idempotent_function(scope="consumer", key=lambda event: event["id"], operation="tests.fn")
    def handle(event: dict) -> int:
        return 7

    assert handle({"id": "evt-1"}) == handle({"id": "evt-1"}) == 7

    assert decisions() == ["executed", "replayed"]
    assert ours()[0].attributes["idempotency.operation"] == "tests.fn"


@pytest.mark.django_db(transaction=True)
def test_lease_lost_is_an_error_span():
    @idempotent_function(scope="consumer", key=lambda: "evt-lost", mode="lease")
    def overtaken() -> None:
        # Another worker took the record over while this one ran.
        IdempotencyRecord.objects.update(owner_token=b"someone-else")

    with pytest.raises(LeaseLost):
        overtaken()

    (span,) = ours()
    assert span.attributes["idempotency.decision"] == "lease_lost"
    assert span.attributes["idempotency.mode"] == "lease"
    assert span.status.status_code == StatusCode.ERROR


@pytest.mark.django_db(transaction=True)
def test_recovered_when_a_lost_lease_is_settled_by_the_resolver():
    record = IdempotencyRecordFactory(expired_lease=True, operation="tests.traced.recovered")
    IdempotencyRecord.objects.filter(pk=record.pk).update(request_hash=_hash_of_no_arguments())

    @idempotent_function(
        scope=record.scope,
        key=lambda: record.idem_key,
        operation=record.operation,
        mode="lease",
        resolver=lambda stuck: Resolution.done(resource_id="r-1"),
    )
    def recovered() -> None:
        raise AssertionError("the first attempt's effect happened: must not run again")

    recovered()

    (span,) = ours()
    assert span.attributes["idempotency.decision"] == "recovered"
    assert span.attributes["idempotency.recovery_outcome"] == "succeeded"


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_an_outage_is_an_error_span(client):
    client.force_login(UserFactory())
    reply = client.post(
        "/outage/plain/",
        {},
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="t-outage",
        HTTP_X_BREAK="after",
    )

    assert reply.status_code == 503
    (span,) = ours()
    assert span.attributes["idempotency.decision"] == "outage"
    assert span.status.status_code == StatusCode.ERROR


def test_never_the_key_or_the_scope_in_clear(api):
    key = "secret-key-4242"
    post(api, key)
    post(api, key)
    post(api, key, {"sku": "other", "quantity": 1})
    (scope,) = IdempotencyRecord.objects.values_list("scope", flat=True)

    assert len(ours()) == 3
    for span in ours():
        for value in span.attributes.values():
            assert key not in str(value) and scope not in str(value)
        assert key not in span.name and scope not in span.name
        assert span.attributes["idempotency.key_digest"] == key_digest(scope, key)


WITHOUT_OPENTELEMETRY = """
import sys
sys.modules["opentelemetry"] = None  # not installed
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from idempotency import idempotent_function, tracing
assert not tracing.enabled()
calls = []
@idempotent_function(scope="consumer", key=lambda event: event["id"])
def handle(event):
    calls.append(event)
    return len(calls)
assert handle({"id": "e-1"}) == handle({"id": "e-1"}) == 1
print("ok")
"""


def test_the_library_works_without_opentelemetry():
    env = process_env(database=False, DATABASE_URL="sqlite://:memory:")
    result = subprocess.run(
        python("-c", WITHOUT_OPENTELEMETRY), env=env, capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_without_an_sdk_a_protected_request_starts_no_span(api, monkeypatch):
    """The API alone records nothing: no tracer is asked, no digest of the key is made."""

    def refuse(*args, **kwargs):
        raise AssertionError("no span should be started without an SDK")

    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    monkeypatch.setattr(trace, "get_tracer", refuse)
    monkeypatch.setattr("idempotency.tracing.key_digest", refuse)
    assert post(api, "no-sdk").status_code == 201
    assert post(api, "no-sdk").status_code == 201
    assert ours() == []
