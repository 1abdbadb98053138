"""With a router that sends reads to a real streaming replica, records are read on the primary.

scripts/replica.sh starts a private primary and a hot standby of it that applies
each commit a few seconds late; tests/settings.py adds the standby as ``replica``
and tests/support/routers.py sends every read of the records (and of the orders) there.
A protocol that read a record from the replica would see a key as free that the
primary holds, replay nothing where an outcome is recorded, recover or purge
what is not there yet, and fail to write where the router put the record.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import connections, router
from django.test import override_settings

from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Operation
from idempotency.protocol.execute import execute
from idempotency.protocol.states import transition
from idempotency.recovery import recover_expired, resolve_record
from idempotency.retention import purge
from idempotency.stores import records_database
from tests.protocol.test_concurrency import post_order, run_in_threads
from tests.support.factories import IdempotencyRecordFactory, UserFactory
from tests.testapp.models import Order
from tests.unit.test_admin import act, changelist, listed, logged_in, notes, staff

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.replica,
    pytest.mark.django_db(transaction=True, databases=["default", "replica"]),
]

RESOLVER = "tests.deployment.test_replica.resolved_done"
PRIMARY = "default"


def resolved_done(record: IdempotencyRecord) -> Any:
    from idempotency.resolvers import Resolution

    return Resolution.done("order-7")


@pytest.fixture(autouse=True, scope="module")
def lagging_replica(django_db_setup: Any, django_db_blocker: Any) -> None:
    """Fail, never skip, unless ``replica`` is a hot standby of ``default`` that lags."""
    if not os.environ.get("REPLICA_URL"):
        pytest.fail("run it with scripts/replica.sh test (scripts/test.sh does)")
    with django_db_blocker.unblock():
        assert router.db_for_read(IdempotencyRecord) == "replica"
        assert records_database() == PRIMARY
        # The test database is streamed from the primary: wait until its tables are there.
        deadline = time.monotonic() + 60
        while True:
            try:
                with connections["replica"].cursor() as cursor:
                    cursor.execute("SELECT pg_is_in_recovery(), count(*) FROM shop_order")
                    in_recovery, _ = cursor.fetchone()
                break
            except Exception:
                connections["replica"].close()
                assert time.monotonic() < deadline, "the standby never got the test database"
                time.sleep(0.5)
        assert in_recovery, "replica should be a hot standby"
        connections["replica"].close()


def on_primary(**filters: Any) -> int:
    return IdempotencyRecord.objects.using(PRIMARY).filter(**filters).count()


def on_replica(**filters: Any) -> int:
    return IdempotencyRecord.objects.filter(**filters).count()  # the router's read


def test_the_replica_really_lags():
    record = IdempotencyRecordFactory(idem_key="lag-1", succeeded=True)
    assert on_primary(pk=record.pk) == 1
    assert on_replica(pk=record.pk) == 0  # committed on the primary, not applied yet
    deadline = time.monotonic() + 30
    while on_replica(pk=record.pk) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_concurrent_duplicates_execute_once_and_replay_at_once(mode):
    user = UserFactory()
    key = f"replica-{mode}"
    with override_settings(IDEMPOTENCY={"MODE": mode, "LOCK_TIMEOUT": 10}):
        answers = run_in_threads(8, lambda _: post_order(user, key))
        # Right away: the replica has not applied the outcome, the primary has.
        repeat = post_order(user, key)
    statuses = Counter(answer.status for answer in answers)
    assert statuses[201] >= 1 and set(statuses) <= {201, 409}, statuses
    assert sum(not answer.replayed for answer in answers if answer.status == 201) == 1
    assert repeat.status == 201 and repeat.replayed
    assert repeat.body == next(a.body for a in answers if a.status == 201 and not a.replayed)
    created = Order.objects.using(PRIMARY).filter(owner=user)
    assert created.count() == 1


def test_a_waiting_duplicate_gets_the_outcome_the_replica_does_not_have_yet():
    finished = threading.Event()

    def work(attempt: Any) -> str:
        time.sleep(0.5)
        return "made"

    def first() -> None:
        execute(operation("wait-1"), work, decide=decide, replay=replay)
        finished.set()

    thread = threading.Thread(target=first)
    thread.start()
    deadline = time.monotonic() + 10
    while not on_primary(idem_key="wait-1"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    second = execute(operation("wait-1", wait=5), work, decide=decide, replay=replay)
    thread.join(30)
    connections.close_all()
    assert finished.is_set()
    assert second == "replayed: made"
    assert on_primary(idem_key="wait-1", status=Status.SUCCEEDED) == 1


def operation(key: str, wait: float = 0.0) -> Operation:
    return Operation(
        scope="replica-tests",
        key=key,
        request_hash="ab" * 16,
        name="tests.replica",
        mode="lease",
        wait_seconds=wait,
    )


def decide(value: str, attempt: Any) -> Outcome:
    return Outcome(Status.SUCCEEDED, StoredResponse(201, [], value.encode()))


def replay(record: IdempotencyRecord) -> str:
    return "replayed: " + bytes(record.response_body or b"").decode()


@override_settings(IDEMPOTENCY={"RESOLVERS": {"tests.replica": RESOLVER}})
def test_recovery_settles_a_lease_that_expired_a_moment_ago():
    record = IdempotencyRecordFactory(operation="tests.replica", expired_lease=True)
    report = recover_expired()
    assert report.succeeded == 1
    moved = IdempotencyRecord.objects.using(PRIMARY).get(pk=record.pk)
    assert (moved.status, moved.resource_id) == (Status.SUCCEEDED, "order-7")


@override_settings(IDEMPOTENCY={"RESOLVERS": {"tests.replica": RESOLVER}})
def test_records_read_through_the_router_are_resolved_and_moved_on_the_primary():
    stuck = IdempotencyRecordFactory(operation="tests.replica", expired_lease=True)
    review = IdempotencyRecordFactory(needs_review=True)
    deadline = time.monotonic() + 30
    while on_replica(pk__in=[stuck.pk, review.pk]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    read = {record.pk: record for record in IdempotencyRecord.objects.all()}  # from the replica
    assert read[stuck.pk]._state.db == "replica"
    assert resolve_record(read[stuck.pk]) == "succeeded"
    moved = transition(read[review.pk], Status.FAILED_FINAL)
    assert moved._state.db == PRIMARY
    assert on_primary(pk=stuck.pk, status=Status.SUCCEEDED) == 1
    assert on_primary(pk=review.pk, status=Status.FAILED_FINAL) == 1


def test_purge_deletes_what_expired_on_the_primary():
    gone = IdempotencyRecordFactory(expired=True)
    kept = IdempotencyRecordFactory(succeeded=True)
    assert purge() == 1
    assert on_primary(pk=gone.pk) == 0 and on_primary(pk=kept.pk) == 1


@override_settings(IDEMPOTENCY={"RESOLVERS": {"tests.replica": RESOLVER}})
def test_the_admin_lists_and_resolves_records_the_replica_does_not_have_yet():
    operator = logged_in(staff("view_idempotencyrecord", "resolve_idempotencyrecord"))
    review = IdempotencyRecordFactory(needs_review=True)
    stuck = IdempotencyRecordFactory(operation="tests.replica", expired_lease=True)
    assert listed(changelist(operator)) >= {review.pk, stuck.pk}
    released = act(operator, "release_for_retry", review)
    assert any("1 record released" in note for note in notes(released)), notes(released)
    resolved = act(operator, "run_resolver", stuck)
    assert any("succeeded: 1" in note for note in notes(resolved)), notes(resolved)
    assert on_primary(pk=review.pk, status=Status.FAILED_RETRYABLE) == 1
    assert on_primary(pk=stuck.pk, status=Status.SUCCEEDED) == 1
    logged = LogEntry.objects.filter(action_flag=CHANGE, object_id__in=[review.pk, stuck.pk])
    assert logged.count() == 2


@override_settings(
    IDEMPOTENCY={"REPLAY_CACHE": "replays"},
    CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "replays": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    },
)
def test_a_record_read_from_the_replica_is_forgotten_under_the_records_database():
    from django.core.cache import caches

    from idempotency import replay_cache

    record = IdempotencyRecordFactory(succeeded=True, idem_key="cached-1")
    deadline = time.monotonic() + 30
    while on_replica(pk=record.pk) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    read = IdempotencyRecord.objects.get(pk=record.pk)  # from the replica
    assert read._state.db == "replica"
    replay_cache.forget_records([read])
    # Requests cache under the records' database: that is the entry to forget.
    entry = caches["replays"].get(replay_cache.cache_key(PRIMARY, record.scope, record.idem_key))
    assert entry == {"forgotten": True}


def test_lease_mode_on_this_asynchronous_primary_is_warned_by_check_database():
    from idempotency.checks import check_database

    # The standby streams asynchronously: a failover to it could lose acknowledged commits.
    with override_settings(IDEMPOTENCY={"MODE": "lease"}):
        (warning,) = [m for m in check_database(databases=[PRIMARY]) if m.id.endswith("W011")]
    assert "streaming to 1 standby, none synchronous" in warning.msg
