"""What ``migrate idempotency`` has yet to do, asked of the database (idempotency/unmigrated.py)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from idempotency.models import IdempotencyRecord
from idempotency.unmigrated import missing, not_migrated

pytestmark = pytest.mark.django_db(transaction=True)


def select_records() -> DatabaseError:
    with pytest.raises(DatabaseError) as caught, connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {IdempotencyRecord._meta.db_table}")
    return caught.value


def test_a_migrated_database_misses_nothing():
    assert missing("default") is None


def test_unapplied_migrations_are_named(unmigrated):
    what = missing("default")
    assert what is not None
    assert what.startswith("migrations not applied: 0001_initial, 0002_resolve_permission")


def test_a_records_table_dropped_behind_the_migrations_back_is_found(records_table_dropped):
    assert missing("default") == "table idempotency_idempotencyrecord missing"


def test_the_records_table_missing_becomes_an_error_that_says_what_to_run(unmigrated, caplog):
    error = not_migrated(select_records(), "default")
    assert error is not None
    assert "run `manage.py migrate idempotency --database default`" in str(error)
    assert "0001_initial" in str(error)
    (logged,) = [r for r in caplog.records if r.name == "idempotency"]
    assert "manage.py migrate idempotency" in logged.getMessage()
    assert logged.event == "idempotency.not_migrated"


def test_in_a_transaction_the_error_aborted_the_message_decides(unmigrated):
    # PostgreSQL refuses every statement after the error until the rollback: the
    # migrations cannot be asked, the error's text names the table.
    with transaction.atomic():
        error = not_migrated(select_records(), "default")
        transaction.set_rollback(True)
    assert error is not None
    assert "migrate idempotency" in str(error)


def test_a_missing_table_of_the_views_own_is_not_the_records(caplog):
    with pytest.raises(DatabaseError) as caught, connection.cursor() as cursor:
        cursor.execute("SELECT id FROM table_of_the_view_not_migrated")
    assert not_migrated(caught.value, "default") is None
    assert not [r for r in caplog.records if r.name == "idempotency"]


def test_an_error_that_is_no_schema_error_is_left_alone():
    with pytest.raises(DatabaseError) as caught, connection.cursor() as cursor:
        cursor.execute("SELECT * FROM idempotency_idempotencyrecord WHERE")  # a syntax error
    assert not_migrated(caught.value, "default") is None
