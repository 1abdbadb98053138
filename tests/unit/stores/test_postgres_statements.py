"""The PostgreSQL statements and the column order their readers share."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from idempotency.models import IdempotencyRecord, Status
from idempotency.stores.postgres_statements import PostgresStatements
from tests.support.factories import IdempotencyRecordFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def indexed_columns() -> set[str]:
    """The columns the migrated table's indexes read, keys and predicates (both stop HOT)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s::regclass",
            [IdempotencyRecord._meta.db_table],
        )
        definitions = " ".join(row[0] for row in cursor.fetchall())
    columns = {field.column for field in IdempotencyRecord._meta.concrete_fields}
    return {column for column in columns if re.search(rf"\b{column}\b", definitions)}


def test_the_finish_changes_an_indexed_column_only_to_what_an_atomic_claim_left():
    """``lease_until`` (NULL, atomic mode never sets it) and ``expires_at`` (the claim's value)."""
    statement = PostgresStatements("default").finish(("status", "response_body"), True)
    assigned = set(re.findall(r'"(\w+)" = ', statement.split(" WHERE ")[0]))
    assert assigned & indexed_columns() == {"lease_until", "expires_at"}


def test_lock_waits_made_up_per_request_compose_a_bounded_number_of_claims():
    statements = PostgresStatements("default")
    for milliseconds in range(1, 200):
        statements.claim(False, True, f"{milliseconds}ms")
    assert 0 < len(statements._claim_statements) <= 64


def test_the_replay_read_returns_every_column_in_the_order_its_reader_expects():
    record = IdempotencyRecordFactory(status=Status.SUCCEEDED, response_body=b"made")
    statements = PostgresStatements("default")
    with connection.cursor() as cursor:
        cursor.execute(statements.read_final, [record.scope, record.idem_key])
        row = cursor.fetchone()
    read = dict(zip(statements.attnames, row, strict=True))
    assert read["id"] == record.pk
    assert (read["scope"], read["idem_key"], read["status"]) == (
        record.scope,
        record.idem_key,
        Status.SUCCEEDED,
    )
    assert bytes(read["response_body"]) == b"made"
