"""The one-statement claim on PostgreSQL: fewer round trips, the same protocol.

The claim inserts the record, or reads the committed one holding the key, in
one statement that bounds its own lock wait and restores ``lock_timeout``.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from idempotency.conf import retention_for
from idempotency.exceptions import KeyInUse, KeyReused
from idempotency.fingerprint import digest_of, fingerprint
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Attempt, Operation
from idempotency.protocol.execute import execute
from idempotency.stores.postgres import PostgresStatements
from tests.support.factories import IdempotencyRecordFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

HASH = fingerprint(["POST", "/things/", "{}"])
DONE = Outcome(Status.SUCCEEDED, StoredResponse(201, [], b"made"))
JOIN_TIMEOUT = 20.0


def operation(**changes: Any) -> Operation:
    base = Operation(scope="user:1:things", key="k-1", request_hash=HASH, name="things.create")
    return replace(base, **changes)


def run(op: Operation, work: Any = None) -> str:
    return execute(
        op,
        work or (lambda attempt: "ran"),
        decide=lambda value, attempt: DONE,
        replay=lambda record: "replayed",
    )


def show_lock_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        return str(cursor.fetchone()[0])


@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_the_work_runs_under_the_lock_timeout_it_had_before(mode):
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '7s'")
    try:
        seen = []
        run(
            operation(mode=mode, lock_timeout=0.5), lambda attempt: seen.append(show_lock_timeout())
        )
        assert seen == ["7s"]
        assert show_lock_timeout() == "7s"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_a_retry_after_a_failure_runs_under_the_callers_own_lock_timeout(mode):
    """The locked path (a FAILED_RETRYABLE record is taken over) restores the caller's
    transaction-local value, not the session's default."""
    IdempotencyRecordFactory(
        failed_retryable=True,
        scope=operation().scope,
        idem_key=operation().key,
        request_hash=digest_of(HASH),
    )
    seen = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '7s'")
        run(
            operation(mode=mode, lock_timeout=0.5),
            lambda attempt: seen.append(show_lock_timeout()),
        )
        assert show_lock_timeout() == "7s"
    assert seen == ["7s"]


def test_a_replay_inside_a_caller_transaction_restores_the_lock_timeout():
    run(operation())
    with transaction.atomic():
        assert run(operation(lock_timeout=0.5)) == "replayed"
        assert show_lock_timeout() == "0"


def test_lease_mode_claims_in_one_committed_statement():
    with CaptureQueriesContext(connection) as queries:
        attempts: list[Attempt] = []
        run(operation(mode="lease"), lambda attempt: attempts.append(attempt))
    statements = [query["sql"].split()[0].upper() for query in queries]
    # the claim (one statement that also reads a taken key, committed by itself), the finish
    assert statements == ["WITH", "UPDATE"]
    record = IdempotencyRecord.objects.get()
    assert record.status == Status.SUCCEEDED
    assert attempts[0].record.lease_until is not None  # the lease was taken by the claim


def test_atomic_mode_claims_in_one_statement_inside_its_transaction():
    with CaptureQueriesContext(connection) as queries:
        run(operation())
    statements = [query["sql"].split()[0].upper() for query in queries]
    assert statements == ["BEGIN", "INSERT", "UPDATE", "COMMIT"]


def test_a_replay_takes_no_row_lock():
    """A finished record is answered as read: a lock someone holds on it makes no one wait."""
    run(operation())
    locked, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.select_for_update().get()
                locked.set()
                release.wait(JOIN_TIMEOUT)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert locked.wait(JOIN_TIMEOUT)
        assert run(operation(lock_timeout=0.2)) == "replayed"
    finally:
        release.set()
        holder.join(JOIN_TIMEOUT)


def test_another_request_under_a_finished_key_is_refused_without_a_lock():
    run(operation())
    with pytest.raises(KeyReused):
        run(operation(request_hash=fingerprint(["other"])))


def test_a_duplicate_of_an_unfinished_claim_still_waits_bounded_then_409():
    started, finish = threading.Event(), threading.Event()

    def first() -> None:
        try:
            run(operation(), lambda attempt: (started.set(), finish.wait(JOIN_TIMEOUT)))
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert started.wait(JOIN_TIMEOUT)
        with pytest.raises(KeyInUse):
            run(operation(lock_timeout=0.2))
    finally:
        finish.set()
        thread.join(JOIN_TIMEOUT)
    assert run(operation()) == "replayed"


PREPARING = {"server_side_binding": True, "prepare_threshold": 0}


