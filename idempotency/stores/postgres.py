"""PostgreSQL: the hot path's statements, run on Django's own cursor.

A new key's claim is one short statement and its finish another (a taken
key's claim reads the record too: in atomic mode in a second statement). The
statements are composed once per alias, in ``postgres_statements``. Where the
connection's ``OPTIONS`` turn on ``server_side_binding`` and psycopg 3's
``prepare_threshold``, PostgreSQL plans each once per connection (planning the
claim costs more than running it). Waiting with ``LISTEN``/``NOTIFY`` lives
apart, in ``postgres_waiting``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, OperationalError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import TextField
from django.db.models.expressions import RawSQL

from idempotency.compat import record_from_db, unlocked
from idempotency.models import IdempotencyRecord, IdempotencyRecordQuerySet
from idempotency.stores.base import Candidate, Contention, Purged
from idempotency.stores.postgres_statements import (
    JSON_COLUMNS,
    PER_REQUEST_ORDER,
    SET_LOCK_TIMEOUT,
    PostgresStatements,
)
from idempotency.stores.postgres_waiting import PostgresNotifications

# SQLSTATEs: the lock wait ran past lock_timeout; the transaction was chosen as a
# deadlock's victim, or could not be serialised.
_BUSY = frozenset({"55P03"})
_RETRY = frozenset({"40P01", "40001"})
# How long purge's unlocked delete waits on a row a request holds before it runs its
# batch again with SKIP LOCKED: long enough for a claim's own short statement to commit.
OPTIMISTIC_LOCK_WAIT = 0.01
assert Candidate._fields == PER_REQUEST_ORDER  # ``claim`` passes a candidate as it is


class PostgresStore(PostgresNotifications):
    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self.sql = PostgresStatements(alias)
        # The cursor ``statements`` opened, with the connection it belongs to. A context
        # variable is copied into other threads (``asyncio.to_thread``, ``sync_to_async``,
        # ``copy_context().run``) but Django's connections are per thread: a cursor is
        # shared only with code that runs on its own connection, so never across threads.
        self._shared: ContextVar[tuple[BaseDatabaseWrapper, Any] | None] = ContextVar(
            f"idempotency_cursor_{alias}", default=None
        )

    @contextmanager
    def statements(self) -> Iterator[None]:
        """The claim and the finish of an atomic-mode attempt run on one cursor.

        A cursor costs more to make and close than the finish costs to send.
        Nested (a protected call inside a protected view), the outer one's is used,
        but only on the connection it belongs to: a protected call made on another
        thread inside the attempt claims and finishes on that thread's own connection,
        in the same transaction as its business writes.
        """
        connection = self.connection
        shared = self._shared.get()
        if shared is not None and shared[0] is connection:
            yield
            return
        with connection.cursor() as cursor:
            token = self._shared.set((connection, cursor))
            try:
                yield
            finally:
                self._shared.reset(token)

    def _cursor(self) -> AbstractContextManager[Any]:
        """The cursor ``statements`` shares on this thread's connection, or a new one."""
        connection = self.connection
        shared = self._shared.get()
        if shared is not None and shared[0] is connection:
            return nullcontext(shared[1])
        return connection.cursor()

    def claim(
        self,
        candidate: Candidate,
        *,
        lease: timedelta | None,
        lock_timeout: float,
        expires_in: timedelta | None = None,
    ) -> IdempotencyRecord | None:
        """Atomic mode: one short ``INSERT``; a second statement only when the key is taken.

        The insert bounds its own wait on a concurrent first attempt (its
        ``status`` value sets ``lock_timeout``, saving the previous value in a
        transaction-local setting of its own) and puts the previous value back
        in its ``RETURNING``. A key already taken returns no row: the read of
        the record holding it puts the value back instead. PostgreSQL plans a
        ``VALUES`` insert in a fraction of what a statement with joins costs,
        on every request where nothing is prepared.

        Lease mode, where duplicates of an attempt in flight are the common
        case (they wait for its outcome), reads the record holding a taken key
        in the same statement: one round trip either way, planned dearer.
        """
        leased, expires = lease is not None, expires_in is not None
        params = (*candidate, *((lease,) if leased else ()), *((expires_in,) if expires else ()))
        statement = self.sql.claim(leased, expires, _milliseconds(lock_timeout))
        with self._cursor() as cursor:
            if leased:
                cursor.execute(statement, (*params, candidate.scope, candidate.idem_key))
                claimed, lease_until, *row, _restored = cursor.fetchone()
            else:
                cursor.execute(statement, params)
                claimed, lease_until, *row = cursor.fetchone() or (None, None)
                if claimed is None:
                    cursor.execute(self.sql.conflict, (candidate.scope, candidate.idem_key))
                    _restored, *row = cursor.fetchone()
        if claimed is not None:
            return self._claimed_record(claimed, lease_until, candidate)
        *row, expired = row
        record = self._record(self.connection, row)
        if record is not None:
            record.expired = bool(expired)  # type: ignore[attr-defined]  # as locked() annotates
        return record

    def insert_finished(
        self,
        candidate: Candidate,
        values: dict[str, Any],
        expires_in: timedelta | None,
        *,
        lock_timeout: float,
    ) -> IdempotencyRecord | None:
        """One ``INSERT ... ON CONFLICT DO NOTHING``: a key taken is no error.

        A unique violation would abort the transaction; this statement returns no
        row instead, and bounds its own wait on a concurrent insert as the claim does.
        """
        names = tuple(values)
        params: list[Any] = [*candidate]
        params += [
            json.dumps(value) if name in JSON_COLUMNS and value is not None else value
            for name, value in values.items()
        ]
        params += [expires_in] if expires_in is not None else []
        statement = self.sql.insert_finished(
            names, expires_in is not None, _milliseconds(lock_timeout)
        )
        with self._cursor() as cursor:
            cursor.execute(statement, params)
            row = cursor.fetchone()
        if row is None:
            return None
        record = self._claimed_record(row[0], None, candidate)
        for name, value in values.items():
            setattr(record, name, value)
        return record

    def read_final(self, scope: str, key: str) -> IdempotencyRecord | None:
        """One indexed read of the final record, composed once (the ORM costs more than it)."""
        connection = self.connection
        with connection.cursor() as cursor:
            cursor.execute(self.sql.read_final, (scope, key))
            row = cursor.fetchone()
        return None if row is None else self._record(connection, list(row))

    @contextmanager
    def bounded_lock_wait(self, seconds: float) -> Iterator[None]:
        # Transaction-local: a failed statement's rollback undoes it by itself.
        previous = self._set_lock_timeout(_milliseconds(seconds))
        yield
        self._set_lock_timeout(previous)

    def contention(self, error: DatabaseError) -> Contention | None:
        cause = error.__cause__
        state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        if state in _BUSY:
            return "busy"
        return "retry" if state in _RETRY else None

    def finish(
        self, pk: int, token: str, values: dict[str, Any], expires_in: timedelta | None
    ) -> bool:
        names = tuple(values)
        # Every value goes as text, bytes or a number: the JSON column's as its text, cast
        # in the statement (what the field's own adapter would send, without building one).
        params = [
            json.dumps(value) if name in JSON_COLUMNS and value is not None else value
            for name, value in values.items()
        ]
        params += [expires_in] if expires_in is not None else []
        params += [pk, token]
        with self._cursor() as cursor:
            cursor.execute(self.sql.finish(names, expires_in is not None), params)
            return bool(cursor.rowcount)

    def discard(self, pk: int, token: str) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self.sql.discard, (pk, token))
            (deleted,) = cursor.fetchone()
        return bool(deleted)

    def delete_batch(self, batch: IdempotencyRecordQuerySet, ordering: str) -> Purged:
        """One statement: the database picks and deletes the rows, and says where it ended.

        The batch's rows are addressed by ``ctid``, their place in the heap: the
        delete reads each straight from its page (a TID scan), where a join on
        ``id`` would look each up in the primary key's index again, or hash the
        batch. No list of ids goes back and forth.

        First without ``FOR UPDATE``: locking every row before deleting it writes
        each twice (a lock, then the delete, each in the WAL), which made a batch
        take twice as long (docs/retention.md). A row a request holds would make
        that statement wait: it gives up after ``OPTIMISTIC_LOCK_WAIT``, its
        savepoint is rolled back, and the batch runs again locking its rows with
        ``SKIP LOCKED``, which skips the held ones. A collision costs one batch
        twice; late retries of expired keys are rare next to the rows a batch holds.
        The savepoint is the one transaction control this method does.
        """
        try:
            # A savepoint: the lock wait's error rolls back this statement only.
            with transaction.atomic(using=self.alias), self.bounded_lock_wait(OPTIMISTIC_LOCK_WAIT):
                return self._delete_by_ctid(batch, ordering, locked=False)
        except OperationalError as error:
            if self.contention(error) is None:
                raise
        return self._delete_by_ctid(batch, ordering, locked=True)

    def _delete_by_ctid(
        self, batch: IdempotencyRecordQuerySet, ordering: str, *, locked: bool
    ) -> Purged:
        # ctid names a row version, not a row: an UPDATE moves the row to a new one. The
        # subquery is an InitPlan of this one statement, run before the delete, and:
        # - locked (FOR UPDATE SKIP LOCKED): until this transaction ends nobody can
        #   update or delete a row it locked, nor can vacuum reuse its slot, so each ctid
        #   still names the row it locked when the DELETE reads it. Where the lock had to
        #   follow an update committed after the statement began, the ctid is the new
        #   version's, which this statement's snapshot cannot see: that row is left for
        #   the next pass.
        # - unlocked: a row updated after the subquery read it is waited for (at most
        #   OPTIMISTIC_LOCK_WAIT), then its new version is checked against this WHERE
        #   again (READ COMMITTED): its new ctid is not in the array, so it stays.
        # Either way no other row is deleted, and the status is checked again on the
        # deleted rows all the same.
        chosen = batch if locked else unlocked(batch)
        rows = chosen.annotate(row=RawSQL("ctid", (), output_field=TextField())).values("row")
        # Compiled for this alias: sql_with_params() would compile for the default one.
        query, params = rows.query.get_compiler(self.alias).as_sql()
        with self.connection.cursor() as cursor:
            cursor.execute(self.sql.delete_by_ctid(query, ordering), params)
            picked, count, last = cursor.fetchone()
        return Purged(int(count), last, int(picked))

    def _record(self, connection: BaseDatabaseWrapper, row: list[Any]) -> IdempotencyRecord | None:
        """The model instance for a row of every column, as the ORM would make it.

        ``record_from_db`` with each field's ``from_db_value`` (the ORM's
        converters on PostgreSQL): a queryset or ``.raw()`` cost more CPU
        than the whole claim statement.
        """
        if row[self.sql.pk_position] is None:
            return None
        values = [
            value if convert is None or value is None else convert(value, None, connection)
            for convert, value in zip(self.sql.converters, row, strict=True)
        ]
        return record_from_db(self.alias, self.sql.attnames, values)

    def _claimed_record(self, pk: int, lease_until: Any, candidate: Candidate) -> IdempotencyRecord:
        """The record the claim just inserted, from what it inserted: nothing read back.

        What the database computed (``created_at``, ``updated_at``, ``expires_at``)
        is left deferred: the ORM reads it on first access, which the protocol never makes.
        """
        names, values = self.sql.inserted_names, self.sql.inserted_values.copy()
        values[self.sql.inserted_pk_position], values[self.sql.lease_position] = pk, lease_until
        for position, name in self.sql.candidate_positions:
            values[position] = getattr(candidate, name)
        values[self.sql.headers_position] = []  # a fresh default: the field's is a list
        return record_from_db(self.alias, names, values)

    def _set_lock_timeout(self, value: str) -> str:
        """Set ``lock_timeout`` for the transaction; returns the value it replaced, in one trip."""
        with self.connection.cursor() as cursor:
            cursor.execute(SET_LOCK_TIMEOUT, [value])
            return str(cursor.fetchone()[0])


def _milliseconds(seconds: float) -> str:
    # 0 would turn lock_timeout off (wait forever): no wait at all is 1 ms.
    return f"{max(1, int(seconds * 1000))}ms"
