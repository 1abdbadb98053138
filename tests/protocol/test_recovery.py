"""Recovery: resolve_record, recover_expired in batches, parallel workers, killed processes."""

from __future__ import annotations

import json
import select
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from idempotency import signals
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Operation
from idempotency.protocol.execute import execute
from idempotency.recovery import RecoveryReport, recover_expired, resolve_record
from idempotency.resolvers import Resolution, register
from tests.support import lease_worker
from tests.support.factories import IdempotencyRecordFactory, UserFactory
from tests.support.processes import process_env, python, start, stop
from tests.testapp.lease_views import sku_for
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

OPERATION = "tests.recovery"
ORDER_RESOLVER = "tests.testapp.lease_views.order_resolver"


def answer(resolution: Resolution) -> str:
    """Make ``OPERATION``'s resolver give ``resolution``; returns its name for the setting."""
    register(OPERATION, lambda record: resolution)
    return OPERATION


@pytest.fixture(autouse=True)
def _forget_the_test_resolver():
    yield
    from idempotency import resolvers

    resolvers._registry.pop(OPERATION, None)


def expired(**fields: Any) -> IdempotencyRecord:
    return IdempotencyRecordFactory(expired_lease=True, operation=OPERATION, **fields)


def reload(record: IdempotencyRecord) -> IdempotencyRecord:
    return IdempotencyRecord.objects.get(pk=record.pk)


class TestResolveRecord:
    def test_done_succeeds_with_the_resource_and_the_response_to_replay(self):
        response = StoredResponse(201, [("Content-Type", "application/json")], b'{"id": 9}')
        answer(Resolution.done(9, response=response))
        record = expired()
        assert resolve_record(record) == "succeeded"
        stored = reload(record)
        assert stored.status == Status.SUCCEEDED
        assert stored.resource_id == "9"
        assert stored.response_status == 201
        assert bytes(stored.response_body) == b'{"id": 9}'
        assert stored.response_headers == [["Content-Type", "application/json"]]
        assert stored.owner_token != record.owner_token  # the dead owner is fenced out
        assert stored.expires_at is not None and stored.completed_at is not None
        assert stored.recovery_attempts == 1

    def test_not_done_releases_the_key_for_a_retry(self):
        answer(Resolution.not_done())
        record = expired()
        assert resolve_record(record) == "released"
        stored = reload(record)
        assert stored.status == Status.FAILED_RETRYABLE
        assert stored.lease_until is None
        assert stored.expires_at is not None

    @override_settings(IDEMPOTENCY={"RESOLVE_RETRY_SECONDS": 120})
    def test_unknown_counts_an_attempt_and_looks_again_later(self):
        answer(Resolution.unknown())
        record = expired()
        assert resolve_record(record) == "unknown"
        stored = reload(record)
        assert stored.status == Status.PROCESSING
        assert stored.recovery_attempts == 1
        assert stored.owner_token == record.owner_token  # a slow owner may still finish
        assert not IdempotencyRecord.objects.expired_leases().filter(pk=record.pk).exists()
        assert resolve_record(stored) == "skipped"  # not expired again yet

    @override_settings(IDEMPOTENCY={"MAX_RESOLVE_ATTEMPTS": 3})
    def test_unknown_after_the_last_attempt_needs_review(self):
        answer(Resolution.unknown())
        record = expired(recovery_attempts=2)
        assert resolve_record(record) == "needs_review"
        stored = reload(record)
        assert stored.status == Status.NEEDS_REVIEW
        assert stored.recovery_attempts == 3
        assert stored.expires_at is None  # never purged

    def test_without_a_resolver_the_record_needs_review(self):
        record = IdempotencyRecordFactory(expired_lease=True, operation="tests.no_resolver")
        assert resolve_record(record) == "needs_review"
        assert reload(record).status == Status.NEEDS_REVIEW

    @override_settings(IDEMPOTENCY={"RELEASE_EXPIRED_WITHOUT_RESOLVER": True})
    def test_without_a_resolver_released_if_the_operator_said_so(self):
        record = IdempotencyRecordFactory(expired_lease=True, operation="tests.no_resolver")
        assert resolve_record(record) == "released"
        assert reload(record).status == Status.FAILED_RETRYABLE

    @override_settings(IDEMPOTENCY={"RESOLVERS": {"tests.from_settings": ORDER_RESOLVER}})
    def test_the_setting_names_the_resolver(self):
        owner = UserFactory()
        record = IdempotencyRecordFactory(expired_lease=True, operation="tests.from_settings")
        order = Order.objects.create(owner=owner, sku=sku_for(record.idem_key), quantity=1)
        assert resolve_record(record) == "succeeded"
        stored = reload(record)
        assert stored.resource_id == str(order.pk)
        assert json.loads(bytes(stored.response_body)) == {"id": order.pk}

    def test_a_live_lease_is_never_taken(self):
        answer(Resolution.done(1))
        record = IdempotencyRecordFactory(in_flight=True, operation=OPERATION)
        assert resolve_record(record) == "skipped"
        assert reload(record).status == Status.PROCESSING

    @pytest.mark.parametrize("trait", ["succeeded", "failed_final", "failed_retryable"])
    def test_settled_records_are_skipped(self, trait):
        answer(Resolution.not_done())
        record = IdempotencyRecordFactory(**{trait: True}, operation=OPERATION)
        assert resolve_record(record) == "skipped"
        assert reload(record).status == record.status

    def test_an_operator_can_ask_again_about_a_record_in_review(self):
        answer(Resolution.done(5))
        record = IdempotencyRecordFactory(needs_review=True, operation=OPERATION)
        assert resolve_record(record) == "succeeded"
        assert reload(record).status == Status.SUCCEEDED

    def test_in_review_and_still_unknown_stays_in_review(self):
        answer(Resolution.unknown())
        record = IdempotencyRecordFactory(needs_review=True, operation=OPERATION)
        assert resolve_record(record) == "unknown"
        assert reload(record).status == Status.NEEDS_REVIEW

    def test_a_resolver_that_raises_or_answers_nonsense_is_unknown(self):
        def broken(record: IdempotencyRecord) -> Resolution:
            raise RuntimeError("the provider's API is down")

        register(OPERATION, broken)
        assert resolve_record(expired()) == "unknown"
        register(OPERATION, lambda record: "yes")
        assert resolve_record(expired()) == "unknown"

    def test_signal_names_the_outcome(self):
        answer(Resolution.not_done())
        record = expired()
        calls: list[dict[str, Any]] = []

        def receiver(**kwargs: Any) -> None:
            calls.append(kwargs)

        signals.record_recovered.connect(receiver, weak=False)
        try:
            resolve_record(record)
        finally:
            signals.record_recovered.disconnect(receiver)
        assert len(calls) == 1
        assert calls[0]["outcome"] == "released"
        assert calls[0]["operation"] == OPERATION
        assert calls[0]["record"].pk == record.pk


