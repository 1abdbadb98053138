"""PostgreSQL: the hot path's statements, composed once per alias, and the column order they share.

``PostgresStore`` runs these and reads their rows by the positions given here:
each statement and the reader of its rows depend on one column order, so both
are composed in this one module. The ORM would spend more time composing them
than PostgreSQL spends running them.
"""

from __future__ import annotations

from functools import cached_property, lru_cache
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from idempotency.compat import sql_literal
from idempotency.models import PURGEABLE, REPLAYABLE, IdempotencyRecord, IdempotencyStep, Status

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

    def delete_by_ctid(self, ctids: str, ordering: str) -> str:
        """Deletes the rows whose ``ctid`` ``ctids`` selects: how many it chose, their
        count and last ``ordering``.

        The chosen ``ctid``s are one array (a CTE, computed once); ``ctid = ANY``
        of it is a TID scan of exactly those rows. The deleted records' steps go in
        the same statement.
        """
        column = self._quote(field(ordering).column)
        purgeable = ", ".join(f"'{status.value}'" for status in PURGEABLE)
        pk = self.column("id")
        return (
            f"WITH picked AS MATERIALIZED (SELECT ARRAY({ctids}) AS ctids), "
            f"gone AS (DELETE FROM {self.table} "
            f"WHERE ctid = ANY((SELECT ctids FROM picked)::tid[]) "
            f"AND {self.column('status')} IN ({purgeable}) RETURNING {column}, {pk}), "
            f"{self._steps_of('gone')} "
            f"SELECT (SELECT cardinality(ctids) FROM picked), count(*), max({column}) FROM gone"
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
