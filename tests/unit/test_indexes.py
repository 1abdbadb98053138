"""The lease and expiry indexes: partial where the database has partial indexes, composite
elsewhere, and on MariaDB the plans of recovery and purge read through them (EXPLAIN)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.db import connection, models, transaction
from django.db.migrations.executor import MigrationExecutor

from idempotency.indexes import PartialIndex
from idempotency.models import IdempotencyRecord
from idempotency.recovery import expired_batch
from idempotency.retention import batch, purge, purgeable
from tests.protocol.test_retention_at_scale import BULK_INSERT as POSTGRES_BULK_INSERT
from tests.protocol.test_retention_at_scale import BULK_ROWS as POSTGRES_BULK_ROWS

pytestmark = pytest.mark.django_db


def index_sql(name: str) -> str:
    (index,) = [index for index in IdempotencyRecord._meta.indexes if index.name == name]
    # Not entered: only builds the statement (SQLite refuses to enter one inside a transaction).
    editor = connection.schema_editor(collect_sql=True)
    return str(index.create_sql(IdempotencyRecord, editor))


def test_no_warning_about_conditions_on_any_database():
    warnings = IdempotencyRecord.check(databases=["default"])
    assert [warning.id for warning in warnings if warning.level >= checks.WARNING] == []


def test_the_lease_index_is_partial_or_leads_with_status():
    sql = index_sql("idempotency_leased_idx")
    quote = connection.ops.quote_name
    if connection.features.supports_partial_indexes:
        assert f"({quote('lease_until')}) WHERE {quote('lease_until')} IS NOT NULL" in sql
    else:
        assert f"({quote('status')}, {quote('lease_until')})" in sql
        assert "WHERE" not in sql


def test_the_expiry_index_holds_every_row():
    # Full, so that the admin's stuck filter (expires_at IS NULL) reads it too.
    sql = index_sql("idempotency_expires_idx")
    assert "WHERE" not in sql
    assert connection.ops.quote_name("expires_at") in sql


def test_the_migrated_database_has_the_indexes_its_features_call_for():
    # Built by the migrations: 0004 rebuilt the lease index (renamed it where partial
    # indexes are missing) and put the created_at index in place of (status, created_at).
    with connection.cursor() as cursor:
        table = connection.introspection.get_constraints(cursor, IdempotencyRecord._meta.db_table)
    partial = connection.features.supports_partial_indexes
    lease = ["lease_until"] if partial else ["status", "lease_until"]
    assert table["idempotency_leased_idx"]["columns"] == lease
    assert table["idempotency_expires_idx"]["columns"] == ["expires_at"]
    # 0006 dropped the indexes of created_at: the primary key serves their readers.
    dropped = {"idempotency_created_idx", "idempotency_unexpiring_idx"}
    assert {"idempotency_lease_idx", "idempotency_status_idx", *dropped}.isdisjoint(table)


def indexes() -> dict[str, Any]:
    with connection.cursor() as cursor:
        return connection.introspection.get_constraints(cursor, IdempotencyRecord._meta.db_table)


class Rollback(Exception):
    pass


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_online_index_migration_runs_inside_a_callers_transaction():
    """django-tenants migrates a new tenant's schema from ``TenantMixin.save()``, often
    inside the caller's ``transaction.atomic()`` (``get_or_create`` opens one), where
    PostgreSQL refuses CREATE/DROP INDEX CONCURRENTLY: 0004 builds plainly there."""
    executor = MigrationExecutor(connection)
    with pytest.raises(Rollback), transaction.atomic():
        executor.migrate([("idempotency", "0003_indexes_without_partial_support")])
        assert "idempotency_status_idx" in indexes()
        executor.loader.build_graph()
        executor.migrate([("idempotency", "0004_indexes_a_finish_leaves_alone")])
        after = indexes()
        assert {"idempotency_leased_idx", "idempotency_created_idx"} <= set(after)
        assert {"idempotency_lease_idx", "idempotency_status_idx"}.isdisjoint(after)
        raise Rollback  # PostgreSQL's DDL is transactional: the schema is as it was
    assert {"idempotency_leased_idx", "idempotency_expires_idx"} <= set(indexes())
    assert "idempotency_created_idx" not in indexes()


def test_no_index_reads_a_column_an_atomic_mode_finish_changes():
    """What lets PostgreSQL apply the finish in place (HOT): an index that reads a column
    the UPDATE changes, in its columns or its condition, makes it write new index entries."""
    changed = {"status", "response_status", "response_headers", "response_body"}
    changed |= {"resource_id", "completed_at", "updated_at", "version"}
    for index in IdempotencyRecord._meta.indexes:
        read = set(index.partial_fields if isinstance(index, PartialIndex) else index.fields)
        where = index.where if isinstance(index, PartialIndex) else index.condition
        read |= {lookup.split("__")[0] for lookup, _value in (where.children if where else [])}
        assert not read & changed, index.name


def test_deconstructs_to_what_it_was_built_from():
    index = PartialIndex(
        fields=["lease_until"],
        where=models.Q(status="PROCESSING"),
        fallback_fields=["status", "lease_until"],
        name="some_idx",
    )
    path, args, kwargs = index.deconstruct()
    assert path == "idempotency.indexes.PartialIndex"
    assert PartialIndex(*args, **kwargs) == index
    assert index.condition is None  # what the system check looks at (models.W037)


BULK_ROWS = 20_000

# The shapes of TestQueryPlans in tests/protocol/test_retention_at_scale.py, on fewer rows,
# for MySQL/MariaDB: 1% expired, the first 1% created 30 days ago, 0.5% PROCESSING of which a fifth
# expired.
BULK_INSERT = """
INSERT INTO idempotency_idempotencyrecord (
    scope, idem_key, operation, request_hash, request_method, request_path, status,
    owner_token, lease_until, response_status, response_headers, resource_id, attempts,
    recovery_attempts, version, created_at, updated_at, completed_at, expires_at
)
WITH digits (d) AS (
    SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
    UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9
), numbers (i) AS (
    SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d
    FROM digits a, digits b, digits c, digits e, digits f
)
SELECT
    CONCAT('user:', MOD(i, 1000), ':tests.bulk'), CONCAT('key-', i), 'tests.bulk',
    UNHEX(MD5(i)), 'POST', '/orders/',
    CASE WHEN MOD(i, 200) = 7 THEN 'PROCESSING' ELSE 'SUCCEEDED' END,
    UNHEX(MD5(CONCAT('owner', i))),
    CASE
        WHEN MOD(i, 1000) = 7 THEN NOW(6) - INTERVAL 1 MINUTE
        WHEN MOD(i, 200) = 7 THEN NOW(6) + INTERVAL 1 MINUTE
    END,
    201, '[]', i, 1, 0, 1,
    CASE WHEN i <= 200 THEN NOW(6) - INTERVAL 30 DAY ELSE NOW(6) - INTERVAL 1 HOUR END,
    NOW(6), NOW(6),
    CASE
        WHEN MOD(i, 200) = 7 THEN NULL
        WHEN MOD(i, 100) = 1 THEN NOW(6) - INTERVAL 1 HOUR
        ELSE NOW(6) + INTERVAL 1 DAY
    END
