"""The hot path's statements on PostgreSQL, as SQL composed once.

``core`` decides; this module only talks to the database. Each request's
claim is one statement and its finish another: the ORM would spend more time
composing them than PostgreSQL spends running them. Where the connection's
``OPTIONS`` enable psycopg 3's ``prepare_threshold``, both are bound server-side
so that PostgreSQL plans each once per connection: planning the claim costs
more than running it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import Field

from idempotency.models import IdempotencyRecord, Status

try:
    from psycopg import Cursor as _SERVER_BINDING
except ImportError:  # psycopg 2: nothing to prepare
    _SERVER_BINDING = None  # type: ignore[assignment,misc]

# The text columns a request fills in; every other column of a new record starts
# the same (its model default, prepared once) or from the database clock.
_PER_REQUEST = frozenset(
    {"scope", "idem_key", "operation", "request_hash", "request_method", "request_path"}
    | {"owner_token"}
)
_DATABASE_CLOCK = frozenset({"created_at", "updated_at"})


class Claim(NamedTuple):
    """What the claim statement found: the new record's id, or the committed record."""

    claimed_id: int | None
    lease_until: datetime | None
    created_at: datetime | None
    existing: IdempotencyRecord | None


def claim(
    connection: BaseDatabaseWrapper,
    candidate: IdempotencyRecord,
    lock_timeout: str,
    lease: timedelta | None,
) -> Claim:
    """Insert ``candidate``, or read the committed record holding its key, in one statement.

    The statement bounds its own wait on a concurrent first attempt with
    ``set_config('lock_timeout', ..., true)`` and restores the previous value
    once the insert is done, whatever it found. With ``lease`` the record is
    inserted with its lease taken, by the database clock.
    """
    fields = _insert_fields(lease is not None)
    constants = _constants(connection.alias)
    values = [
        constants[field.name] if field.name in constants else getattr(candidate, field.attname)
        for field in fields
        if field.name not in _DATABASE_CLOCK
    ]
    leased = [lease] if lease is not None else []
    params = [lock_timeout, *values, *leased, candidate.scope, candidate.idem_key]
    with _cursor(connection) as cursor:
        cursor.execute(_claim_sql(lease is not None), params)
        row = cursor.fetchone()
    claimed_id, lease_until, created_at, *existing, _restored = row
    if claimed_id is not None or existing[_pk_position()] is None:
        return Claim(claimed_id, lease_until, created_at, None)
    return Claim(None, None, None, _record(connection, existing))


def finish(
    connection: BaseDatabaseWrapper,
    pk: int,
    owner_token: str,
    values: dict[str, Any],
    expires_in: timedelta | None,
) -> int:
    """Store the outcome ``values`` while ``owner_token`` still holds the record (fencing)."""
    names = tuple(values)
    params = [_field(name).get_db_prep_save(values[name], connection) for name in names]
    params += [expires_in] if expires_in is not None else []
    params += [pk, owner_token, Status.PROCESSING.value]
    with _cursor(connection) as cursor:
        cursor.execute(_finish_sql(names, expires_in is not None), params)
        return int(cursor.rowcount)


