"""Outages behind PgBouncer in transaction mode: every one a 503 problem, nothing twice or lost.

When PgBouncer loses the server connection a client's transaction runs on, the
client hears it in PgBouncer's words (``server conn crashed?``, SQLSTATE 08P01),
in the server's (57P01), or, when the replies have come out of step with the
commands, as psycopg's own ``InternalError: received 2 results from command
'BEGIN'``. Each is an outage (``idempotency.stores.errors.is_outage``), answered
``503`` with ``Retry-After`` like a connection lost direct to PostgreSQL; none
is Django's HTML 500.

The load case is tests/protocol/test_outage_http.py's, with the example project
under gunicorn connected through PgBouncer, while the server connections
PgBouncer holds to its database are terminated every 0.2 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from idempotency.stores.errors import is_outage
from tests.deployment.test_pgbouncer import behind_pgbouncer  # noqa: F401  (autouse)
from tests.protocol.test_outage_http import (
    Load,
    _counts,
    assert_outages_answered,
    kill_app_connections,
    retry_every_key,
)
from tests.support.example_server import Server, example_project, gunicorn, server_connection

pytestmark = [pytest.mark.postgres, pytest.mark.pgbouncer]


def server_pid() -> int:
    """The PostgreSQL backend this connection's transaction runs on, behind PgBouncer."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def terminate(pid: int) -> None:
    """Ends backend ``pid`` from another connection, and waits until it is gone."""
    with server_connection(None) as server, server.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        for _ in range(100):
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if not cursor.fetchone()[0]:
                return
            time.sleep(0.05)
    raise AssertionError(f"backend {pid} still there")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("then", ["SELECT 1", "COMMIT"])
def test_a_server_connection_lost_mid_transaction_is_an_outage(then):
    """The server connection behind an open transaction ends; the client's next word fails."""
    with pytest.raises(DatabaseError) as caught, transaction.atomic():
        terminate(server_pid())
        if then == "SELECT 1":
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
    # SELECT fails inside the block; COMMIT when it closes.
    cause = caught.value.__cause__
    print(f"{then}: {type(caught.value).__name__} from {type(cause).__name__}: {cause}")
    assert is_outage(caught.value), repr(cause)
    connection.close()


# --- under load, over HTTP --------------------------------------------------------


@pytest.fixture(scope="module")
def served(django_db_blocker: Any) -> Iterator[Server]:
    with example_project(django_db_blocker) as (database, env), gunicorn(env) as url:
        assert (
            env["DATABASE_URL"]
            .split("@")[1]
            .startswith(f"{connection.settings_dict['HOST']}:{connection.settings_dict['PORT']}/")
        ), "the example project would not be behind PgBouncer"
        yield Server(url=url, database=database)


def test_server_connections_terminated_under_load_are_503s_and_retries_make_one_order(
    served: Server,
):
    load = Load(served)
    killed = load.during(kill_app_connections(served.database))

    assert killed > 0
    orders, processing = _counts(served, load.run)
    assert_outages_answered(load, orders, processing)  # no HTML 500, no key twice
    retry_every_key(load, lambda: _counts(served, load.run)[0])  # none lost
