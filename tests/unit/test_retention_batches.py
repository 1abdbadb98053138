"""Purge in batches that start where the last one ended (a keyset on the purge order)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from idempotency.models import IdempotencyRecord
from idempotency.retention import purge
from tests.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db


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
    assert all(sql.startswith("WITH gone AS (DELETE") for sql in deletes)
    assert '"expires_at" >=' not in deletes[0]
    assert all('"expires_at" >=' in sql for sql in deletes[1:])