def set_lock_timeout(connection: BaseDatabaseWrapper, value: str) -> str:
    """Set ``lock_timeout`` for the transaction; returns the value it replaced, in one trip."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT previous, set_config('lock_timeout', %s, true) FROM "
            "(SELECT current_setting('lock_timeout') AS previous OFFSET 0) AS saved",
            [value],
        )
        return str(cursor.fetchone()[0])


def _cursor(connection: BaseDatabaseWrapper) -> CursorWrapper:
    """Django's cursor; around a server-side binding one where psycopg 3 may prepare.

    Django binds client-side, which PostgreSQL cannot prepare, and leaves
    psycopg's ``prepare_threshold`` off unless ``OPTIONS`` sets it (poolers in
    transaction mode lose prepared statements). Where it is set, this cursor is
    made the way ``connection.cursor()`` makes Django's own (health check,
    thread check, error wrapping, query logging), only the binding differs.
    """
    # psycopg 2, preparing off, or not connected yet (its first statement goes unprepared)
    if getattr(connection.connection, "prepare_threshold", None) is None:
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        return connection._prepare_cursor(_SERVER_BINDING(connection.connection))  # type: ignore[attr-defined,no-any-return]


def _record(connection: BaseDatabaseWrapper, values: Sequence[Any]) -> IdempotencyRecord:
    fields = IdempotencyRecord._meta.concrete_fields
    converted = []
    for field, value in zip(fields, values, strict=True):
        for converter in _converters(connection.alias, field):
            value = converter(value, field, connection)
        converted.append(value)
    return IdempotencyRecord.from_db(connection.alias, [f.attname for f in fields], converted)


@lru_cache(maxsize=1)
def _pk_position() -> int:
    meta = IdempotencyRecord._meta
    return list(meta.concrete_fields).index(meta.pk)


@lru_cache(maxsize=64)
def _converters(alias: str, field: Field[Any, Any]) -> list[Any]:
    from django.db import connections

    connection = connections[alias]
    column = field.get_col(IdempotencyRecord._meta.db_table)
    return [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)]


@lru_cache(maxsize=8)
def _constants(alias: str) -> dict[str, Any]:
    """Prepared values of the columns every new record starts with (the model's defaults)."""
    from django.db import connections

    connection = connections[alias]
    template = IdempotencyRecord(status=Status.PROCESSING)
    return {
        field.name: field.get_db_prep_save(getattr(template, field.attname), connection)
        for field in _insert_fields(False)
        if field.name not in _PER_REQUEST | _DATABASE_CLOCK
    }


@lru_cache(maxsize=2)
def _insert_fields(leased: bool) -> list[Field[Any, Any]]:
    return [
        field
        for field in IdempotencyRecord._meta.concrete_fields
        if not field.primary_key and not (leased and field.name == "lease_until")
    ]


@lru_cache(maxsize=2)
def _claim_sql(leased: bool) -> str:
    fields = _insert_fields(leased)
    columns = [_column(field.name) for field in fields]
    values = [
        "STATEMENT_TIMESTAMP()" if field.name in _DATABASE_CLOCK else "%s" for field in fields
    ]
    if leased:
        columns.append(_column("lease_until"))
        values.append("STATEMENT_TIMESTAMP() + %s")
    table, pk = _quoted(IdempotencyRecord._meta.db_table), _column("id")
    scope, key, lease_until = _column("scope"), _column("idem_key"), _column("lease_until")
    created_at = _column("created_at")
    existing = ", ".join(
        f"existing.{_quoted(field.column)}" for field in IdempotencyRecord._meta.concrete_fields
    )
    return f"""
        WITH previous AS MATERIALIZED (
            SELECT current_setting('lock_timeout') AS lock_timeout
        ), bounded AS MATERIALIZED (
            SELECT lock_timeout, set_config('lock_timeout', %s, true) FROM previous
        ), claimed AS (
            INSERT INTO {table} ({", ".join(columns)})
            SELECT {", ".join(values)} FROM bounded
            ON CONFLICT ({scope}, {key}) DO NOTHING
            RETURNING {pk}, {lease_until}, {created_at}
        )
        SELECT claimed.{pk}, claimed.{lease_until}, claimed.{created_at}, {existing},
            set_config('lock_timeout', bounded.lock_timeout, true)
        FROM bounded
        LEFT JOIN claimed ON TRUE
        LEFT JOIN {table} AS existing
            ON claimed.{pk} IS NULL AND existing.{scope} = %s AND existing.{key} = %s
    """


@lru_cache(maxsize=8)
def _finish_sql(names: tuple[str, ...], expires: bool) -> str:
    now = "STATEMENT_TIMESTAMP()"
    assignments = [f"{_column(name)} = %s" for name in names] + [
        f"{_column('lease_until')} = NULL",
        f"{_column('completed_at')} = {now}",
        f"{_column('updated_at')} = {now}",
        f"{_column('version')} = {_column('version')} + 1",
        f"{_column('expires_at')} = " + (f"{now} + %s" if expires else "NULL"),
    ]
    return (
        f"UPDATE {_quoted(IdempotencyRecord._meta.db_table)} SET {', '.join(assignments)} "
        f"WHERE {_column('id')} = %s AND {_column('owner_token')} = %s "
        f"AND {_column('status')} = %s"
    )


def _column(name: str) -> str:
    return _quoted(_field(name).column)


def _field(name: str) -> Field[Any, Any]:
    field = IdempotencyRecord._meta.get_field(name)
    assert isinstance(field, Field)
    return field


def _quoted(name: str | None) -> str:
    return f'"{name}"'  # PostgreSQL's quoting; the names are the model's own
