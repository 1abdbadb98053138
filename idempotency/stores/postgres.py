"""PostgreSQL: the hot path's statements, composed once per alias and run on Django's own cursor.

A new key's claim is one short statement and its finish another (a taken
key's claim reads the record too: in atomic mode in a second statement). The
statements are composed once per alias (``PostgresStatements``, below): the ORM
would spend more time composing them than PostgreSQL spends running them. Each
statement and the reader of its rows depend on one column order, so both live in
this module. Where the connection's ``OPTIONS`` turn on ``server_side_binding``
and psycopg 3's ``prepare_threshold``, PostgreSQL plans each once per connection
(planning the claim costs more than running it). Waiting with ``LISTEN``/``NOTIFY``
lives apart, in ``postgres_waiting``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from datetime import timedelta
from functools import cached_property, lru_cache
from typing import Any

from django.db import DatabaseError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, Field, TextField
from django.db.models.expressions import RawSQL
from django.db.models.sql import DeleteQuery

from idempotency.compat import record_from_db, sql_literal, unlocked, without_filter_on
from idempotency.models import (
    PURGEABLE,
    REPLAYABLE,
    IdempotencyRecord,
    IdempotencyRecordQuerySet,
    IdempotencyStep,
    Status,
)
from idempotency.stores.base import Candidate, Contention, Found, Purged
from idempotency.stores.postgres_waiting import PostgresNotifications

# SQLSTATEs: the lock wait ran past lock_timeout; the transaction was chosen as a
# deadlock's victim, or could not be serialised.
_BUSY = frozenset({"55P03"})
_RETRY = frozenset({"40P01", "40001"})
# How long purge's unlocked delete waits on a row a request holds before it runs its
# batch again with SKIP LOCKED: long enough for a claim's own short statement to commit.
OPTIMISTIC_LOCK_WAIT = 0.01


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
        connection = connections[self.alias]
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
        connection = connections[self.alias]
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
    ) -> Found | None:
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
            return Found(self._claimed_record(claimed, lease_until, candidate))
        *row, expired = row
        record = self._record(connections[self.alias], row)
        return None if record is None else Found(record, bool(expired))

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
        connection = connections[self.alias]
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
        self, pk: int, token: bytes, values: dict[str, Any], expires_in: timedelta | None
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

    def discard(self, pk: int, token: bytes) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self.sql.discard, (pk, token))
            (deleted,) = cursor.fetchone()
        return bool(deleted)

    def delete_records(self, pks: Sequence[int]) -> int:
        """One statement: the records and their steps."""
        with self.connection.cursor() as cursor:
            cursor.execute(self.sql.delete_records, (list(pks),))
            (deleted,) = cursor.fetchone()
        return int(deleted)

    def delete_batch(
        self, batch: IdempotencyRecordQuerySet, ordering: str, *, keys: bool = False
    ) -> Purged:
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
                return self._delete_unlocked(batch, ordering, keys=keys)
        except OperationalError as error:
            if self.contention(error) is None:
                raise
        return self._delete_by_ctid(batch, ordering, locked=True, keys=keys)

    def _delete_unlocked(
        self, batch: IdempotencyRecordQuerySet, ordering: str, *, keys: bool
    ) -> Purged:
        """The batch as a range of ``ordering``; by ``ctid`` where that range is empty.

        The range is one index scan that deletes as it reads, as an unbatched
        ``DELETE`` does: choosing the rows first and then deleting them by
        ``ctid`` reads each twice, which cost a sixth more (docs/performance.md).
        A range is empty where more rows than a batch share one value (a bulk
        update gave them one ``expires_at``): those go by ``ctid``, a batch at a time.
        """
        purged = self._delete_range(batch, ordering, keys=keys)
        if purged.deleted == 0 and purged.picked == batch.query.high_mark:
            return self._delete_by_ctid(batch, ordering, locked=False, keys=keys)
        return purged

    def _delete_range(
        self, batch: IdempotencyRecordQuerySet, ordering: str, *, keys: bool
    ) -> Purged:
        # The bound is the value of the row after the batch's last: the rows before it
        # are at most a batch. Without such a row (the last batch) the range is open.
        size = int(batch.query.high_mark or 0)
        # Without the status, which is not in the index (the delete checks it): an
        # index-only scan where the visibility map allows it.
        bound = without_filter_on(unlocked(batch), "status")
        bound.query.clear_limits()
        bound.query.set_limits(size, size + 1)
        bound_sql, bound_params = bound.values(ordering).query.get_compiler(self.alias).as_sql()
        # Every filter of the batch (statuses, scope, the keyset's floor) on the delete itself.
        rows = unlocked(batch)
        rows.query.clear_limits()
        rows.query.clear_ordering(force=True)
        rows = rows.filter(**{f"{ordering}__lt": RawSQL(before_bound(ordering), ())})
        delete = rows.query.chain(DeleteQuery)
        delete_sql, delete_params = delete.get_compiler(self.alias).as_sql()
        with self.connection.cursor() as cursor:
            cursor.execute(
                self.sql.delete_range(bound_sql, delete_sql, ordering, keys=keys),
                (*bound_params, *delete_params, size),
            )
            picked, count, last, *deleted_keys = cursor.fetchone()
        pairs = tuple(zip(*deleted_keys, strict=True)) if keys and count else ()
        return Purged(int(count), last, int(picked), pairs)

    def _delete_by_ctid(
        self, batch: IdempotencyRecordQuerySet, ordering: str, *, locked: bool, keys: bool
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
            cursor.execute(self.sql.delete_by_ctid(query, ordering, keys=keys), params)
            picked, count, last, *deleted_keys = cursor.fetchone()
        pairs = tuple(zip(*deleted_keys, strict=True)) if keys and count else ()
        return Purged(int(count), last, int(picked), pairs)

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


# --- the statements, composed once per alias ---------------------------------------------

# The text columns a request fills in; every other column of a new record starts
# the same (its model default, prepared once) or from the database clock.
PER_REQUEST_ORDER = (
    *("scope", "idem_key", "operation", "request_hash", "request_method", "request_path"),
    "owner_token",
)
_PER_REQUEST = frozenset(PER_REQUEST_ORDER)
_DATABASE_CLOCK = frozenset({"created_at", "updated_at"})
# Left deferred in the record a claim returns: the database computed them.
_DEFERRED = _DATABASE_CLOCK | {"expires_at"}
# The JSON columns a finish writes: sent as JSON text and cast in the statement.
JSON_COLUMNS = frozenset({"response_headers"})
_NOW = "STATEMENT_TIMESTAMP()"
# Where the claim keeps the lock_timeout it found, for the rest of the transaction.
_SAVED = "idempotency.lock_timeout"
# Puts back the lock_timeout a claim found; a no-op where nothing is saved (the
# insert committed by itself, and its setting with it).
_RESTORE = (
    f"set_config('lock_timeout', COALESCE(NULLIF(current_setting('{_SAVED}', true), ''), "
    "current_setting('lock_timeout')), true)"
)
# Sets lock_timeout for the transaction and returns the value it replaced, in one trip.
SET_LOCK_TIMEOUT = (
    "SELECT previous, set_config('lock_timeout', %s, true) FROM "
    "(SELECT current_setting('lock_timeout') AS previous OFFSET 0) AS saved"
)


class PostgresStatements:
    """The statements of one alias (its quoting and the prepared defaults are the alias')."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._finish_statements: dict[tuple[tuple[str, ...], bool], str] = {}
        self._claim_statements: dict[tuple[bool, bool, str], str] = {}
        self._insert_finished_statements: dict[tuple[tuple[str, ...], bool, str], str] = {}

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    # The statements.

    def claim(self, leased: bool, expires: bool, lock_timeout: str) -> str:
        """The claim statement, composed once per mode and lock wait (a few per project)."""
        key = (leased, expires, lock_timeout)
        statement = self._claim_statements.get(key)
        if statement is None:
            if len(self._claim_statements) >= 64:  # lock waits made up per request
                self._claim_statements.clear()
            statement = self._compose_claim(leased, expires, lock_timeout)
            self._claim_statements[key] = statement
        return statement

    def finish(self, names: tuple[str, ...], expires: bool) -> str:
        """The finish of a record in flight: ``names`` from the outcome, then the window."""
        key = (names, expires)
        if key not in self._finish_statements:
            assignments = [
                f"{self.column(name)} = %s{'::jsonb' if name in JSON_COLUMNS else ''}"
                for name in names
            ] + [
                f"{self.column('lease_until')} = NULL",
                f"{self.column('completed_at')} = {_NOW}",
                f"{self.column('updated_at')} = {_NOW}",
                f"{self.column('version')} = {self.column('version')} + 1",
                f"{self.column('expires_at')} = " + (self._expiry if expires else "NULL"),
            ]
            self._finish_statements[key] = (
                f"UPDATE {self.table} SET {', '.join(assignments)} "
                f"WHERE {self.column('id')} = %s AND {self.column('owner_token')} = %s "
                f"AND {self.column('status')} = '{Status.PROCESSING.value}'"
            )
        return self._finish_statements[key]

    def insert_finished(self, names: tuple[str, ...], expires: bool, lock_timeout: str) -> str:
        """A finished record inserted once: the request's values, ``names``, then the window.

        Its wait on a concurrent insert of the key is bounded as the claim's is; a
        key taken returns no row (the caller rolls back, and the setting with it).
        """
        key = (names, expires, lock_timeout)
        statement = self._insert_finished_statements.get(key)
        if statement is None:
            if len(self._insert_finished_statements) >= 64:
                self._insert_finished_statements.clear()
            statement = self._compose_insert_finished(names, expires, lock_timeout)
            self._insert_finished_statements[key] = statement
        return statement

    def _compose_insert_finished(
        self, names: tuple[str, ...], expires: bool, lock_timeout: str
    ) -> str:
        given = set(names) | {"completed_at", "expires_at", "lease_until"}
        rest = [f for f in _inserted() if f.name not in _PER_REQUEST | given and self._set(f)]
        columns = [self.column(name) for name in (*PER_REQUEST_ORDER, *names)]
        values = ["%s"] * len(PER_REQUEST_ORDER)
        values += [f"%s{'::jsonb' if name in JSON_COLUMNS else ''}" for name in names]
        columns += [self.column(f.name) for f in rest]
        values += [self._literal(f.name) for f in rest]
        columns.append(self.column("completed_at"))
        values.append(_NOW)
        if expires:
            columns.append(self.column("expires_at"))
            values.append(f"{_NOW} + %s")
        # The first parameter (scope) carries the lock wait's bound, set before the
        # insert looks for a conflicting row, as in the claim.
        bound = f"set_config('lock_timeout', '{lock_timeout}', true)"
        values[0] = f"%s || left({bound}, 0)"
        scope, key = self.column("scope"), self.column("idem_key")
        return (
            f"INSERT INTO {self.table} ({', '.join(columns)}) VALUES ({', '.join(values)}) "
            f"ON CONFLICT ({scope}, {key}) DO NOTHING RETURNING {self.column('id')}"
        )

    @cached_property
    def read_final(self) -> str:
        """The final record holding a key and not expired: every column."""
        final = ", ".join(f"'{status.value}'" for status in sorted(REPLAYABLE))
        expires_at = self.column("expires_at")
        return (
            f"SELECT {self._every_column} FROM {self.table} WHERE {self.column('scope')} = %s "
            f"AND {self.column('idem_key')} = %s AND {self.column('status')} IN ({final}) "
            f"AND ({expires_at} IS NULL OR {expires_at} > {_NOW})"
        )

    @cached_property
    def conflict(self) -> str:
        """After an insert that met the key taken: the committed record holding it, if any.

        A statement of its own, so it reads what committed while the insert
        waited. It puts ``lock_timeout`` back whether or not a record is found;
        where the insert committed by itself (autocommit) nothing is saved and
        the setting is left as it is.
        """
        return (
            f"SELECT {_RESTORE}, record.* FROM (SELECT 1) AS one "
            f"LEFT JOIN ({self._holding}) AS record ON TRUE"
        )

    def delete_by_ctid(self, ctids: str, ordering: str, *, keys: bool = False) -> str:
        """Deletes the rows whose ``ctid`` ``ctids`` selects: how many it chose, their
        count and last ``ordering`` (with ``keys``, then their scopes and their keys).

        The chosen ``ctid``s are one array (a CTE, computed once); ``ctid = ANY``
        of it is a TID scan of exactly those rows. The deleted records' steps go in
        the same statement.
        """
        column = self._quote(field(ordering).column)
        purgeable = ", ".join(f"'{status.value}'" for status in PURGEABLE)
        returned, pairs = self._returned(column, keys)
        return (
            f"WITH picked AS MATERIALIZED (SELECT ARRAY({ctids}) AS ctids), "
            f"gone AS (DELETE FROM {self.table} "
            f"WHERE ctid = ANY((SELECT ctids FROM picked)::tid[]) "
            f"AND {self.column('status')} IN ({purgeable}) RETURNING {returned}), "
            f"{self._steps_of('gone')} "
            f"SELECT (SELECT cardinality(ctids) FROM picked), count(*), max({column}){pairs} "
            "FROM gone"
        )

    def delete_range(self, bound: str, delete: str, ordering: str, *, keys: bool = False) -> str:
        """``delete`` (whose rows lie below ``before_bound``) after ``bound`` (the value that
        ends the batch, or none): a batch's size where there was a bound, else the count;
        the count, the last ``ordering`` (with ``keys``, the scopes and keys).

        The bound is a CTE computed once, before the delete: the delete's index scan
        stops at it. The deleted records' steps go in the same statement.
        """
        column = self._quote(field(ordering).column)
        returned, pairs = self._returned(column, keys)
        return (
            f"WITH bound AS MATERIALIZED (SELECT ({bound}) AS value), "
            f"gone AS ({delete} RETURNING {returned}), {self._steps_of('gone')} "
            "SELECT CASE WHEN (SELECT value FROM bound) IS NULL THEN count(*) ELSE %s END, "
            f"count(*), max({column}){pairs} FROM gone"
        )

    def _returned(self, column: str, keys: bool) -> tuple[str, str]:
        """What a purge's delete returns, and the aggregates of the keys (with ``keys``)."""
        pk, scope, key = self.column("id"), self.column("scope"), self.column("idem_key")
        # Each column once: the ordering may be the primary key (purge --older-than).
        returned = ", ".join(dict.fromkeys([column, pk, *((scope, key) if keys else ())]))
        pairs = f", array_agg({scope}), array_agg({key})" if keys else ""
        return returned, pairs

    @cached_property
    def delete_records(self) -> str:
        """Deletes the records whose ids are the array parameter, and their steps: how many."""
        pk = self.column("id")
        return (
            f"WITH gone AS (DELETE FROM {self.table} WHERE {pk} = ANY(%s) RETURNING {pk}), "
            f"{self._steps_of('gone')} SELECT count(*) FROM gone"
        )

    @cached_property
    def discard(self) -> str:
        """The owner's discard of its record in flight, and the record's steps with it."""
        pk = self.column("id")
        return (
            f"WITH gone AS (DELETE FROM {self.table} WHERE {pk} = %s "
            f"AND {self.column('owner_token')} = %s "
            f"AND {self.column('status')} = '{Status.PROCESSING.value}' RETURNING {pk}), "
            f"{self._steps_of('gone')} SELECT count(*) FROM gone"
        )

    def _steps_of(self, deleted: str) -> str:
        """A CTE that deletes the steps of the records the CTE ``deleted`` returned.

        PostgreSQL has no foreign key from the steps to the records: its check of
        every deleted record would cost the purge more than the delete itself.
        """
        steps = IdempotencyStep._meta
        record_id = self._quote(steps.get_field("record").column)
        return (
            f"steps AS (DELETE FROM {self._quote(steps.db_table)} "
            f"WHERE {record_id} IN (SELECT {self.column('id')} FROM {deleted}))"
        )

    def _compose_claim(self, leased: bool, expires: bool, lock_timeout: str) -> str:
        # The request's own values are parameters, in PER_REQUEST_ORDER (as the store
        # passes them); the columns every new record starts with the same are
        # literals, prepared and quoted once here: fewer parameters to adapt per claim.
        # A column left NULL is left out (the table has no defaults): less to plan.
        given = {"lease_until"} if leased else set()
        given |= {"expires_at"} if expires else set()
        fields = [
            *(field(name) for name in PER_REQUEST_ORDER),
            *(f for f in _inserted() if f.name not in _PER_REQUEST | given and self._set(f)),
        ]
        columns = [self.column(f.name) for f in fields]
        values = [self._literal(f.name) for f in fields]
        # Evaluated before the insert looks for a conflicting row, so before any wait:
        # the nested call saves the previous value first (argument order is guaranteed).
        saved = f"set_config('{_SAVED}', current_setting('lock_timeout'), true)"
        bound = f"set_config('lock_timeout', '{lock_timeout}' || left({saved}, 0), true)"
        status = columns.index(self.column("status"))
        values[status] = f"{values[status]} || left({bound}, 0)"
        for name in ("lease_until", "expires_at"):
            if name in given:  # the database clock plus the parameter, in this order
                columns.append(self.column(name))
                values.append(f"{_NOW} + %s")
        scope, key = self.column("scope"), self.column("idem_key")
        pk, lease_until = self.column("id"), self.column("lease_until")
        # A new record comes back as its id (and lease) alone: the rest is what was inserted.
        insert = (
            f"INSERT INTO {self.table} ({', '.join(columns)}) VALUES ({', '.join(values)}) "
            f"ON CONFLICT ({scope}, {key}) DO NOTHING RETURNING {pk}, {lease_until}, "
            f"set_config('lock_timeout', current_setting('{_SAVED}'), true)"
        )
        if not leased:
            return insert
        # The read shares the insert's snapshot: it never sees the row this statement
        # inserts, only one committed before it, and is answered only when nothing was.
        return (
            f"WITH claimed AS ({insert}) SELECT claimed.{pk}, claimed.{lease_until}, record.*, "
            f"{_RESTORE} FROM (SELECT 1) AS one LEFT JOIN claimed ON TRUE "
            f"LEFT JOIN ({self._holding}) AS record ON claimed.{pk} IS NULL"
        )

    @cached_property
    def _holding(self) -> str:
        """The record holding a key, every column, then whether it expired (``expired_at_now``)."""
        scope, key = self.column("scope"), self.column("idem_key")
        expirable = ", ".join(f"'{status.value}'" for status in PURGEABLE)
        expired = (
            f"COALESCE({self.column('status')} IN ({expirable}) "
            f"AND {self.column('expires_at')} <= {_NOW}, FALSE)"
        )
        return (
            f"SELECT {self._every_column}, {expired} FROM {self.table} "
            f"WHERE {scope} = %s AND {key} = %s"
        )

    @cached_property
    def _expiry(self) -> str:
        """A record whose claim set its expiry counts the window from the claim.

        The atomic-mode claim inserts the expiry a success will have
        (``created_at`` + the window): the finish then writes the same value,
        changes no indexed column, and PostgreSQL can apply it in place (HOT).
        Elsewhere (lease mode, a retried record) it counts from now, as before.
        """
        expires_at, created_at = self.column("expires_at"), self.column("created_at")
        return f"CASE WHEN {expires_at} IS NULL THEN {_NOW} ELSE {created_at} END + %s"

    def _literal(self, name: str) -> str:
        """What a new record's column ``name`` is inserted as, in the claim statement."""
        if name in _PER_REQUEST:
            return "%s"
        if name in _DATABASE_CLOCK:
            return _NOW
        literal = sql_literal(self.connection, self._defaults[name])
        return literal.replace("%", "%%")  # the statement still has placeholders

    def _set(self, column: Field[Any, Any]) -> bool:
        """Whether a new record's ``column`` starts other than NULL."""
        return column.name in _DATABASE_CLOCK or self._defaults[column.name] is not None

    @cached_property
    def _defaults(self) -> dict[str, Any]:
        """Prepared values of the columns every new record starts with (the model's defaults)."""
        template = IdempotencyRecord(status=Status.PROCESSING)
        return {
            f.name: f.get_db_prep_save(getattr(template, f.attname), self.connection)
            for f in _inserted()
            if f.name not in _PER_REQUEST | _DATABASE_CLOCK
        }

    @cached_property
    def table(self) -> str:
        return self._quote(IdempotencyRecord._meta.db_table)

    def column(self, name: str) -> str:
        return self._quote(field(name).column)

    @cached_property
    def _every_column(self) -> str:
        return ", ".join(self._quote(f.column) for f in every_field())

    def _quote(self, name: str | None) -> str:
        return self.connection.ops.quote_name(str(name))  # the model's own names

    # Where the rows put each column.

    @cached_property
    def inserted_names(self) -> list[str]:
        """The columns a new record's values are known of, in the model's order: pk first."""
        return [f.attname for f in every_field() if f.name not in _DEFERRED]

    @cached_property
    def inserted_values(self) -> list[Any]:
        """A new record's values (the model's defaults) in ``inserted_names``' order."""
        template = IdempotencyRecord(status=Status.PROCESSING)
        return [getattr(template, name) for name in self.inserted_names]

    @cached_property
    def candidate_positions(self) -> list[tuple[int, str]]:
        return [(self.inserted_names.index(name), name) for name in PER_REQUEST_ORDER]

    @cached_property
    def inserted_pk_position(self) -> int:
        return self.inserted_names.index(IdempotencyRecord._meta.pk.attname)

    @cached_property
    def lease_position(self) -> int:
        return self.inserted_names.index("lease_until")

    @cached_property
    def headers_position(self) -> int:
        return self.inserted_names.index("response_headers")

    @cached_property
    def converters(self) -> list[Any]:
        return [getattr(f, "from_db_value", None) for f in every_field()]

    @cached_property
    def attnames(self) -> list[str]:
        return [f.attname for f in every_field()]

    @cached_property
    def pk_position(self) -> int:
        return every_field().index(IdempotencyRecord._meta.pk)


def every_field() -> list[Field[Any, Any]]:
    """The record's columns, in the order the claim and the reads return them."""
    return list(IdempotencyRecord._meta.concrete_fields)


@lru_cache(maxsize=1)
def _inserted() -> list[Field[Any, Any]]:
    return [f for f in IdempotencyRecord._meta.concrete_fields if not f.primary_key]


@lru_cache(maxsize=32)
def field(name: str) -> Field[Any, Any]:
    found = IdempotencyRecord._meta.get_field(name)
    assert isinstance(found, Field)
    return found


def before_bound(ordering: str) -> str:
    """The end of a purge batch's range (``PostgresStatements.delete_range``): its bound, or
    past every value of ``ordering`` (a time, or the primary key) where there was none."""
    past_every = "'infinity'" if isinstance(field(ordering), DateTimeField) else str(2**63 - 1)
    return f"(SELECT coalesce(value, {past_every}) FROM bound)"


assert Candidate._fields == PER_REQUEST_ORDER  # ``claim`` passes a candidate as it is
