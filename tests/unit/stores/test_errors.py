"""Which database errors are outages (a 503 and a retry), and which are a schema behind the code.

Real errors where a test can make them: the test database's own (a statement
timeout, a terminated connection, a missing table), SQLite's lock, a server-side
internal error. Errors only a broken network or a pooler makes are built as the
driver raises them, and wrapped by Django's own ``DatabaseErrorWrapper``;
tests/deployment/test_pgbouncer_outage.py meets them for real behind PgBouncer.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import ModuleType, SimpleNamespace

import psycopg
import pytest
from django.db import DatabaseError, Error, connection, transaction
from django.db.utils import DatabaseErrorWrapper

from idempotency.exceptions import DatabaseUnavailable
from idempotency.stores.errors import is_outage, is_schema_error


def wrapped(driver: ModuleType, error: Exception) -> Error:
    """``error`` as Django raises it: the driver's error is the ``__cause__``."""
    wrapper = DatabaseErrorWrapper(SimpleNamespace(Database=driver, errors_occurred=False))
    try:
        with wrapper:
            raise error
    except Error as django_error:
        return django_error
    raise AssertionError("not wrapped")


def raised(sql: str, params: list[object] | None = None) -> DatabaseError:
    """The error the test database raises for ``sql``, in a transaction rolled back after."""
    with (
        pytest.raises(DatabaseError) as caught,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, params)
    return caught.value


# --- every database ----------------------------------------------------------------


@pytest.mark.django_db
def test_a_missing_table_is_a_schema_error_not_an_outage():
    error = raised("SELECT * FROM no_such_table_here")
    assert is_schema_error(error)
    assert not is_outage(error)


@pytest.mark.django_db
def test_a_missing_column_is_a_schema_error_not_an_outage():
    # MariaDB's 1054 is an OperationalError: once a 503 for every request.
    error = raised("SELECT no_such_column FROM idempotency_idempotencyrecord")
    assert is_schema_error(error)
    assert not is_outage(error)


@pytest.mark.django_db
def test_a_constraint_is_neither():
    from django.db import IntegrityError

    from tests.testapp.models import Order

    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        Order.objects.create(sku=None, quantity=1)  # NOT NULL
    assert not is_outage(caught.value)
    assert not is_schema_error(caught.value)


def test_the_protocols_own_outage_is_one():
    assert is_outage(DatabaseUnavailable())


def test_errors_of_no_database_are_not_outages():
    assert not is_outage(ValueError("no"))
    assert not is_schema_error(KeyError("no"))


# --- SQLite: a lock held by another connection ---------------------------------------


def test_sqlite_database_is_locked_is_an_outage_no_such_table_is_not(tmp_path: Path):
    path = str(tmp_path / "locked.sqlite3")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")  # holds the write lock
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError) as locked:
            other.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(sqlite3.OperationalError) as missing:
            other.execute("SELECT * FROM missing_here")
    finally:
        other.close()
        holder.close()
    assert is_outage(wrapped(sqlite3, locked.value))
    assert is_outage(locked.value)  # the driver's own, unwrapped
    assert not is_outage(wrapped(sqlite3, missing.value))
    assert is_schema_error(wrapped(sqlite3, missing.value))


# --- PostgreSQL: as psycopg raises them ------------------------------------------------


@pytest.mark.parametrize(
    "sqlstate",
    ["08006", "08P01", "57P01", "57P02", "57P03", "53300", "40001", "40P01", "55P03", "57014"],
)
def test_postgresql_connection_shutdown_timeout_and_victim_states_are_outages(sqlstate: str):
    # 08P01 is PgBouncer's own ("server conn crashed?", "query_wait_timeout").
    error = psycopg.errors.lookup(sqlstate)("as the server sent it")
    assert is_outage(wrapped(psycopg, error))


@pytest.mark.parametrize("sqlstate", ["XX000", "42P01", "42703", "23505", "22P02", "54000"])
def test_postgresql_internal_schema_and_data_errors_are_not(sqlstate: str):
    assert not is_outage(wrapped(psycopg, psycopg.errors.lookup(sqlstate)("as the server sent it")))