FROM numbers WHERE i <= %s
"""


@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits: the rows go by TRUNCATE
class TestQueryPlansOnMariaDB:
    """No partial indexes here: the composite indexes still keep both scans off the table."""

    @pytest.fixture
    def many_rows(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(BULK_INSERT, [BULK_ROWS])
            cursor.execute("ANALYZE TABLE idempotency_idempotencyrecord")

    def plan(self, queryset: Any) -> str:
        with transaction.atomic():  # FOR UPDATE needs a transaction
            return str(queryset.explain())

    def test_purge_batch_reads_the_expiry_index(self, many_rows):
        plan = self.plan(batch(purgeable(), 1000).values_list("pk", flat=True))
        assert " range " in plan and " idempotency_expires_idx " in plan, plan
        assert purgeable().count() == BULK_ROWS // 100

    def test_purge_takes_the_expired_rows_in_batches_and_nothing_else(self, many_rows):
        assert purge(batch_size=300) == BULK_ROWS // 100
        assert IdempotencyRecord.objects.count() == BULK_ROWS - BULK_ROWS // 100
        assert not purgeable().exists()

    def test_purge_older_than_reads_along_the_primary_key(self, many_rows):
        records = purgeable(older_than=timedelta(days=7))
        plan = self.plan(batch(records, 1000).values_list("pk", flat=True))
        assert " PRIMARY " in plan and "filesort" not in plan, plan

    def test_the_delete_goes_by_primary_key(self, many_rows):
        pks = list(purgeable().values_list("pk", flat=True)[:1000])
        plan = str(IdempotencyRecord.objects.filter(pk__in=pks).explain())
        assert " eq_ref PRIMARY PRIMARY " in plan or " range PRIMARY PRIMARY " in plan, plan

    def test_recovery_reads_the_lease_index_in_order(self, many_rows):
        query = (
            IdempotencyRecord.objects.expired_leases()
            .select_for_update(skip_locked=True)
            .order_by("lease_until", "pk")[:100]
        )
        plan = self.plan(query)
        assert " range " in plan and " idempotency_leased_idx " in plan, plan
        assert "filesort" not in plan, plan  # (status, lease_until, pk) is the scan's order
        with transaction.atomic():
            expired = expired_batch("default", after=None, size=100, lock=True)
        assert len(expired) == BULK_ROWS // 1000


@pytest.mark.postgres
class TestAdminPlansOnPostgreSQL:
    """No index reads status: the admin's list and its stuck filter read the others (EXPLAIN)."""

    @pytest.fixture
    def many_rows(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(POSTGRES_BULK_INSERT, [POSTGRES_BULK_ROWS])
            cursor.execute("ANALYZE idempotency_idempotencyrecord")

    def test_the_stuck_filter_reads_the_lease_and_expiry_indexes(self, many_rows):
        plan = str(IdempotencyRecord.objects.stuck().order_by("-pk")[:50].explain())
        assert "idempotency_leased_idx" in plan and "idempotency_expires_idx" in plan, plan
        assert "Seq Scan" not in plan, plan

    def test_the_newest_first_list_reads_the_primary_key_backwards(self, many_rows):
        page = IdempotencyRecord.objects.filter(status="SUCCEEDED").order_by("-pk")[:50]
        plan = str(page.explain())
        assert "Index Scan Backward using idempotency_idempotencyrecord_pkey" in plan, plan
