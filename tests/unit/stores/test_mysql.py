"""The MySQL/MariaDB store: the claim's lock wait, no deadlock among duplicates, purge batches."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from idempotency.exceptions import KeyInUse
from idempotency.fingerprint import fingerprint
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Attempt, Operation
from idempotency.protocol.execute import execute
from idempotency.retention import purge
from idempotency.stores import store_for
from idempotency.stores.mysql import MySQLStore, lock_wait_seconds
from tests.protocol.test_concurrency import THREADS, run_in_threads
from tests.support.factories import IdempotencyRecordFactory

HASH = fingerprint(["POST", "/things/", "{}"])
DONE = Outcome(Status.SUCCEEDED, StoredResponse(201, [], b"made"))
JOIN_TIMEOUT = 30.0


def operation(**changes: Any) -> Operation:
    base = Operation(scope="user:1:things", key="k-1", request_hash=HASH, name="things.create")
    return replace(base, **changes)


def run(op: Operation, work: Any = None, outcome: Outcome | None = DONE) -> str:
    return execute(
        op,
        work or (lambda attempt: "ran"),
        decide=lambda value, attempt: outcome,
        replay=lambda record: "replayed",
    )


def session_lock_wait() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
        return int(cursor.fetchone()[0])


def session_sync_wait() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.wsrep_sync_wait")
        return int(cursor.fetchone()[0])


def deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
        return int(cursor.fetchone()[1])


@pytest.mark.parametrize(("seconds", "whole"), [(0.3, 1), (1.0, 1), (2.0, 2), (2.01, 3), (0, 1)])
def test_lock_wait_is_whole_seconds_rounded_up(seconds, whole):
    assert lock_wait_seconds(seconds) == whole


def test_no_lock_wait_is_zero_on_mariadb_only():
    # MariaDB fails a lock wait at once with 0; MySQL's lowest value is 1.
    assert lock_wait_seconds(0, mariadb=True) == 0
    assert lock_wait_seconds(0.3, mariadb=True) == 1
    assert lock_wait_seconds(0, mariadb=False) == 1


@pytest.mark.parametrize(
    ("code", "meaning"), [(1205, "busy"), (3572, "busy"), (1213, "retry"), (1062, None)]
)
def test_what_an_error_means_for_the_claim(code, meaning):
    assert MySQLStore("default").contention(OperationalError(code, "...")) == meaning


@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
class TestOnMariaDB:
    def test_the_store_of_a_mysql_alias(self):
        assert type(store_for("default")) is MySQLStore

    @pytest.mark.parametrize("mode", ["atomic", "lease"])
    def test_the_work_runs_under_the_lock_wait_it_had_before(self, mode):
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 7")
        seen: list[int] = []
        run(
            operation(mode=mode, lock_timeout=0.5), lambda attempt: seen.append(session_lock_wait())
        )
        assert seen == [7]
        assert session_lock_wait() == 7

    def test_a_new_key_is_claimed_in_four_statements_that_carry_their_own_bound(self):
        # Read the key (locked), take the turn, read it again, insert: the bound goes with
        # each statement (SET STATEMENT), so none sets or puts back the session's, and the
        # inserted row is not read back. The named lock's release is the fifth trip.
        before = session_lock_wait()
        with CaptureQueriesContext(connection) as queries:
            assert run(operation(key="k-trips", lock_timeout=2)) == "ran"
        bound = "SET STATEMENT innodb_lock_wait_timeout=2 FOR "
        claim = [q["sql"] for q in queries.captured_queries if q["sql"].startswith(bound)]
        kinds = [sql.removeprefix(bound).split()[0] for sql in claim]
        assert kinds == ["SELECT", "SELECT", "SELECT", "INSERT"]
        assert "GET_LOCK" in claim[1] and "FOR UPDATE" in claim[2]
        statements = [q["sql"] for q in queries.captured_queries]
        assert [sql for sql in statements if sql.startswith("SET ") and sql not in claim] == []
        record = IdempotencyRecord.objects.get(idem_key="k-trips")
        assert record.status == "SUCCEEDED" and session_lock_wait() == before

    def test_a_single_server_is_no_galera_node_and_reads_as_it_did(self):
        store = MySQLStore("default")
        assert store._galera_node() is False
        with CaptureQueriesContext(connection) as queries:
            run(operation(key="k-single"))
            run(operation(key="k-single"))
        assert not [q for q in queries.captured_queries if "wsrep" in q["sql"]]

    def test_on_a_galera_node_the_claim_and_replay_read_what_the_cluster_committed(
        self, monkeypatch
    ):
        # A Galera node answers wsrep_on = ON (this server has the variable, off): the
        # claim's reads, and a read first, wait for the cluster's commits; after them,
        # the session's own setting is back.
        store = store_for("default")
        monkeypatch.setattr(store, "_galera", True)
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION wsrep_sync_wait = 8")  # a bit of the project's own
        seen: list[int] = []

        def work(attempt: Attempt) -> str:
            seen.append(session_sync_wait())
            return "ran"

        with store.bounded_lock_wait(1):
            seen.append(session_sync_wait())
        run(operation(key="k-galera"), work)
        assert store.read_final("user:1:things", "k-galera") is not None
        assert seen == [9, 8]  # the claim's reads with READ (1) added; the work as it was
        assert session_sync_wait() == 8
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION wsrep_sync_wait = 0")

    def test_a_galera_node_out_of_the_primary_component_is_an_outage(self):
        import MySQLdb

        from idempotency.stores.errors import is_outage
        from tests.unit.stores.test_errors import wrapped

        error = MySQLdb.OperationalError(
            1047, "WSREP has not yet prepared node for application use"
        )
        assert is_outage(wrapped(MySQLdb, error))

    def test_a_duplicate_gives_up_after_the_bound_rounded_up_and_puts_it_back(self):
        held, release = threading.Event(), threading.Event()

        def first(attempt: Attempt) -> str:
            held.set()
            release.wait(JOIN_TIMEOUT)
            return "ran"

        owner = threading.Thread(target=lambda: (run(operation(), first), connection.close()))
        owner.start()
        try:
            assert held.wait(JOIN_TIMEOUT)
            with connection.cursor() as cursor:
                cursor.execute("SET SESSION innodb_lock_wait_timeout = 9")
            started = time.monotonic()
            with pytest.raises(KeyInUse):
                run(operation(lock_timeout=0.4))  # InnoDB waits whole seconds: one
            waited = time.monotonic() - started
            assert session_lock_wait() == 9
            assert 0.9 <= waited < 4, waited  # the bound, plus a loaded machine's slack
        finally:
            release.set()
            owner.join(JOIN_TIMEOUT)

    @pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "rolled-back"])
    def test_concurrent_first_attempts_never_deadlock(self, recorded):
        # Each attempt holds the key a moment; unrecorded ones roll back, and the
        # duplicates queued behind them claim the key in turn. The shared-lock
        # upgrade of INSERT IGNORE and the gap locks of a queued duplicate-key check
        # made InnoDB kill some of them as deadlocks (1213).
        before = deadlocks()
        ran = []

        def work(attempt: Attempt) -> str:
            ran.append(attempt.owner_token)
            threading.Event().wait(0.05)
            return "ran"

        outcome = DONE if recorded else None
        results = run_in_threads(
            THREADS, lambda i: run(operation(lock_timeout=20), work, outcome=outcome)
        )
        assert deadlocks() == before
        if recorded:
            assert sorted(results) == ["ran"] + ["replayed"] * (THREADS - 1)
            assert len(ran) == 1
        else:
            assert results == ["ran"] * THREADS  # each ran in turn, nothing was recorded
            assert not IdempotencyRecord.objects.exists()

    def test_purge_deletes_a_range_a_batch_without_locking_it_first(self):
        now = timezone.now()
        for minutes in range(5):
            IdempotencyRecordFactory(
                succeeded=True, expires_at=now - timedelta(minutes=10 - minutes)
            )
        with CaptureQueriesContext(connection) as queries:
            assert purge(batch_size=2) == 5
        statements = [query["sql"] for query in queries]
        # Each with a lock wait of 0 for itself: a row a request holds fails it at once.
        bound = "SET STATEMENT innodb_lock_wait_timeout=0 FOR "
        deletes = [
            sql.removeprefix(bound) for sql in statements if sql.startswith(bound + "DELETE")
        ]
        assert len(deletes) == 3  # 2 + 2 + 1
        assert not any("FOR UPDATE" in sql for sql in statements)  # nobody held a row
        # A range of expires_at and of the ids its index entries hold; the last one open.
        assert all("`expires_at` <" in sql and "`id` >=" in sql for sql in deletes[:2])
        assert "`expires_at` >=" not in deletes[0]
        assert all("`expires_at` >=" in sql for sql in deletes[1:])  # from where the last ended
        assert "SELECT" not in "".join(deletes)
