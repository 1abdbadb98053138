"""Purge and recovery with other connections at work, and their query plans on many rows.

Each purge batch commits on its own and skips a row a request holds; on 100,000 records
purge and recovery read through their indexes, never the whole table (EXPLAIN).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from benchmarks.cost_plans import FILL
from idempotency.models import IdempotencyRecord
from idempotency.progress import Progress
from idempotency.recovery import expired_batch
from idempotency.retention import batch, purge, purgeable
from tests.support.factories import IdempotencyRecordFactory
from tests.unit.test_retention import exists, expired, force_expired

pytestmark = pytest.mark.django_db


@contextmanager
def held_by_a_request(record: IdempotencyRecord) -> Iterator[None]:
    """While inside, another connection holds ``record``'s row lock, as a request would."""
    locked, release = threading.Event(), threading.Event()

    def request_holding_the_row() -> None:
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.select_for_update().get(pk=record.pk)
                locked.set()
                release.wait(timeout=10)
        finally:
            connection.close()

    thread = threading.Thread(target=request_holding_the_row)
    thread.start()
    try:
        assert locked.wait(timeout=10)
        yield
    finally:
        release.set()
        thread.join(timeout=10)


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
class TestPurgeWithOtherConnections:
    def test_each_batch_is_committed_on_its_own(self):
        for _ in range(6):
            expired()
        visible: list[int] = []

        def count_from_another_connection(progress: Progress) -> None:
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
        with held_by_a_request(held):
            assert purge() == 1
        assert exists(held)
        assert not exists(free)

    def test_a_held_row_amid_a_large_batch_stays_and_so_does_every_record_in_flight(self):
        # One batch (the bound far above the rows) meets a row another connection holds,
        # between expired rows, beside records it must never take: the batch deletes
        # around the held row, and takes nothing in flight, under review or unexpired.
        before = [expired() for _ in range(5)]
        held = expired()
        after = [expired() for _ in range(5)]
        kept = [
            force_expired(IdempotencyRecordFactory(in_flight=True)),
            force_expired(IdempotencyRecordFactory(expired_lease=True)),
            force_expired(IdempotencyRecordFactory(needs_review=True)),
            IdempotencyRecordFactory(succeeded=True),  # its window still open
        ]
        with held_by_a_request(held):
            assert purge(batch_size=100_000) == 10
        assert not any(exists(record) for record in before + after)
        assert all(exists(record) for record in [held, *kept])
        assert purge() == 1  # released, it goes with the next pass
        assert all(exists(record) for record in kept)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_held_row_sends_the_batch_again_with_skip_locked():
    # The unlocked delete waits on the held row for OPTIMISTIC_LOCK_WAIT, is rolled back
    # to its savepoint, and the same batch runs again locking its rows, skipping that one.
    records = [expired() for _ in range(4)]
    held = records[1]
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
        with CaptureQueriesContext(connection) as queries:
            assert purge(batch_size=100) == 3
    finally:
        release.set()
        thread.join(timeout=10)
    deletes = [query["sql"] for query in queries if "DELETE" in query["sql"]]
    assert len(deletes) == 2
    assert "FOR UPDATE" not in deletes[0]
    assert "FOR UPDATE SKIP LOCKED" in deletes[1]
    assert [exists(record) for record in records] == [False, True, False, False]


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

    def test_purge_older_than_reads_along_the_primary_key(self, many_rows):
        records = purgeable(older_than=timedelta(days=7))
        plan = self.plan(batch(records, 1000).values_list("pk", flat=True))
        assert "idempotency_idempotencyrecord_pkey" in plan, plan
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
