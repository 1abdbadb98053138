"""The record's digests as bytes: migration 0006 converts an existing table.

``request_hash`` kept SHA-256's 64 hexadecimal characters and ``owner_token`` 32;
both become 16 bytes (``idempotency.models.DigestField``): the first 128 bits of
the same digest, so that a record made before still answers its retries, and an
attempt in flight keeps its fence. Each database in one pass over the table:

- PostgreSQL: one ``ALTER TABLE`` of both columns (``USING decode(...)``), which
  rewrites the table once, under an exclusive lock, inside the migration's
  transaction (an interruption leaves the table as it was);
- MySQL and MariaDB: two new columns, filled by one ``UPDATE``, then put in the old
  ones' place by one ``ALTER TABLE``;
- SQLite and any other database: the schema editor changes each column (SQLite
  remakes the table, copying each value as it was: its columns take any type),
  then each row's values are converted here; SQLite has no ``unhex()`` before 3.41.

Backwards, the digests become hexadecimal text again: the 32 characters of the 128
bits kept, not the 64 the fingerprint had.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

DIGESTS = ("request_hash", "owner_token")
HEX_DIGITS = 32  # of the 128 bits kept


def digests_to_bytes(schema_editor: BaseDatabaseSchemaEditor, model: Any, field: Any) -> None:
    """``model``'s digest columns as ``field`` (a ``DigestField``), their values converted."""
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        _alter_postgres(schema_editor, model, "bytea", f"decode(left({{}}, {HEX_DIGITS}), 'hex')")
    elif vendor == "mysql":
        _swap_mysql(schema_editor, model, "longblob", f"UNHEX(LEFT({{}}, {HEX_DIGITS}))")
    else:
        _alter_elsewhere(schema_editor, model, field, lambda text: bytes.fromhex(text[:HEX_DIGITS]))


def digests_to_text(schema_editor: BaseDatabaseSchemaEditor, model: Any) -> None:
    """Back: each digest column as the ``varchar(64)`` of hexadecimal text it was."""
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        _alter_postgres(schema_editor, model, "varchar(64)", "encode({}, 'hex')")
    elif vendor == "mysql":
        _swap_mysql(schema_editor, model, "varchar(64)", "LOWER(HEX({}))")
    else:
        _alter_elsewhere(schema_editor, model, models.CharField(max_length=64), bytes.hex)


def is_postgres(schema_editor: BaseDatabaseSchemaEditor) -> bool:
    return schema_editor.connection.vendor == "postgresql"


def _alter_postgres(
    schema_editor: BaseDatabaseSchemaEditor, model: Any, kind: str, using: str
) -> None:
    quote = schema_editor.quote_name
    changes = ", ".join(
        f"ALTER COLUMN {quote(name)} TYPE {kind} USING {using.format(quote(name))}"
        for name in DIGESTS
    )
    schema_editor.execute(f"ALTER TABLE {quote(model._meta.db_table)} {changes}")


def _swap_mysql(schema_editor: BaseDatabaseSchemaEditor, model: Any, kind: str, using: str) -> None:
    quote = schema_editor.quote_name
    table = quote(model._meta.db_table)
    new = {name: quote(f"{name}_converted") for name in DIGESTS}
    added = ", ".join(f"ADD COLUMN {new[name]} {kind} NULL" for name in DIGESTS)
    schema_editor.execute(f"ALTER TABLE {table} {added}")
    filled = ", ".join(f"{new[name]} = {using.format(quote(name))}" for name in DIGESTS)
    schema_editor.execute(f"UPDATE {table} SET {filled}")
    placed = ", ".join(
        f"DROP COLUMN {quote(name)}, CHANGE COLUMN {new[name]} {quote(name)} {kind} NOT NULL"
        for name in DIGESTS
    )
    schema_editor.execute(f"ALTER TABLE {table} {placed}")


def _alter_elsewhere(
    schema_editor: BaseDatabaseSchemaEditor, model: Any, field: Any, convert: Any
) -> None:
    for name in DIGESTS:
        new = field.clone()
        new.set_attributes_from_name(name)
        new.model = model
        schema_editor.alter_field(model, model._meta.get_field(name), new)
    quote = schema_editor.quote_name
    table, columns = quote(model._meta.db_table), [quote(name) for name in DIGESTS]
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SELECT id, {', '.join(columns)} FROM {table}")
        rows = cursor.fetchall()
        assignments = ", ".join(f"{column} = %s" for column in columns)
        cursor.executemany(
            f"UPDATE {table} SET {assignments} WHERE id = %s",
            [(*(convert(value) for value in values), pk) for pk, *values in rows],
        )
