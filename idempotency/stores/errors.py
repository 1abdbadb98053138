"""What a database error means, by the driver's own code: an outage, or a schema behind the code.

Django raises a lost connection, a missing column on MariaDB and a missing table
on SQLite as the same ``OperationalError``; only the driver's error (Django's
``__cause__``) tells them apart. An outage is answered ``503`` with
``Retry-After`` (the same request may succeed on retry); anything else is the
server error it is. docs/databases.md lists the codes per database.
"""

from __future__ import annotations

from django.db import Error as DjangoError
from django.db import InterfaceError, InternalError, OperationalError

from idempotency.exceptions import DatabaseUnavailable

__all__ = ["OUTAGE_CLASSES", "is_outage", "is_schema_error"]

# The classes Django raises an outage as (for frameworks that register handlers by class);
# ``is_outage`` tells which of their errors are one.
OUTAGE_CLASSES: tuple[type[Exception], ...] = (OperationalError, InterfaceError, InternalError)


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` is a database that went away or gave up under the request.

    A lost, refused or broken connection (PgBouncer's own disconnects, and a
    protocol knocked out of step by a server connection dropped mid-transaction,
    among them), a server restart or shutdown, too many connections, a
    statement or lock timeout, a deadlock's or serialization failure's victim:
    the same request may succeed on retry. Not an outage: what retrying cannot
    fix, such as a missing table or column, a constraint, a server's internal
    error. ``error`` is Django's exception (the driver's is its ``__cause__``)
    or the driver's own. docs/databases.md lists the codes per database.
    """
    if isinstance(error, DatabaseUnavailable):
        return True
    driver, cause = _driver_error(error)
    if driver == "postgresql":
        state = _sqlstate(cause)
        if state is None:
            # Raised by the driver itself: the connection failed, or the replies stopped
            # matching the commands ("received 2 results from command 'BEGIN'").
            return _is_a(cause, "OperationalError", "InterfaceError", "InternalError")
        return state.startswith("08") or state in _POSTGRES_OUTAGES
    if driver == "mysql":
        return _errno(cause) in _MYSQL_OUTAGES or _is_a(cause, "InterfaceError")
    if driver == "sqlite":
        return _is_a(cause, "OperationalError") and str(cause).startswith(_SQLITE_LOCKED)
    # Another backend: as Django classifies its driver's errors.
    return isinstance(error, (OperationalError, InterfaceError))


def is_schema_error(error: BaseException) -> bool:
    """Whether ``error`` names a table or column that does not exist: a schema behind the code."""
    driver, cause = _driver_error(error)
    if driver == "postgresql":
        return _sqlstate(cause) in ("42P01", "42703")  # undefined_table, undefined_column
    if driver == "mysql":
        return _errno(cause) in (1146, 1054)  # ER_NO_SUCH_TABLE, ER_BAD_FIELD_ERROR
    if driver == "sqlite":
        message = str(cause)
        return message.startswith(("no such table", "no such column")) or (
            "has no column named" in message
        )
    return False


_DRIVERS = {
    "psycopg": "postgresql",
    "psycopg2": "postgresql",
    "MySQLdb": "mysql",
    "pymysql": "mysql",
    "sqlite3": "sqlite",
}


def _driver_error(error: BaseException) -> tuple[str, BaseException | None]:
    """The driver's error (Django's wraps it as ``__cause__``) and its database, if known."""
    cause = error.__cause__ if isinstance(error, DjangoError) else error
    if cause is None:
        return "", None
    return _DRIVERS.get(type(cause).__module__.partition(".")[0], ""), cause


def _sqlstate(error: BaseException | None) -> str | None:
    state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)  # psycopg 3, 2
    return None if state is None else str(state)


def _errno(error: BaseException | None) -> object:
    args = getattr(error, "args", ())
    return args[0] if args else None


def _is_a(error: BaseException | None, *names: str) -> bool:
    """Whether the driver's ``error`` is of its classes named ``names`` (the DB-API's names)."""
    return any(kind.__name__ in names for kind in type(error).__mro__)


_SQLITE_LOCKED = ("database is locked", "database table is locked")

# PostgreSQL's SQLSTATEs (psycopg 3 and psycopg2) besides class 08, connection exception
# (PgBouncer's own errors are 08P01 too): the server ended or refused the session, or gave
# the statement up.
_POSTGRES_OUTAGES = frozenset(
    {
        "25P03",  # idle_in_transaction_session_timeout: the server ended the session
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "53300",  # too_many_connections
        "55P03",  # lock_not_available: lock_timeout
        "57014",  # query_canceled: statement_timeout
        "57P01",  # admin_shutdown: pg_terminate_backend, a fast shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now: starting up or shutting down
        "57P05",  # idle_session_timeout
    }
)

# MySQL's and MariaDB's error numbers (mysqlclient, PyMySQL): the server's, then the client
# library's (2000 and up).
_MYSQL_OUTAGES = frozenset(
    {
        1040,  # ER_CON_COUNT_ERROR: too many connections
        1047,  # ER_UNKNOWN_COM_ERROR: a Galera node not (yet) in the primary component
        1053,  # ER_SERVER_SHUTDOWN
        1158,  # ER_NET_READ_ERROR, and the three next: the connection failed under the server
        1159,
        1160,
        1161,
        1205,  # ER_LOCK_WAIT_TIMEOUT
        1213,  # ER_LOCK_DEADLOCK
        1317,  # ER_QUERY_INTERRUPTED: KILL QUERY
        1927,  # ER_CONNECTION_KILLED (MariaDB): KILL CONNECTION
        1969,  # ER_STATEMENT_TIMEOUT (MariaDB): max_statement_time
        3024,  # ER_QUERY_TIMEOUT (MySQL): max_execution_time
        2002,  # CR_CONNECTION_ERROR: refused (socket)
        2003,  # CR_CONN_HOST_ERROR: refused or unreachable (TCP)
        2005,  # CR_UNKNOWN_HOST
        2006,  # CR_SERVER_GONE_ERROR
        2013,  # CR_SERVER_LOST
        2055,  # CR_SERVER_LOST_EXTENDED
    }
)
