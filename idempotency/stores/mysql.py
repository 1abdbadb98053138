"""MySQL 8 and MariaDB 10.6+ (InnoDB): a claim in which duplicates queue and never deadlock.

The ORM's claim (``INSERT IGNORE``, then ``SELECT ... FOR UPDATE``) deadlocks
on InnoDB: an ignored duplicate keeps a *shared* lock on the winner's row, two
duplicates then both ask to upgrade it, and InnoDB kills one (1213). And an
insert that waits in InnoDB's duplicate-key check holds a *gap* lock: when the
first attempt rolls back, the inserts queued behind it deadlock on each other's.

So a duplicate queues on the row with a locking read (a record lock only, at
READ COMMITTED), and first requests for a free key take turns to insert it
under a named lock per key, held for the insert only: no insert ever waits in
a duplicate-key check. The insert is ``ON DUPLICATE KEY UPDATE`` (an exclusive
lock) for writers that do not take the turn.

The wait is bounded by ``innodb_lock_wait_timeout`` (whole seconds): on MariaDB
each statement of the claim carries it (``SET STATEMENT ... FOR``); on MySQL and a
Galera node it is set for the claim and put back afterwards. Past it the statement
fails with 1205 and the duplicate answers 409. With ``IN_FLIGHT = "conflict"`` the
bound is 0 on
MariaDB (the locking read and ``GET_LOCK`` fail at once), 1 s on MySQL. A
deadlock that still happens (at REPEATABLE READ, whose locking reads lock gaps
too) is 1213, after which InnoDB has rolled back
the whole transaction: the protocol claims again in a new one where it opened the
transaction, and answers 409 inside the caller's.

There is no one-statement claim (every claim takes the locked path); on MariaDB
an inserted row is not read back (a duplicate's update sets the insert id to 0). A purge
batch is a range of the purge's order, deleted as one unbatched ``DELETE``
deletes (``delete_batch``); where a request holds one of its rows, or more rows
than a batch share one value, it is ``GenericStore``'s: the batch's ids locked
with ``SKIP LOCKED``, then deleted (MySQL cannot delete from a table with a
``LIMIT`` subquery on the same table).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property, partial
from typing import Any

from django.db import DatabaseError, OperationalError, transaction
from django.db.models import Max, Min

from idempotency.compat import unlocked, without_filter_on
from idempotency.models import IdempotencyRecord, IdempotencyRecordQuerySet
from idempotency.stores.base import Candidate, Contention, Found, Purged
from idempotency.stores.generic import GenericStore

# Server error codes: the lock wait ran past innodb_lock_wait_timeout (or NOWAIT
# found the row locked); the transaction was chosen as a deadlock's victim.
_LOCK_WAIT_TIMEOUT = 1205
_BUSY = frozenset({_LOCK_WAIT_TIMEOUT, 3572})
_RETRY = frozenset({1213})

# READ (1) of wsrep_sync_wait, beside what the session has; and the session's value back.
_CAUSAL = (
    ", @idempotency_sync_wait = @@SESSION.wsrep_sync_wait, "
    "SESSION wsrep_sync_wait = @@SESSION.wsrep_sync_wait | 1"
)
_CAUSAL_UNDONE = ", SESSION wsrep_sync_wait = @idempotency_sync_wait"


class MySQLStore(GenericStore):
    def insert_or_lock(self, candidate: Candidate) -> Found | None:
        # A duplicate of a key already held queues on the row with a record lock
        # only (READ COMMITTED locks no gap for an equality read of a unique key).
        held = self.holding(candidate)
        if held is not None:
            return held
        # The key looks free: first requests take turns to insert it. Two inserts of
        # one key would make the second wait in InnoDB's duplicate check, which holds
        # a gap lock; when the first rolls back, such waiters deadlock on each other.
        with self._turn_to_insert(candidate):
            held = self.holding(candidate)
            if held is not None:
                return held
            record = self.unsaved(candidate)
            params = [
                field.get_db_prep_save(field.pre_save(record, add=True), self.connection)
                for field in self._inserted
            ]
            with self.connection.cursor() as cursor:
                cursor.execute(self._insert_sql, params)
                inserted = cursor.lastrowid
            if inserted and self._mariadb:
                # The row is what was inserted: nothing to read back. A duplicate's
                # update sets the insert id to 0 (MariaDB sends LAST_INSERT_ID(expr) as
                # it; on MySQL, whose CI this project lacks, the row is read back).
                record.pk, record._state.adding, record._state.db = inserted, False, self.alias
                return Found(record, False, None)
            return self.holding(candidate)

    @contextmanager
    def _turn_to_insert(self, candidate: Candidate) -> Iterator[None]:
        """A named lock per key, held only while inserting (not until the commit).

        Waits as long as a row lock may (``bounded_lock_wait``); a named lock
        outlives a rollback, so it is released always.
        """
        digest = hashlib.sha256(f"{candidate.scope}\0{candidate.idem_key}".encode()).hexdigest()
        name = f"idempotency:{digest[:48]}"  # names are at most 64 characters
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT GET_LOCK(%s, @@SESSION.innodb_lock_wait_timeout)", [name])
            (got,) = cursor.fetchone()
        if got != 1:
            raise OperationalError(_LOCK_WAIT_TIMEOUT, f"Lock wait timeout on the lock {name}")
        try:
            yield
        finally:
            self._always("DO RELEASE_LOCK(%s)", [name])

    def _always(self, sql: str, params: list[Any] | None = None) -> None:
        """Undo a session setting or lock, even in a transaction Django marked for rollback.

        On the driver's own cursor: Django refuses statements in such a transaction,
        but these outlive it and must not leak into the connection's next request.
        A connection already closed took them with its session. Errors are
        Django's, as everywhere: a lost connection is an ``OperationalError``.
        """
        raw = self.connection.connection
        if raw is None:
            return
        with self.connection.wrap_database_errors, raw.cursor() as cursor:
            cursor.execute(sql, params)

    @contextmanager
    def bounded_lock_wait(self, seconds: float) -> Iterator[None]:
        wait = lock_wait_seconds(seconds, mariadb=self._mariadb)
        causal = self._galera_node()
        if self._mariadb and not causal:
            # MariaDB scopes a variable to one statement (SET STATEMENT ... FOR): each
            # statement of the block carries the bound, and the session keeps its own.
            # Nothing to set first or put back: two round trips fewer per claim.
            prefix = f"SET STATEMENT innodb_lock_wait_timeout={int(wait)} FOR "
            with self.connection.execute_wrapper(partial(_bounded, prefix)):
                yield
            return
        # A session variable: it outlives a rolled-back statement, so it is put back always.
        # On a Galera node the claim's reads wait for what the cluster has committed too.
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SET @idempotency_lock_wait = @@SESSION.innodb_lock_wait_timeout, "
                "SESSION innodb_lock_wait_timeout = %s" + (_CAUSAL if causal else ""),
                [wait],
            )
        try:
            yield
        finally:
            self._always(
                "SET SESSION innodb_lock_wait_timeout = @idempotency_lock_wait"
                + (_CAUSAL_UNDONE if causal else "")
            )

    def read_final(self, scope: str, key: str) -> IdempotencyRecord | None:
        if not self._galera_node():
            return super().read_final(scope, key)
        with self.connection.cursor() as cursor:
            cursor.execute("SET " + _CAUSAL.lstrip(", "))
        try:
            return super().read_final(scope, key)
        finally:
            self._always("SET " + _CAUSAL_UNDONE.lstrip(", "))

    # Whether the alias is a Galera node (MariaDB Galera Cluster, Percona XtraDB Cluster),
    # learnt on first use: the same server for the whole alias.
    _galera: bool | None = None

    def _galera_node(self) -> bool:
        """Whether the alias is a node of a Galera cluster (``wsrep_on``).

        Another node's commit reaches this one a little later (it is applied, in
        order, by this node's applier threads): a read that must see every outcome
        the cluster has acknowledged waits for it (``wsrep_sync_wait``). Without it,
        a replay on a lagging node would not find the record, run the view again and
        fail at ``COMMIT``. The wait only applies at the start of a transaction: the
        claim's first statement, a read outside any transaction. Under a transaction
        of the caller's (``ATOMIC_REQUESTS``), set it on the connection
        (docs/high-availability.md).
        """
        if self._galera is None:
            with self.connection.cursor() as cursor:
                cursor.execute("SHOW VARIABLES LIKE 'wsrep\\_on'")  # none on MySQL
                row = cursor.fetchone()
            self._galera = row is not None and str(row[1]).upper() == "ON"
        return self._galera

    def clock_offset(self) -> tuple[str, int] | None:
        # DATETIME columns hold the session's local time: NOW() must be UTC, as Django's values.
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT @@session.time_zone, TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW())"
            )
            zone, offset = cursor.fetchone()
        return str(zone), int(offset)

    def contention(self, error: DatabaseError) -> Contention | None:
        code = error.args[0] if error.args else None
        if code in _BUSY:
            return "busy"
        return "retry" if code in _RETRY else None

    def delete_batch(
        self, batch: IdempotencyRecordQuerySet, ordering: str, *, keys: bool = False
    ) -> Purged:
        """The batch as a range of ``ordering``, read and deleted in one index scan.

        Locking the batch's ids first and deleting them by primary key then reads
        every row twice and takes its lock twice: the purge ran at a quarter of one
        unbatched ``DELETE`` (docs/performance.md). The range's delete does not skip
        a row a request holds: it fails at once on it (a lock wait of 0 on MariaDB,
        1 s on MySQL, whose least is 1), is rolled back to its savepoint, and the
        batch is taken the locked way, skipping that row. With ``keys`` (a replay
        cache) the locked way tells which keys went.
        """
        if not keys:
            try:
                # A savepoint: the lock wait's error rolls back this statement only.
                with transaction.atomic(using=self.alias), self.bounded_lock_wait(0):
                    purged = self._delete_range(batch, ordering)
                if purged.deleted or purged.picked == 0:
                    return purged
                # An empty range: more rows than a batch share one value. Taken by id.
            except OperationalError as error:
                if self.contention(error) is None:
                    raise
        return super().delete_batch(batch, ordering, keys=keys)

    def _delete_range(self, batch: IdempotencyRecordQuerySet, ordering: str) -> Purged:
        # The batch's last value and the one after it, read from the index alone: the
        # rows before the next one are at most a batch (all that remain, without one).
        size = int(batch.query.high_mark or 0)
        # Without the status, which is not in the index (the delete checks it).
        ends = without_filter_on(unlocked(batch), "status")
        values = ends.values_list(ordering, flat=True)
        values.query.clear_limits()
        values.query.set_limits(size - 1, size + 1)
        last, *after = list(values) or [None]
        if last is None:  # fewer than a batch: the range is all there is
            deleted = self._delete_rows(batch, {})
            return Purged(deleted, None, deleted)
        bound = {f"{ordering}__lt": after[0]} if after else {}
        # The batch's ids, from the same index entries: where ids follow the order (rows
        # expire about as they were made), InnoDB reads the range in its primary key's
        # order, without a look-up per row; it keeps the other index where they do not.
        ids = ends.aggregate(lo=Min("pk"), hi=Max("pk"))
        bound.update(pk__gte=ids["lo"], pk__lte=ids["hi"])
        # The next batch starts at ``last``: every purgeable row before the bound went.
        return Purged(self._delete_rows(batch, bound), last, size)

    def _delete_rows(self, batch: IdempotencyRecordQuerySet, bound: dict[str, Any]) -> int:
        """One ``DELETE`` of the batch's rows (its filters, not its slice) within ``bound``.

        The database deletes their steps (the foreign key's ``ON DELETE CASCADE``).
        """
        rows = unlocked(batch)
        rows.query.clear_limits()
        rows.query.clear_ordering(force=True)
        deleted, _ = rows.filter(**bound).delete()
        return int(deleted)

    @property
    def _mariadb(self) -> bool:
        return bool(getattr(self.connection, "mysql_is_mariadb", False))

    # Composed once per alias.

    @cached_property
    def _inserted(self) -> list[Any]:
        return [field for field in IdempotencyRecord._meta.concrete_fields if not field.primary_key]

    @cached_property
    def _insert_sql(self) -> str:
        quote = self.connection.ops.quote_name
        meta = IdempotencyRecord._meta
        columns = ", ".join(quote(field.column) for field in self._inserted)
        values = ", ".join("%s" for _ in self._inserted)
        pk = quote(str(meta.pk.column))  # type: ignore[union-attr]
        # The no-op update is what makes a duplicate take the exclusive lock; it sets the
        # insert id the client gets to 0, so that an insert id says the row was inserted.
        return (
            f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({values}) "
            f"ON DUPLICATE KEY UPDATE {pk} = {pk} + LAST_INSERT_ID(0)"
        )


def _bounded(prefix: str, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    """A statement of ``bounded_lock_wait``'s block, with the bound for itself alone."""
    return execute(prefix + sql, params, many, context)


def lock_wait_seconds(seconds: float, *, mariadb: bool = False) -> int:
    """``innodb_lock_wait_timeout`` takes whole seconds: round up.

    No wait at all (``IN_FLIGHT = "conflict"``) is 0, which MariaDB takes as "fail at
    once"; MySQL's lowest value is 1.
    """
    if seconds <= 0 and mariadb:
        return 0
    return max(1, math.ceil(seconds))
