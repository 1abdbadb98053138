"""The database's cascade from a record to its steps (``IdempotencyStep``): migration 0005.

A foreign key ``ON DELETE CASCADE`` on MySQL and MariaDB; on SQLite, which cannot
add a constraint to an existing table, a trigger after each delete of a record.
The database, not the ORM, deletes the steps: an ORM cascade would add a query to
every discard. PostgreSQL has neither: its foreign key checks every deleted record
on its own (measured: the purge took four times as long, steps or none), so the
PostgreSQL store deletes a record's steps in the statement that deletes the record
(the purge's batch, the discard, an operator's delete). Any other database has
neither, and its store deletes the steps beside the record, in one transaction.
``add_cascade`` and ``drop_cascade`` take the migration's ``apps`` (or the app
registry) and a schema editor.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

# The vendors whose schema deletes a record's steps with it (``add_cascade``).
CASCADING_VENDORS = frozenset({"sqlite", "mysql"})


def cascades(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection``'s database deletes a record's steps when the record goes."""
    return connection.vendor in CASCADING_VENDORS


def _tables(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> tuple[str, str]:
    quote = schema_editor.quote_name
    records = apps.get_model("idempotency", "IdempotencyRecord")._meta.db_table
    step_table = apps.get_model("idempotency", "IdempotencyStep")._meta.db_table
    return quote(records), quote(step_table)


def add_cascade(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    records, step_table = _tables(apps, schema_editor)
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        schema_editor.execute(
            f"CREATE TRIGGER IF NOT EXISTS idempotency_step_cascade AFTER DELETE ON {records} "
            f"FOR EACH ROW BEGIN DELETE FROM {step_table} WHERE record_id = OLD.id; END"
        )
    elif vendor == "mysql":
        schema_editor.execute(
            f"ALTER TABLE {step_table} ADD CONSTRAINT idempotency_step_record_fk "
            f"FOREIGN KEY (record_id) REFERENCES {records} (id) ON DELETE CASCADE"
        )


def drop_cascade(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    records, step_table = _tables(apps, schema_editor)
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS idempotency_step_cascade")
    elif vendor == "mysql":
        schema_editor.execute(
            f"ALTER TABLE {step_table} DROP FOREIGN KEY idempotency_step_record_fk"
        )


def add_cascade_lost_with_the_table(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Put back SQLite's trigger after a migration remade the records table (which drops it)."""
    if schema_editor.connection.vendor == "sqlite":
        add_cascade(apps, schema_editor)
