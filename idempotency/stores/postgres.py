"""PostgreSQL: the hot path's statements as SQL composed once per alias.

A new key's claim is one short statement and its finish another (a taken
key's claim reads the record too: in atomic mode in a second statement): the
ORM would spend more time composing them than PostgreSQL spends running them. They run
on Django's own cursor: where the connection's ``OPTIONS`` turn on
``server_side_binding`` and psycopg 3's ``prepare_threshold``, PostgreSQL
plans each once per connection (planning the claim costs more than running it).

The module is over the usual 400 lines on purpose: each statement and the reader
of its rows depend on one column order, composed in one place. Waiting with
``LISTEN``/``NOTIFY`` lives apart, in ``postgres_waiting``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from datetime import timedelta
from functools import cached_property, lru_cache
from typing import Any

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from idempotency.compat import record_from_db, sql_literal
from idempotency.models import (
    PURGEABLE,
    REPLAYABLE,
    IdempotencyRecord,
    IdempotencyRecordQuerySet,
    Status,
)
from idempotency.stores.base import Candidate, Contention
from idempotency.stores.postgres_waiting import PostgresNotifications

# SQLSTATEs: the lock wait ran past lock_timeout; the transaction was chosen as a
# deadlock's victim, or could not be serialised.
_BUSY = frozenset({"55P03"})
_RETRY = frozenset({"40P01", "40001"})

# The text columns a request fills in; every other column of a new record starts
# the same (its model default, prepared once) or from the database clock.
_PER_REQUEST_ORDER = (
    *("scope", "idem_key", "operation", "request_hash", "request_method", "request_path"),
    "owner_token",
)
_PER_REQUEST = frozenset(_PER_REQUEST_ORDER)
assert Candidate._fields == _PER_REQUEST_ORDER  # ``claim`` passes a candidate as it is
_DATABASE_CLOCK = frozenset({"created_at", "updated_at"})
# Left deferred in the record a claim returns: the database computed them.
_DEFERRED = _DATABASE_CLOCK | {"expires_at"}
# The JSON columns a finish writes: sent as JSON text and cast in the statement.
_JSON = frozenset({"response_headers"})
_NOW = "STATEMENT_TIMESTAMP()"
# Where the claim keeps the lock_timeout it found, for the rest of the transaction.
_SAVED = "idempotency.lock_timeout"
# Puts back the lock_timeout a claim found; a no-op where nothing is saved (the
# insert committed by itself, and its setting with it).
_RESTORE = (
    f"set_config('lock_timeout', COALESCE(NULLIF(current_setting('{_SAVED}', true), ''), "
    "current_setting('lock_timeout')), true)"
)


class PostgresStore(PostgresNotifications):
    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self._finish_statements: dict[tuple[tuple[str, ...], bool], str] = {}
        self._claim_statements: dict[tuple[bool, bool, str], str] = {}
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
        statement = self._claim_sql(leased, expires, _milliseconds(lock_timeout))
        with self._cursor() as cursor:
            if leased:
                cursor.execute(statement, (*params, candidate.scope, candidate.idem_key))
                claimed, lease_until, *row, _restored = cursor.fetchone()
            else:
                cursor.execute(statement, params)
                claimed, lease_until, *row = cursor.fetchone() or (None, None)
                if claimed is None:
                    cursor.execute(self._conflict_sql, (candidate.scope, candidate.idem_key))
                    _restored, *row = cursor.fetchone()
        if claimed is not None:
            return self._claimed_record(claimed, lease_until, candidate)
        *row, expired = row
        record = self._record(self.connection, row)
        if record is not None:
            record.expired = bool(expired)  # type: ignore[attr-defined]  # as locked() annotates
        return record

    def read_final(self, scope: str, key: str) -> IdempotencyRecord | None:
        """One indexed read of the final record, composed once (the ORM costs more than it)."""
        connection = self.connection
        with connection.cursor() as cursor:
            cursor.execute(self._read_final_sql, (scope, key))
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
            json.dumps(value) if name in _JSON and value is not None else value
            for name, value in values.items()
        ]
        params += [expires_in] if expires_in is not None else []
        params += [pk, token]
        with self._cursor() as cursor:
            cursor.execute(self._finish_sql(names, expires_in is not None), params)
            return bool(cursor.rowcount)

    def delete_batch(self, batch: IdempotencyRecordQuerySet, ordering: str) -> tuple[int, Any]:
        """One statement: the database picks, locks and deletes the rows, and says where it ended.

        No list of ids goes back and forth.
        """
        # Compiled for this alias: sql_with_params() would compile for the default one.
        query, params = batch.values("pk").query.get_compiler(self.alias).as_sql()
        column = self._quote(_field(ordering).column)
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"WITH gone AS (DELETE FROM {self._table} WHERE {self._column('id')} IN ({query}) "
                f"RETURNING {column}) SELECT count(*), max({column}) FROM gone",
                params,
            )
            count, last = cursor.fetchone()
        return int(count), last

    def _record(self, connection: BaseDatabaseWrapper, row: list[Any]) -> IdempotencyRecord | None:
        """The model instance for a row of every column, as the ORM would make it.

        ``record_from_db`` with each field's ``from_db_value`` (the ORM's
        converters on PostgreSQL): a queryset or ``.raw()`` cost more CPU
        than the whole claim statement.
        """
        if row[self._pk_position] is None:
            return None
        values = [
            value if convert is None or value is None else convert(value, None, connection)
            for convert, value in zip(self._converters, row, strict=True)
        ]
        return record_from_db(self.alias, self._attnames, values)

    def _claimed_record(self, pk: int, lease_until: Any, candidate: Candidate) -> IdempotencyRecord:
        """The record the claim just inserted, from what it inserted: nothing read back.

        What the database computed (``created_at``, ``updated_at``, ``expires_at``)
        is left deferred: the ORM reads it on first access, which the protocol never makes.
        """
        names, values = self._inserted_names, self._inserted_values.copy()
        values[self._inserted_pk_position], values[self._lease_position] = pk, lease_until
        for position, name in self._candidate_positions:
            values[position] = getattr(candidate, name)
        values[self._headers_position] = []  # a fresh default: the field's is a list
        return record_from_db(self.alias, names, values)

    def _set_lock_timeout(self, value: str) -> str:
        """Set ``lock_timeout`` for the transaction; returns the value it replaced, in one trip."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT previous, set_config('lock_timeout', %s, true) FROM "
                "(SELECT current_setting('lock_timeout') AS previous OFFSET 0) AS saved",
                [value],
            )
            return str(cursor.fetchone()[0])

    # Composed once per alias.

    @cached_property
    def _defaults(self) -> dict[str, Any]:
        """Prepared values of the columns every new record starts with (the model's defaults)."""
        template = IdempotencyRecord(status=Status.PROCESSING)
        return {
            field.name: field.get_db_prep_save(getattr(template, field.attname), self.connection)
            for field in _inserted()
            if field.name not in _PER_REQUEST | _DATABASE_CLOCK
        }

    @cached_property
    def _inserted_names(self) -> list[str]:
        """The columns a new record's values are known of, in the model's order: pk first."""
        return [field.attname for field in _every_field() if field.name not in _DEFERRED]

    @cached_property
    def _inserted_values(self) -> list[Any]:
        """A new record's values (the model's defaults) in ``_inserted_names``' order."""
        template = IdempotencyRecord(status=Status.PROCESSING)
        return [getattr(template, name) for name in self._inserted_names]

    @cached_property
    def _candidate_positions(self) -> list[tuple[int, str]]:
        return [(self._inserted_names.index(name), name) for name in _PER_REQUEST_ORDER]

    @cached_property
    def _inserted_pk_position(self) -> int:
        return self._inserted_names.index(IdempotencyRecord._meta.pk.attname)

    @cached_property
    def _lease_position(self) -> int:
        return self._inserted_names.index("lease_until")

    @cached_property
    def _headers_position(self) -> int:
        return self._inserted_names.index("response_headers")

    @cached_property
    def _converters(self) -> list[Any]:
        return [getattr(field, "from_db_value", None) for field in _every_field()]

    @cached_property
    def _attnames(self) -> list[str]:
        return [field.attname for field in _every_field()]

    @cached_property
    def _pk_position(self) -> int:
        return _every_field().index(IdempotencyRecord._meta.pk)

    @cached_property
    def _read_final_sql(self) -> str:
        every = ", ".join(self._quote(field.column) for field in _every_field())
        final = ", ".join(f"'{status.value}'" for status in sorted(REPLAYABLE))
        expires_at = self._column("expires_at")
        return (
            f"SELECT {every} FROM {self._table} WHERE {self._column('scope')} = %s "
            f"AND {self._column('idem_key')} = %s AND {self._column('status')} IN ({final}) "
            f"AND ({expires_at} IS NULL OR {expires_at} > {_NOW})"
        )

    def _claim_sql(self, leased: bool, expires: bool, lock_timeout: str) -> str:
        """The claim statement, composed once per mode and lock wait (a few per project)."""
        key = (leased, expires, lock_timeout)
        statement = self._claim_statements.get(key)
        if statement is None:
            if len(self._claim_statements) >= 64:  # lock waits made up per request
                self._claim_statements.clear()
            statement = self._compose_claim(leased, expires, lock_timeout)
            self._claim_statements[key] = statement
        return statement

    def _compose_claim(self, leased: bool, expires: bool, lock_timeout: str) -> str:
        # The request's own values are parameters, in _PER_REQUEST_ORDER (as ``claim``
        # passes them); the columns every new record starts with the same are
        # literals, prepared and quoted once here: fewer parameters to adapt per claim.
        # A column left NULL is left out (the table has no defaults): less to plan.
        given = {"lease_until"} if leased else set()
        given |= {"expires_at"} if expires else set()
        fields = [
            *(_field(name) for name in _PER_REQUEST_ORDER),
            *(f for f in _inserted() if f.name not in _PER_REQUEST | given and _set(self, f)),
        ]
        columns = [self._column(field.name) for field in fields]
        values = [self._literal(field.name) for field in fields]
        # Evaluated before the insert looks for a conflicting row, so before any wait:
        # the nested call saves the previous value first (argument order is guaranteed).
        saved = f"set_config('{_SAVED}', current_setting('lock_timeout'), true)"
        bound = f"set_config('lock_timeout', '{lock_timeout}' || left({saved}, 0), true)"
        status = columns.index(self._column("status"))
        values[status] = f"{values[status]} || left({bound}, 0)"
        for name in ("lease_until", "expires_at"):
            if name in given:  # the database clock plus the parameter, in this order
                columns.append(self._column(name))
                values.append(f"{_NOW} + %s")
        scope, key = self._column("scope"), self._column("idem_key")
        pk, lease_until = self._column("id"), self._column("lease_until")
        # A new record comes back as its id (and lease) alone: the rest is what was inserted.
        insert = (
            f"INSERT INTO {self._table} ({', '.join(columns)}) VALUES ({', '.join(values)}) "
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
            f"LEFT JOIN ({self._holding_sql}) AS record ON claimed.{pk} IS NULL"
        )

    @cached_property
    def _holding_sql(self) -> str:
        """The record holding a key, every column, then whether it expired (``expired_at_now``)."""
        every = ", ".join(self._quote(field.column) for field in _every_field())
        scope, key = self._column("scope"), self._column("idem_key")
        expirable = ", ".join(f"'{status.value}'" for status in PURGEABLE)
        expired = (
            f"COALESCE({self._column('status')} IN ({expirable}) "
            f"AND {self._column('expires_at')} <= {_NOW}, FALSE)"
        )
        return f"SELECT {every}, {expired} FROM {self._table} WHERE {scope} = %s AND {key} = %s"

    @cached_property
    def _conflict_sql(self) -> str:
        """After an insert that met the key taken: the committed record holding it, if any.

        A statement of its own, so it reads what committed while the insert
        waited. It puts ``lock_timeout`` back whether or not a record is found;
        where the insert committed by itself (autocommit) nothing is saved and
        the setting is left as it is.
        """
        return (
            f"SELECT {_RESTORE}, record.* FROM (SELECT 1) AS one "
            f"LEFT JOIN ({self._holding_sql}) AS record ON TRUE"
        )

    def _literal(self, name: str) -> str:
        """What a new record's column ``name`` is inserted as, in the claim statement."""
        if name in _PER_REQUEST:
            return "%s"
        if name in _DATABASE_CLOCK:
            return _NOW
        literal = sql_literal(self.connection, self._defaults[name])
        return literal.replace("%", "%%")  # the statement still has placeholders

    def _finish_sql(self, names: tuple[str, ...], expires: bool) -> str:
        key = (names, expires)
        if key not in self._finish_statements:
            assignments = [
                f"{self._column(name)} = %s{'::jsonb' if name in _JSON else ''}" for name in names
            ] + [
                f"{self._column('lease_until')} = NULL",
                f"{self._column('completed_at')} = {_NOW}",
                f"{self._column('updated_at')} = {_NOW}",
                f"{self._column('version')} = {self._column('version')} + 1",
                f"{self._column('expires_at')} = " + (self._expiry if expires else "NULL"),
            ]
            self._finish_statements[key] = (
                f"UPDATE {self._table} SET {', '.join(assignments)} "
                f"WHERE {self._column('id')} = %s AND {self._column('owner_token')} = %s "
                f"AND {self._column('status')} = '{Status.PROCESSING.value}'"
            )
        return self._finish_statements[key]

    @cached_property
    def _expiry(self) -> str:
        """A record whose claim set its expiry counts the window from the claim.

        The atomic-mode claim inserts the expiry a success will have
        (``created_at`` + the window): the finish then writes the same value,
        changes no indexed column, and PostgreSQL can apply it in place (HOT).
        Elsewhere (lease mode, a retried record) it counts from now, as before.
        """
        expires_at, created_at = self._column("expires_at"), self._column("created_at")
        return f"CASE WHEN {expires_at} IS NULL THEN {_NOW} ELSE {created_at} END + %s"

    @cached_property
    def _table(self) -> str:
        return self._quote(IdempotencyRecord._meta.db_table)

    def _column(self, name: str) -> str:
        return self._quote(_field(name).column)

    def _quote(self, name: str | None) -> str:
        return self.connection.ops.quote_name(str(name))  # the model's own names


def _set(store: PostgresStore, field: Field[Any, Any]) -> bool:
    """Whether a new record's ``field`` starts other than NULL."""
    return field.name in _DATABASE_CLOCK or store._defaults[field.name] is not None


def _every_field() -> list[Field[Any, Any]]:
    """The record's columns, in the order the claim statement returns them."""
    return list(IdempotencyRecord._meta.concrete_fields)


@lru_cache(maxsize=1)
def _inserted() -> list[Field[Any, Any]]:
    return [field for field in IdempotencyRecord._meta.concrete_fields if not field.primary_key]


@lru_cache(maxsize=32)
def _field(name: str) -> Field[Any, Any]:
    field = IdempotencyRecord._meta.get_field(name)
    assert isinstance(field, Field)
    return field


def _milliseconds(seconds: float) -> str:
    # 0 would turn lock_timeout off (wait forever): no wait at all is 1 ms.
    return f"{max(1, int(seconds * 1000))}ms"
