"""Retention and purge: windows, statuses, scopes, batches, locks, and the query plans."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from benchmarks.cost_plans import FILL
from idempotency import signals
from idempotency.core import Operation, execute
from idempotency.fingerprint import fingerprint
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.recovery import expired_batch
from idempotency.retention import batch, purge, purgeable, retention_for
from tests.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db

DAY = 24 * 3600


def expired(**fields: Any) -> IdempotencyRecord:
    """A finished record whose retention window passed yesterday."""
    return IdempotencyRecordFactory(expired=True, **fields)


def live(**fields: Any) -> IdempotencyRecord:
    """A finished record still inside its window."""
    return IdempotencyRecordFactory(succeeded=True, **fields)


def exists(record: IdempotencyRecord) -> bool:
    return IdempotencyRecord.objects.filter(pk=record.pk).exists()


def force_expired(record: IdempotencyRecord) -> IdempotencyRecord:
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        expires_at=Now() - timedelta(days=1), created_at=Now() - timedelta(days=30)
    )
    return record


class TestPolicy:
    def test_defaults_keep_finished_records_a_day(self):
        for status in (Status.SUCCEEDED, Status.FAILED_FINAL, Status.FAILED_RETRYABLE):
            assert retention_for("any.operation", status) == timedelta(days=1)

    @override_settings(
        IDEMPOTENCY={
            "RETENTION": {"SUCCEEDED": 7 * DAY},
            "OPERATION_RETENTION": {"payments.capture": {"SUCCEEDED": 90 * DAY}},
        }
    )
    def test_per_status_and_per_operation(self):
        assert retention_for("orders.create", Status.SUCCEEDED) == timedelta(days=7)
        assert retention_for("orders.create", Status.FAILED_FINAL) == timedelta(days=1)
        assert retention_for("payments.capture", Status.SUCCEEDED) == timedelta(days=90)

    @override_settings(IDEMPOTENCY={"OPERATION_RETENTION": {"tests.keep": {"SUCCEEDED": None}}})
    def test_none_keeps_a_record_until_an_operator_acts(self):
        operation = Operation(
            scope="user:1:tests.keep", key="k", request_hash=fingerprint(["k"]), name="tests.keep"
        )
        execute(
            operation,
            lambda attempt: "ok",
            decide=lambda value, attempt: Outcome(Status.SUCCEEDED, StoredResponse(201)),
            replay=lambda record: "replayed",
        )
        stored = IdempotencyRecord.objects.get(idem_key="k")
        assert stored.expires_at is None
        force_expired(stored)
        IdempotencyRecord.objects.filter(pk=stored.pk).update(expires_at=None)
        assert purge() == 0

    @override_settings(IDEMPOTENCY={"OPERATION_RETENTION": {"tests.short": {"SUCCEEDED": 60}}})
    def test_expiry_is_set_when_the_record_finishes(self):
        operation = Operation(
            scope="user:1:tests.short", key="k", request_hash=fingerprint(["k"]), name="tests.short"
        )
        execute(
            operation,
            lambda attempt: "ok",
            decide=lambda value, attempt: Outcome(Status.SUCCEEDED, StoredResponse(201)),
            replay=lambda record: "replayed",
        )
        stored = IdempotencyRecord.objects.get(idem_key="k")
        assert stored.completed_at is not None
        assert (
            timedelta(seconds=59)
            <= stored.expires_at - stored.completed_at
            <= timedelta(seconds=61)
        )


class TestPurge:
    def test_deletes_expired_finished_records_only(self):
        gone = [
            expired(),
            force_expired(IdempotencyRecordFactory(failed_final=True)),
            force_expired(IdempotencyRecordFactory(failed_retryable=True)),
        ]
        kept = [live(), IdempotencyRecordFactory(failed_retryable=True)]
        assert purge() == 3
        assert not any(exists(r) for r in gone)
        assert all(exists(r) for r in kept)

    @pytest.mark.parametrize("trait", ["in_flight", "expired_lease", "needs_review"])
    def test_never_processing_or_needs_review_even_with_a_past_expiry(self, trait):
        record = force_expired(IdempotencyRecordFactory(**{trait: True}))
        assert purge() == 0
        assert purge(older_than=timedelta(days=1)) == 0
        assert exists(record)

    @pytest.mark.parametrize("status", ["PROCESSING", "NEEDS_REVIEW", "DONE"])
    def test_refuses_statuses_it_must_not_purge(self, status):
        with pytest.raises(ValueError, match="never purged"):
            purge(statuses=[status])

    def test_only_the_chosen_statuses(self):
        final = force_expired(IdempotencyRecordFactory(failed_final=True))
        succeeded = expired()
        assert purge(statuses=["failed_final"]) == 1
        assert not exists(final)
        assert exists(succeeded)

    def test_only_one_scope_or_a_prefix(self):
        alice = [expired(scope="user:1:orders.create"), expired(scope="user:1:reports.create")]
        bob = expired(scope="user:2:orders.create")
        assert purge(scope="user:1:orders.create") == 1
        assert purge(scope="user:1:*") == 1
        assert not any(exists(r) for r in alice)
        assert exists(bob)

    def test_older_than_takes_old_records_whatever_their_window(self):
        old = live(created_at=timezone.now() - timedelta(days=10))  # window still open
        recent = live(created_at=timezone.now() - timedelta(days=3))
        assert purge(older_than=timedelta(days=7)) == 1
        assert not exists(old)
        assert exists(recent)

    def test_in_batches_with_progress(self):
        for _ in range(10):
            expired()
        seen: list[tuple[int, int]] = []
        assert purge(batch_size=3, progress=lambda done, total: seen.append((done, total))) == 10
        assert seen == [(3, 10), (6, 10), (9, 10), (10, 10)]
        assert not IdempotencyRecord.objects.exists()

    def test_dry_run_counts_and_deletes_nothing(self):
        records = [expired() for _ in range(4)]
        live()
        assert purge(dry_run=True) == 4
        assert all(exists(r) for r in records)

    def test_signal(self):
        expired()
        calls: list[dict[str, Any]] = []

        def receiver(**kwargs: Any) -> None:
            calls.append(kwargs)

        signals.records_purged.connect(receiver, weak=False)
        try:
            purge(dry_run=True)
            purge()
        finally:
            signals.records_purged.disconnect(receiver)
        assert [(c["count"], c["dry_run"]) for c in calls] == [(1, True), (1, False)]

    @override_settings(IDEMPOTENCY={"PURGE_BATCH_SIZE": 2})
    def test_batch_size_setting(self):
        for _ in range(5):
            expired()
        seen: list[int] = []
        assert purge(progress=lambda done, total: seen.append(done)) == 5
        assert seen == [2, 4, 5]

    def test_batch_size_must_be_positive(self):
        with pytest.raises(ValueError, match="positive"):
            purge(batch_size=-5)


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
class TestPurgeWithOtherConnections:
    def test_each_batch_is_committed_on_its_own(self):
        for _ in range(6):
            expired()
        visible: list[int] = []

        def count_from_another_connection(done: int, total: int) -> None:
            def count() -> None:
                try:
                    visible.append(IdempotencyRecord.objects.count())
                finally:
                    connection.close()

            thread = threading.Thread(target=count)
            thread.start()
            thread.join(timeout=10)

        assert purge(batch_size=2, progress=count_from_another_connection) == 6
        assert visible == [4, 2, 0]

    def test_a_row_a_request_holds_is_skipped_not_waited_for(self):
        held, free = expired(), expired()
        locked, release = threading.Event(), threading.Event()

        def request_holding_the_row() -> None:
            try:
                with transaction.atomic():
                    IdempotencyRecord.objects.select_for_update().get(pk=held.pk)
                    locked.set()
                    release.wait(timeout=10)
            finally:
                connection.close()

        thread = threading.Thread(target=request_holding_the_row)
        thread.start()
        try:
            assert locked.wait(timeout=10)
            assert purge() == 1
        finally:
            release.set()
            thread.join(timeout=10)
        assert exists(held)
        assert not exists(free)


BULK_ROWS = 100_000

# Rows in known shapes: 1% expired (purge's business), 1% created 30 days ago,
# 0.5% PROCESSING of which a fifth expired; the rest finished, recent, live. The
# benchmark reads the plans of the same rows at 10^7 (benchmarks/database_cost.py).
BULK_INSERT = FILL


@pytest.mark.postgres
class TestQueryPlans:
    """Purge and recovery read through their indexes, not the whole table (EXPLAIN)."""

    @pytest.fixture
    def many_rows(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(BULK_INSERT, [BULK_ROWS])
            cursor.execute("ANALYZE idempotency_idempotencyrecord")

    def plan(self, queryset: Any) -> str:
        with transaction.atomic():  # FOR UPDATE needs a transaction
            return str(queryset.explain())

    def test_purge_uses_the_expiry_index(self, many_rows):
        plan = self.plan(batch(purgeable(), 1000).values_list("pk", flat=True))
        assert "idempotency_expires_idx" in plan, plan
        assert "Seq Scan" not in plan, plan
        assert purgeable().count() == BULK_ROWS // 100

    def test_purge_older_than_uses_the_created_index(self, many_rows):
        records = purgeable(older_than=timedelta(days=7))
        plan = self.plan(batch(records, 1000).values_list("pk", flat=True))
        assert "idempotency_created_idx" in plan, plan
        assert "Seq Scan" not in plan, plan

    def test_the_delete_goes_by_primary_key(self, many_rows):
        pks = list(purgeable().values_list("pk", flat=True)[:1000])
        plan = str(IdempotencyRecord.objects.filter(pk__in=pks).explain())
        assert "idempotency_idempotencyrecord_pkey" in plan, plan
        assert "Seq Scan" not in plan, plan

    def test_recovery_uses_the_lease_index(self, many_rows):
        query = (
            IdempotencyRecord.objects.expired_leases()
            .select_for_update(skip_locked=True)
            .order_by("lease_until", "pk")[:100]
        )
        plan = self.plan(query)
        assert "idempotency_leased_idx" in plan, plan
        assert "Seq Scan" not in plan, plan
        with transaction.atomic():
            assert len(expired_batch("default", after=None, size=100, lock=True)) == 100