class TestRecoverExpired:
    def test_reports_counts_and_leaves_other_records_alone(self):
        answer(Resolution.done(1))
        stale = [expired() for _ in range(3)]
        others = [
            IdempotencyRecordFactory(in_flight=True, operation=OPERATION),
            IdempotencyRecordFactory(succeeded=True, operation=OPERATION),
            IdempotencyRecordFactory(needs_review=True, operation=OPERATION),
        ]
        report = recover_expired()
        assert (report.succeeded, report.examined) == (3, 3)
        assert all(reload(r).status == Status.SUCCEEDED for r in stale)
        assert [reload(r).status for r in others] == [r.status for r in others]

    def test_mixed_answers(self):
        register(
            OPERATION,
            lambda record: {
                "a": Resolution.done(1),
                "b": Resolution.not_done(),
                "c": Resolution.unknown(),
            }[record.idem_key],
        )
        for key in "abc":
            expired(idem_key=key)
        IdempotencyRecordFactory(expired_lease=True, operation="tests.no_resolver")
        report = recover_expired()
        assert report.as_dict() == {
            "dry_run": False,
            "succeeded": 1,
            "released": 1,
            "needs_review": 1,
            "unknown": 1,
            "skipped": 0,
            "examined": 4,
        }

    def test_works_through_every_batch(self):
        answer(Resolution.not_done())
        for _ in range(7):
            expired()
        report = recover_expired(batch_size=2)
        assert report.released == 7
        assert not IdempotencyRecord.objects.expired_leases().exists()

    def test_unknown_records_are_not_asked_twice_in_one_pass(self):
        asked: list[int] = []

        def unknown(record: IdempotencyRecord) -> Resolution:
            asked.append(record.pk)
            return Resolution.unknown()

        register(OPERATION, unknown)
        for _ in range(5):
            expired()
        report = recover_expired(batch_size=2)
        assert report.unknown == 5
        assert len(asked) == 5

    def test_dry_run_asks_and_reports_but_changes_nothing(self):
        answer(Resolution.done(1))
        records = [expired() for _ in range(3)]
        before = [(r.status, r.version, r.recovery_attempts) for r in map(reload, records)]
        report = recover_expired(dry_run=True, batch_size=2)
        assert report.dry_run
        assert report.succeeded == 3
        assert [(r.status, r.version, r.recovery_attempts) for r in map(reload, records)] == (
            before
        )

    def test_batch_size_must_be_positive(self):
        with pytest.raises(ValueError):
            recover_expired(batch_size=-1)

    def test_report(self):
        report = RecoveryReport(succeeded=2, unknown=1)
        assert report.examined == 3


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
class TestParallelWorkers:
    def test_two_workers_never_take_the_same_record(self):
        seen: list[int] = []
        lock = threading.Lock()

        def slow_resolver(record: IdempotencyRecord) -> Resolution:
            with lock:
                seen.append(record.pk)
            time.sleep(0.01)  # hold the batch long enough for the other worker to collide
            return Resolution.not_done()

        register(OPERATION, slow_resolver)
        records = [expired() for _ in range(40)]
        start_together = threading.Barrier(2)
        reports: list[RecoveryReport] = []

        def worker() -> None:
            try:
                start_together.wait(timeout=10)
                reports.append(recover_expired(batch_size=3))
            finally:
                connection.close()

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(reports) == 2
        assert Counter(seen) == Counter(r.pk for r in records)  # each asked exactly once
        assert sum(r.released for r in reports) == 40
        assert all(r.released > 0 for r in reports)  # both really worked
        assert sum(r.skipped for r in reports) == 0


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
class TestKilledProcess:
    """A process killed (SIGKILL) in the middle of lease-mode work; recovery settles it."""

    @override_settings(IDEMPOTENCY={"RESOLVERS": {lease_worker.OPERATION: ORDER_RESOLVER}})
    def test_effect_done_before_the_crash_is_recognised_and_replayed(self):
        owner = UserFactory()
        record = self.kill_mid_work(owner.pk, "crash-done", effect_first=True)
        assert Order.objects.filter(sku=sku_for("crash-done")).count() == 1

        report = recover_expired()
        assert report.succeeded == 1
        stored = reload(record)
        assert stored.status == Status.SUCCEEDED
        order = Order.objects.get(sku=sku_for("crash-done"))
        assert stored.resource_id == str(order.pk)

        assert self.retry(owner.pk, "crash-done") == "replayed"
        assert Order.objects.filter(sku=sku_for("crash-done")).count() == 1

    @override_settings(IDEMPOTENCY={"RESOLVERS": {lease_worker.OPERATION: ORDER_RESOLVER}})
    def test_effect_not_done_is_released_and_the_retry_runs_once(self):
        owner = UserFactory()
        record = self.kill_mid_work(owner.pk, "crash-not-done", effect_first=False)
        assert not Order.objects.filter(sku=sku_for("crash-not-done")).exists()

        report = recover_expired()
        assert report.released == 1
        assert reload(record).status == Status.FAILED_RETRYABLE

        assert self.retry(owner.pk, "crash-not-done") == "ran"
        assert self.retry(owner.pk, "crash-not-done") == "replayed"
        assert Order.objects.filter(sku=sku_for("crash-not-done")).count() == 1
        assert reload(record).attempts == 2

    def kill_mid_work(self, user_id: int, key: str, *, effect_first: bool) -> IdempotencyRecord:
        effect = "effect-first" if effect_first else "effect-last"
        process = start(
            python("-m", "tests.support.lease_worker", str(user_id), key, effect), process_env()
        )
        try:
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], 30)
            line = process.stdout.readline() if ready else b""  # the work has started
            assert line.strip() == b"working", process.stderr.read() if process.stderr else b""
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
        finally:
            stop(process)
        assert process.returncode == -signal.SIGKILL
        record = IdempotencyRecord.objects.get(idem_key=key)
        assert record.status == Status.PROCESSING
        # Until the lease runs out (by the database's clock) nobody may touch it.
        deadline = time.monotonic() + 10
        while not IdempotencyRecord.objects.expired_leases().filter(pk=record.pk).exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        return record

    def retry(self, user_id: int, key: str) -> str:
        operation = Operation(
            scope=lease_worker.scope(user_id),
            key=key,
            request_hash=lease_worker.REQUEST_HASH,
            name=lease_worker.OPERATION,
            mode="lease",
        )

        def work(attempt: Any) -> str:
            Order.objects.create(owner_id=user_id, sku=sku_for(key), quantity=1)
            return "ran"

        return execute(
            operation,
            work,
            decide=lambda value, attempt: Outcome(Status.SUCCEEDED, StoredResponse(201)),
            replay=lambda record: "replayed",
        )
