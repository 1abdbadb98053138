"""The opt-in replay cache (``REPLAY_CACHE``): faster replays, never a different answer.

Most tests run on a Redis cache (the shared cache a deployment would use),
each under a key prefix of its own.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.sites import site
from django.core.cache import caches
from django.db import connection, transaction
from django.test import RequestFactory, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from idempotency import replay_cache, signals
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Operation
from idempotency.protocol.execute import execute
from idempotency.protocol.states import transition
from idempotency.retention import purge
from tests.support.factories import IdempotencyRecordFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = {"sku": "book", "quantity": 2}
REDIS = os.environ.get("IDEMPOTENCY_TEST_REPLAY_CACHE", "redis://127.0.0.1:6379/14")


@pytest.fixture(autouse=True)
def cache():
    caches_setting = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "replays": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS,
            "KEY_PREFIX": f"tests-{uuid.uuid4().hex}",
        },
    }
    with override_settings(CACHES=caches_setting, IDEMPOTENCY={"REPLAY_CACHE": "replays"}):
        yield caches["replays"]
        caches["replays"].clear()


@pytest.fixture
def user():
    return UserFactory()


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def post(client: APIClient, data=ORDER, key: str = "k-1"):
    return client.post("/orders/", data, format="json", headers={"Idempotency-Key": key})


def record_queries(queries) -> list[str]:
    return [q["sql"] for q in queries if IdempotencyRecord._meta.db_table in q["sql"]]


def cached_entry(cache, record: IdempotencyRecord):
    return cache.get(replay_cache.cache_key("default", record.scope, record.idem_key))


def test_a_replay_is_answered_from_the_cache_without_touching_the_record(user, cache):
    client = client_for(user)
    first = post(client)
    assert first.status_code == 201
    with CaptureQueriesContext(connection) as queries:
        again = post(client)
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert record_queries(queries) == []
    record = IdempotencyRecord.objects.get()
    entry = cached_entry(cache, record)
    assert (entry["pk"], entry["resource_id"]) == (record.pk, record.resource_id)


def test_a_replay_from_the_cache_is_signalled_like_any_replay(user):
    client = client_for(user)
    post(client)
    heard = []

    def receiver(sender, record, operation, **kwargs):
        heard.append((record.status, operation.key))

    signals.response_replayed.connect(receiver)
    try:
        post(client)
    finally:
        signals.response_replayed.disconnect(receiver)
    assert heard == [(Status.SUCCEEDED, "k-1")]


def test_a_different_body_under_a_cached_key_is_still_422(user, cache):
    client = client_for(user)
    post(client)
    assert cached_entry(cache, IdempotencyRecord.objects.get()) is not None
    reused = post(client, {"sku": "book", "quantity": 3})
    assert reused.status_code == 422
    assert reused.json()["code"] == "idempotency_key_reused"


def test_another_scope_never_gets_a_cached_response(user):
    post(client_for(user))
    other = UserFactory()
    response = post(client_for(other))
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    assert IdempotencyRecord.objects.count() == 2


def test_an_entry_planted_under_another_scope_is_never_served(user, cache):
    # Even an entry sitting under this caller's cache key answers only if it
    # names this caller's scope, key and request.
    client = client_for(user)
    post(client, key="mine")
    mine = IdempotencyRecord.objects.get()
    other = UserFactory()
    forged = {**cached_entry(cache, mine), "scope": f"user:{other.pk}:orders"}
    operation = Operation(scope=f"user:{other.pk}:orders", key="mine", request_hash="0" * 32)
    cache.set(replay_cache.cache_key("default", operation.scope, "mine"), forged)
    assert replay_cache.lookup(operation) is None
    response = post(client_for(other), key="mine")
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response


def _operation(key: str, mode: str = "lease") -> Operation:
    return Operation(scope="consumer:a", key=key, request_hash="ab" * 16, name="t", mode=mode)  # type: ignore[arg-type]


def _outcome(status: Status = Status.SUCCEEDED) -> Outcome:
    return Outcome(status=status, response=StoredResponse(200, [], b'"done"'))


def test_processing_is_never_cached(cache):
    operation = _operation("in-flight")
    seen = []

    def work(attempt):
        record = IdempotencyRecord.objects.get(idem_key="in-flight")
        assert record.status == Status.PROCESSING  # committed: lease mode
        replay_cache.remember(operation, record)
        seen.append(replay_cache.lookup(operation))
        return "done"

    execute(operation, work, decide=lambda value, attempt: None, replay=lambda r: "replayed")
    assert seen == [None]
    assert cache.get(replay_cache.cache_key("default", "consumer:a", "in-flight")) is None


def test_a_retryable_failure_is_never_cached(cache):
    operation = _operation("retryable")
    execute(
        operation,
        lambda attempt: "failed",
        decide=lambda value, attempt: _outcome(Status.FAILED_RETRYABLE),
        replay=lambda record: "replayed",
    )
    assert IdempotencyRecord.objects.get().status == Status.FAILED_RETRYABLE
    assert replay_cache.lookup(operation) is None


def test_an_outcome_is_cached_only_once_its_transaction_commits(cache):
    operation = _operation("rolled-back", mode="atomic")
    with transaction.atomic():
        execute(
            operation,
            lambda attempt: "done",
            decide=lambda value, attempt: _outcome(),
            replay=lambda record: "replayed",
        )
        assert replay_cache.lookup(operation) is None  # not before the commit
        transaction.set_rollback(True)
    assert replay_cache.lookup(operation) is None
    assert not IdempotencyRecord.objects.exists()
    runs = []
    execute(
        operation,
        lambda attempt: runs.append(1) or "done",
        decide=lambda value, attempt: _outcome(),
        replay=lambda record: "replayed",
    )
    assert runs == [1]
    assert replay_cache.lookup(operation) is not None


def test_a_replay_read_from_the_database_fills_the_cache(user, cache):
    client = client_for(user)
    post(client)
    record = IdempotencyRecord.objects.get()
    cache.clear()  # as after an eviction or a restart
    assert post(client)["Idempotent-Replayed"] == "true"
    assert cached_entry(cache, record)["request_hash"] == record.request_hash
    with CaptureQueriesContext(connection) as queries:
        assert post(client)["Idempotent-Replayed"] == "true"
    assert record_queries(queries) == []


def test_a_record_an_operator_resolves_is_replayed_as_resolved(user, cache):
    client = client_for(user)
    probe = _probe(user)
    record = IdempotencyRecordFactory(
        scope=probe.scope,
        idem_key="k-1",
        status=Status.NEEDS_REVIEW,
        request_hash=probe.request_hash,
    )
    assert post(client).status_code == 409
    assert cached_entry(cache, record) is None
    transition(
        record,
        Status.SUCCEEDED,
        resource_id="42",
        response=StoredResponse(201, [("Content-Type", "application/json")], b'{"id": 42}'),
    )
    replayed = post(client)
    assert replayed.status_code == 201
    assert replayed.json() == {"id": 42}


def test_a_record_an_operator_deletes_is_not_replayed_from_the_cache(user, cache, admin_client):
    client = client_for(user)
    first = post(client)
    record = IdempotencyRecord.objects.get()
    assert cached_entry(cache, record) is not None
    url = f"/admin/idempotency/idempotencyrecord/{record.pk}/delete/"
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()
    again = post(client)
    assert again.status_code == 201
    assert "Idempotent-Replayed" not in again  # the key was free: the view ran again
    assert again.json()["id"] != first.json()["id"]


def test_a_tombstone_keeps_a_racing_replay_from_caching_a_deleted_record(user, cache):
    client = client_for(user)
    post(client)
    record = IdempotencyRecord.objects.get()
    operation = Operation(scope=record.scope, key="k-1", request_hash=record.request_hash)
    stale = IdempotencyRecord.objects.get(pk=record.pk)  # read just before the delete
    site._registry[IdempotencyRecord].delete_model(RequestFactory().post("/"), record)
    replay_cache.remember(operation, stale)  # the racing request caches what it read
    assert replay_cache.lookup(operation) is None


def test_purge_forgets_what_it_deletes(user, cache):
    client = client_for(user)
    post(client)
    record = IdempotencyRecord.objects.get()
    assert cached_entry(cache, record) is not None
    assert purge(older_than=timedelta(0)) == 1
    assert cached_entry(cache, record) is None
    again = post(client)
    assert again.status_code == 201
    assert "Idempotent-Replayed" not in again


def test_an_entry_lives_no_longer_than_the_record(user, cache):
    with override_settings(IDEMPOTENCY={"REPLAY_CACHE": "replays", "RETENTION": {"SUCCEEDED": 5}}):
        post(client_for(user))
        record = IdempotencyRecord.objects.get()
        key = cache.make_and_validate_key(
            replay_cache.cache_key("default", record.scope, record.idem_key)
        )
        ttl = cache._cache.get_client(key).ttl(key)
    # The window's last second is left to the database: it decides when the key is new.
    assert 0 < ttl <= 5 - replay_cache.EDGE_SECONDS


def test_an_entry_ends_with_the_window_counted_from_the_claim(user, cache):
    # Atomic mode on PostgreSQL counts the window from the claim: a slow request's
    # entry must not outlive its record by the time the work took.
    with override_settings(IDEMPOTENCY={"REPLAY_CACHE": "replays", "RETENTION": {"SUCCEEDED": 5}}):
        before = time.time()
        client_for(user).post(
            "/orders/?sleep=1.5", ORDER, format="json", headers={"Idempotency-Key": "k-1"}
        )
        entry = cached_entry(cache, IdempotencyRecord.objects.get())
    assert before + 5 - 0.1 < entry["expires"] < before + 5 + 1


def test_an_entry_past_its_window_does_not_answer(user, cache):
    client = client_for(user)
    post(client)
    record = IdempotencyRecord.objects.get()
    key = replay_cache.cache_key("default", record.scope, record.idem_key)
    # Its timeout has not run out (a backend may round it), but it says the window has.
    cache.set(key, {**cache.get(key), "expires": time.time() + replay_cache.EDGE_SECONDS / 2})
    with CaptureQueriesContext(connection) as queries:
        assert post(client)["Idempotent-Replayed"] == "true"  # the database's answer
    assert record_queries(queries)


def test_an_expired_record_runs_again_though_its_entry_is_cached(user, cache):
    client = client_for(user)
    first = post(client)
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    record = IdempotencyRecord.objects.get()
    key = replay_cache.cache_key("default", record.scope, record.idem_key)
    cache.set(key, {**cache.get(key), "expires": record.expires_at.timestamp()})
    again = post(client)
    assert again.status_code == 201
    assert "Idempotent-Replayed" not in again
    assert again.json()["id"] != first.json()["id"]


def test_without_the_setting_nothing_is_cached(user, cache):
    with override_settings(IDEMPOTENCY={}):
        client = client_for(user)
        post(client)
        with CaptureQueriesContext(connection) as queries:
            assert post(client)["Idempotent-Replayed"] == "true"
    assert record_queries(queries)
    assert cached_entry(cache, IdempotencyRecord.objects.get()) is None


def test_when_the_cache_is_down_the_database_answers(user):
    down = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "replays": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        },
    }
    with override_settings(CACHES=down):
        client = client_for(user)
        assert post(client).status_code == 201
        replayed = post(client)
    assert replayed.status_code == 201
    assert replayed["Idempotent-Replayed"] == "true"


def test_a_cache_alias_that_does_not_exist_leaves_the_database_to_answer(user, monkeypatch):
    # E029 refuses this setting at first use; past that guard, the database still answers.
    monkeypatch.setattr("idempotency.settings_checks.settings_messages", lambda user: [])
    with override_settings(IDEMPOTENCY={"REPLAY_CACHE": "no-such-cache"}):
        client = client_for(user)
        assert post(client).status_code == 201
        assert post(client)["Idempotent-Replayed"] == "true"


def _probe(user) -> IdempotencyRecord:
    """The record of another key, with the scope and request hash that ``post`` sends."""
    response = post(client_for(user), key="probe")
    assert response.status_code == 201
    return IdempotencyRecord.objects.get(idem_key="probe")