@pytest.fixture
def own_session():
    """A session of its own, made with the ``OPTIONS`` a test gives it.

    Prepared statements live as long as their session, and psycopg reads
    these options when it connects.
    """
    options = connection.settings_dict["OPTIONS"]

    def connect(**changes: Any) -> None:
        connection.close()
        connection.settings_dict["OPTIONS"] = {
            name: value for name, value in options.items() if name not in PREPARING
        } | changes
        connection.ensure_connection()

    yield connect
    connection.close()
    connection.settings_dict["OPTIONS"] = options


def our_prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall() if IdempotencyRecord._meta.db_table in row[0]]


@pytest.mark.session
@pytest.mark.parametrize(
    ("mode", "prepared"),
    # atomic mode reads a taken key in a statement of its own
    [("atomic", ["INSERT", "SELECT", "UPDATE"]), ("lease", ["UPDATE", "WITH"])],
)
def test_where_the_connection_prepares_the_claim_and_finish_are_planned_once(
    own_session, mode, prepared
):
    own_session(**PREPARING)  # as a deployment turns preparing on
    assert run(operation(mode=mode)) == "ran"
    # (a rollback, as here in atomic mode, makes psycopg deallocate what it prepared)
    with pytest.raises(KeyReused):
        run(operation(mode=mode, request_hash=fingerprint(["other"])))
    assert run(operation(mode=mode, key="k-2")) == "ran"
    assert run(operation(mode=mode)) == "replayed"
    statements = our_prepared_statements()
    # one prepared statement each, reused by every later request on this session
    assert sorted(statement.split()[0].upper() for statement in statements) == prepared
    assert IdempotencyRecord.objects.filter(status=Status.SUCCEEDED).count() == 2


@pytest.mark.session
def test_with_djangos_default_nothing_is_prepared(own_session):
    own_session()  # Django's default: client-side binding, for poolers that drop them
    run(operation())
    run(operation(key="k-2"))
    assert our_prepared_statements() == []


def test_a_new_record_is_the_row_the_claim_inserted():
    """Built from what was inserted; the database clock's columns are read on first access."""
    attempts: list[Attempt] = []
    with CaptureQueriesContext(connection) as queries:
        run(operation(method="POST", path="/things/"), lambda attempt: attempts.append(attempt))
    assert [query["sql"].split()[0].upper() for query in queries] == [
        "BEGIN",
        "INSERT",
        "UPDATE",
        "COMMIT",
    ]
    claimed, row = attempts[0].record, IdempotencyRecord.objects.get()
    assert claimed.pk == row.pk
    assert claimed.get_deferred_fields() == {"created_at", "updated_at", "expires_at"}
    for name in ["scope", "idem_key", "operation", "request_hash", "request_method"]:
        assert getattr(claimed, name) == getattr(row, name)
    assert (claimed.request_path, claimed.owner_token) == ("/things/", row.owner_token)
    assert (claimed.attempts, claimed.version, claimed.response_headers) == (1, 1, [])
    assert claimed.lease_until is None and claimed.resource_id == ""
    assert claimed.created_at == row.created_at  # read now, by the ORM
    assert claimed.get_deferred_fields() == {"updated_at", "expires_at"}


def test_atomic_claim_and_finish_share_one_cursor():
    made = []
    original = connection.create_cursor

    def counting(name=None):
        made.append(name)
        return original(name)

    connection.create_cursor = counting  # type: ignore[method-assign]
    try:
        run(operation(key="one-cursor"))
    finally:
        del connection.create_cursor
    assert len(made) == 1
    assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED


def test_a_protected_call_inside_another_finishes_both_on_the_shared_cursor():
    inner = operation(key="inner", scope="user:1:inner")
    assert run(operation(key="outer"), lambda attempt: run(inner)) == "ran"
    assert run(inner) == "replayed"
    statuses = dict(IdempotencyRecord.objects.values_list("idem_key", "status"))
    assert statuses == {"outer": Status.SUCCEEDED, "inner": Status.SUCCEEDED}


def updates_in_this_transaction() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = %s",
            [IdempotencyRecord._meta.db_table],
        )
        updated, hot = cursor.fetchone()
    return int(updated), int(hot)


def test_an_atomic_mode_finish_is_applied_in_place():
    """No index reads a column the finish changes: a HOT update, no new index entries."""
    with transaction.atomic():
        before = updates_in_this_transaction()
        run(operation())
        after = updates_in_this_transaction()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
    record = IdempotencyRecord.objects.get()
    # the expiry a success keeps, set by the claim and counted from it
    assert record.expires_at == record.created_at + retention_for("things.create", "SUCCEEDED")


def test_a_lease_mode_finish_counts_the_retention_from_the_finish():
    run(operation(mode="lease"))
    record = IdempotencyRecord.objects.get()
    assert record.expires_at == record.completed_at + retention_for("things.create", "SUCCEEDED")


# The statements and the column order their readers share


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