@pytest.mark.parametrize(
    "message",
    [
        "received 2 results from command 'BEGIN'",  # PgBouncer dropped the server connection
        "received 2 results from command 'COMMIT'",
        "got no result from the query",
    ],
)
def test_postgresql_client_side_internal_errors_are_outages(message: str):
    # Raised by psycopg itself, no SQLSTATE: the replies no longer match the commands.
    error = psycopg.InternalError(message)
    assert error.sqlstate is None
    assert is_outage(wrapped(psycopg, error))


def test_postgresql_client_side_connection_errors_are_outages_its_usage_errors_are_not():
    lost = psycopg.OperationalError("consuming input failed: server closed the connection")
    closed = psycopg.InterfaceError("the connection is closed")
    misuse = psycopg.ProgrammingError("the query has 1 placeholder but 2 parameters were passed")
    assert is_outage(wrapped(psycopg, lost))
    assert is_outage(wrapped(psycopg, closed))
    assert not is_outage(wrapped(psycopg, misuse))


@pytest.mark.postgres
@pytest.mark.django_db
def test_postgresql_statement_timeout_is_an_outage():
    with (
        pytest.raises(DatabaseError) as caught,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("SET LOCAL statement_timeout = 50")
        cursor.execute("SELECT pg_sleep(2)")
    assert caught.value.__cause__.sqlstate == "57014"
    assert is_outage(caught.value)


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_genuine_postgresql_internal_error_is_not_an_outage():
    error = raised("DO $$ BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = 'internal_error'; END $$")
    assert isinstance(error.__cause__, psycopg.errors.InternalError_)
    assert not is_outage(error)


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_terminated_is_an_outage():
    with pytest.raises(DatabaseError) as caught, connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        else:
            cursor.execute("KILL CONNECTION CONNECTION_ID()")
        cursor.execute("SELECT 1")  # MariaDB: the next statement finds it gone
    connection.close()
    assert is_outage(caught.value), repr(caught.value.__cause__)


# --- MariaDB ------------------------------------------------------------------------


@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_mariadb_lock_wait_timeout_and_statement_timeout_are_outages():
    from tests.support.example_server import server_connection

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS outage_lock (id INT PRIMARY KEY)")
        cursor.execute("INSERT IGNORE INTO outage_lock VALUES (1)")
    try:
        with server_connection(connection.settings_dict["NAME"]) as other:
            other.set_autocommit(False)
            with other.cursor() as cursor:
                cursor.execute("SELECT id FROM outage_lock WHERE id = 1 FOR UPDATE")
            waited = raised(
                "SET STATEMENT innodb_lock_wait_timeout = 1 FOR "
                "UPDATE outage_lock SET id = 1 WHERE id = 1"
            )
            other.rollback()
        slow = raised("SET STATEMENT max_statement_time = 0.05 FOR SELECT SLEEP(2)")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS outage_lock")
    assert waited.__cause__.args[0] == 1205 and is_outage(waited)
    assert slow.__cause__.args[0] == 1969 and is_outage(slow)


# --- what a protected view answers ---------------------------------------------------


def failing_view(error: Exception):
    from django.http import HttpResponse

    from idempotency import idempotent

    @idempotent()
    def view(request) -> HttpResponse:
        raise error

    return view


def protected_post(view, user):
    from django.test import RequestFactory

    request = RequestFactory().post(
        "/failing/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-failing"
    )
    request.user = user
    return view(request)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "error",
    [
        wrapped(psycopg, psycopg.InterfaceError("the connection is closed")),  # no DatabaseError
        wrapped(psycopg, psycopg.InternalError("received 2 results from command 'COMMIT'")),
        wrapped(psycopg, psycopg.errors.lookup("08P01")("server conn crashed?")),
        wrapped(sqlite3, sqlite3.OperationalError("database is locked")),
    ],
    ids=repr,
)
def test_a_view_meeting_an_outage_answers_503(error: Exception, admin_user):
    response = protected_post(failing_view(error), admin_user)
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert json.loads(response.content)["code"] == "database_unavailable"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "error",
    [
        wrapped(psycopg, psycopg.errors.lookup("XX000")("a genuine internal error")),
        wrapped(sqlite3, sqlite3.OperationalError("no such column: orders.note")),  # its own table
    ],
    ids=repr,
)
def test_a_view_meeting_another_database_error_raises_it(error: Exception, admin_user):
    with pytest.raises(type(error)):
        protected_post(failing_view(error), admin_user)
