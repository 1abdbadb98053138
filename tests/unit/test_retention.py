"""Retention and purge: windows, statuses, scopes, and batches that start where the last ended.

With other connections at work, and the query plans on many rows:
tests/protocol/test_retention_at_scale.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from unittest.mock import patch

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from idempotency import signals
from idempotency.conf import retention_for
from idempotency.fingerprint import fingerprint
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.progress import Meter, Progress
from idempotency.protocol import Operation
from idempotency.protocol.execute import execute
from idempotency.retention import BatchSizer, _delete_in_batches, purge, purgeable
from idempotency.stores import store_for
from idempotency.stores.base import Purged
from tests.support.factories import IdempotencyRecordFactory

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
        seen: list[Progress] = []
        assert purge(batch_size=3, progress=seen.append) == 10
        assert [(p.batches, p.done, p.total) for p in seen] == [
            (1, 3, 10),
            (2, 6, 10),
            (3, 9, 10),
            (4, 10, 10),
        ]
        elapsed = [p.elapsed for p in seen]
        assert elapsed == sorted(elapsed)
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
        assert purge(progress=lambda progress: seen.append(progress.done)) == 5
        assert seen == [2, 4, 5]

    def test_batch_size_must_be_positive(self):
        with pytest.raises(ValueError, match="positive"):
            purge(batch_size=-5)


# Batches start where the last one ended (a keyset on the purge order).


def test_ties_across_a_batch_boundary_are_all_deleted():
    same_moment = timezone.now() - timedelta(days=1)
    for _ in range(7):
        IdempotencyRecordFactory(succeeded=True, expires_at=same_moment)
    assert purge(batch_size=3) == 7
    assert not IdempotencyRecord.objects.exists()


def test_every_expired_record_goes_whatever_the_order_they_expired_in():
    now = timezone.now()
    for minutes in [5, 1, 9, 3, 7, 2, 8, 4, 6]:
        IdempotencyRecordFactory(succeeded=True, expires_at=now - timedelta(minutes=minutes))
    kept = IdempotencyRecordFactory(succeeded=True)
    assert purge(batch_size=2) == 9
    assert list(IdempotencyRecord.objects.all()) == [kept]


def test_older_than_batches_by_creation_time():
    for days in [10, 12, 11, 14, 13]:
        IdempotencyRecordFactory(succeeded=True, created_at=timezone.now() - timedelta(days=days))
    assert purge(older_than=timedelta(days=7), batch_size=2) == 5


def test_older_than_takes_every_old_record_past_a_replaced_one():
    """Ids grow with created_at, but a record replaced by a new request keeps its id and
    gets a new created_at: the bisection for the first young id must not stop at it."""
    now, old = timezone.now(), timezone.now() - timedelta(days=30)
    ages = [old] * 40
    ages[19] = now  # replaced yesterday, where the bisection reads first
    ages[35:] = [now] * 5  # made since the cut
    records = [IdempotencyRecordFactory(succeeded=True, created_at=age) for age in ages]
    assert purge(older_than=timedelta(days=7), batch_size=8) == 34
    young = {records[19].pk, *(record.pk for record in records[35:])}
    assert set(IdempotencyRecord.objects.values_list("pk", flat=True)) == young


@pytest.mark.postgres
def test_on_postgresql_each_batch_is_one_statement_from_where_the_last_ended():
    for minutes in range(5):
        IdempotencyRecordFactory(
            succeeded=True, expires_at=timezone.now() - timedelta(minutes=10 - minutes)
        )
    with CaptureQueriesContext(connection) as queries:
        assert purge(batch_size=2) == 5
    deletes = [query["sql"] for query in queries if "DELETE" in query["sql"]]
    assert len(deletes) == 3  # 2 + 2 + 1: one statement a batch
    # A range of expires_at, ended by the value after the batch's last, read and deleted
    # by one index scan.
    assert all(sql.startswith("WITH bound AS MATERIALIZED (SELECT (SELECT") for sql in deletes)
    assert all("< ((SELECT coalesce(value, 'infinity') FROM bound))" in sql for sql in deletes)
    # Nothing held: no row is locked before it is deleted (a lock is a second write).
    assert not any("FOR UPDATE" in sql for sql in deletes)
    assert '"expires_at" >=' not in deletes[0]
    assert all('"expires_at" >=' in sql for sql in deletes[1:])


def test_more_ties_than_a_batch_go_a_batch_at_a_time():
    # Rows sharing one expires_at (a bulk update gave it them) leave a range empty: the
    # batch takes them another way, still at most a batch.
    moment = timezone.now() - timedelta(hours=1)
    for _ in range(5):
        IdempotencyRecordFactory(succeeded=True, expires_at=moment)
    live = IdempotencyRecordFactory(succeeded=True)
    done: list[int] = []
    assert purge(batch_size=2, progress=lambda progress: done.append(progress.done)) == 5
    assert done == [2, 4, 5]
    assert list(IdempotencyRecord.objects.all()) == [live]


# Batches sized by time: fed durations, not timed, so that a busy machine cannot flake them.


class TestBatchSizer:
    def test_starts_at_first_and_grows_at_most_twofold_to_the_bound(self):
        sizer = BatchSizer(target=0.25, bound=100_000)
        sizes = [sizer.size]
        for _ in range(6):
            sizes.append(sizer.observe(sizer.size, 0.001))  # far under the target
        assert sizes == [10_000, 20_000, 40_000, 80_000, 100_000, 100_000, 100_000]

    def test_keeps_the_size_whose_batch_lasts_the_target(self):
        sizer = BatchSizer(target=0.25, bound=100_000)
        sizer.observe(10_000, 0.125)  # 80,000 rows/s: 20,000 rows in 0.25 s
        assert sizer.size == 20_000
        assert sizer.observe(20_000, 0.25) == 20_000
        assert sizer.observe(20_000, 0.2) == 25_000  # a little quicker: a little more

    def test_shrinks_at_once_after_a_long_batch(self):
        sizer = BatchSizer(target=0.25, bound=100_000)
        for _ in range(3):
            sizer.observe(sizer.size, 0.01)
        assert sizer.size == 80_000
        assert sizer.observe(80_000, 2.0) == 10_000  # 40,000 rows/s: 10,000 in 0.25 s
        assert sizer.observe(10_000, 100.0) == 25
        assert sizer.observe(20, 1000.0) == 1  # never below one row

    def test_the_bound_is_never_passed_and_a_small_bound_is_the_first_size(self):
        sizer = BatchSizer(target=10.0, bound=3)
        assert sizer.size == 3
        assert sizer.observe(3, 0.0) == 3

    def test_an_empty_batch_changes_nothing(self):
        sizer = BatchSizer(target=0.25, bound=100_000)
        assert sizer.observe(0, 5.0) == 10_000

    def test_the_target_must_be_positive(self):
        with pytest.raises(ValueError, match="PURGE_BATCH_SECONDS"):
            BatchSizer(target=0, bound=10)


class SlowClock:
    """Each batch seems to take ``seconds``: a clock that moves only when read."""

    def __init__(self, seconds: float) -> None:
        self.now, self.seconds, self.reads = 0.0, seconds, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # the second read of a batch: it has ended
            self.now += self.seconds
        return self.now


def batch_sizes(seconds: float, bound: int, records: int, target: float = 0.25) -> list[int]:
    """The batches a purge of ``records`` takes when each lasts ``seconds``."""
    for _ in range(records):
        expired()
    seen: list[int] = []
    meter = Meter(lambda progress: seen.append(progress.done))
    deleted = _delete_in_batches(
        "default", purgeable(), BatchSizer(target, bound), meter, SlowClock(seconds)
    )
    assert deleted == records
    return [b - a for a, b in zip([0, *seen[:-1]], seen, strict=True)]


def test_the_purge_grows_its_batches_while_they_are_quick():
    assert batch_sizes(0.001, bound=5, records=12) == [5, 5, 2]
    with patch.object(BatchSizer, "FIRST", 2):
        assert batch_sizes(0.001, bound=100, records=15) == [2, 4, 8, 1]


def test_the_purge_shrinks_its_batches_when_they_run_long():
    with patch.object(BatchSizer, "FIRST", 8):
        # 8 rows in 1 s is 8 rows/s: 2 rows in the target of 0.25 s.
        assert batch_sizes(1.0, bound=100, records=13) == [8, 2, 1, 1, 1]


@override_settings(IDEMPOTENCY={"PURGE_BATCH_SECONDS": 0.5, "PURGE_BATCH_SIZE": 7})
def test_purge_reads_the_target_and_the_bound_from_the_settings():
    with patch("idempotency.retention.BatchSizer", wraps=BatchSizer) as sizer:
        for _ in range(9):
            expired()
        assert purge() == 9
    sizer.assert_called_once_with(0.5, 7)


def test_rows_changed_under_a_batch_do_not_end_the_purge():
    # On PostgreSQL an unlocked batch may delete fewer rows than it chose (a row updated
    # meanwhile stays): the purge goes on while a batch chose a full batch.
    real = store_for("default")
    batches: list[Purged] = []

    class OneRowChangedFirst:
        def delete_batch(self, chosen: Any, ordering: str, *, keys: bool) -> Purged:
            done = real.delete_batch(chosen, ordering, keys=keys)
            batches.append(done)
            return done._replace(deleted=done.deleted - 1) if len(batches) == 1 else done

    for _ in range(5):
        expired()
    with patch("idempotency.retention.store_for", return_value=OneRowChangedFirst()):
        assert purge(batch_size=2) == 4  # what the batches said they deleted
    assert [done.picked for done in batches] == [2, 2, 1]
    assert not IdempotencyRecord.objects.exists()
