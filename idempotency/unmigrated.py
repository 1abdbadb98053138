"""A records table that ``manage.py migrate idempotency`` has not made, or not finished.

Not an outage: no retry brings the table. A protected call that meets it is a
server error that says what to run (``not_migrated``), and a database system
check reports it before the first request does (``idempotency.checks``).
"""

from __future__ import annotations

import logging

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from idempotency.models import IdempotencyRecord
from idempotency.shards import Shard, shards
from idempotency.stores.errors import is_schema_error

logger = logging.getLogger("idempotency")

APP = "idempotency"
TABLE = IdempotencyRecord._meta.db_table
COMMAND = "manage.py migrate idempotency"


def missing(alias: str) -> str | None:
    """What ``migrate idempotency`` has yet to do on ``alias``'s current schema; ``None``: nothing.

    Asks the database: Django's migration executor for the app's migrations
    not applied there, then the table itself (a migration recorded but its
    table dropped, or faked).
    """
    connection = connections[alias]
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes(APP))
    unapplied = [migration.name for migration, _ in plan if migration.app_label == APP]
    if unapplied:
        return f"migrations not applied: {', '.join(unapplied)}"
    tables = connection.introspection.table_names()
    return None if TABLE in tables else f"table {TABLE} missing"


def missing_per_shard(alias: str) -> dict[Shard, str]:
    """``missing`` on each shard of ``alias`` (each tenant's schema under django-tenants)."""
    found: dict[Shard, str] = {}
    for shard in shards(alias):
        with shard.active():
            what = missing(alias)
        if what is not None:
            found[shard] = what
    return found


def not_migrated(error: BaseException, alias: str) -> ImproperlyConfigured | None:
    """``error``, a missing table or column, as the records' schema not migrated; else ``None``.

    ``None`` for the view's own tables. Logged here, once, with what to run:
    the server error that follows says it too.
    """
    if not is_schema_error(error):
        return None
    try:
        what = missing(alias)
    except DatabaseError:
        # The connection cannot say (a transaction the error aborted): the error can.
        what = f"the database says: {error}" if TABLE in str(error) else None
    if what is None:
        return None
    logger.error(
        "idempotency not_migrated database=%s %s: run `%s --database %s`",
        *(alias, what, COMMAND, alias),
        extra={"event": "idempotency.not_migrated", "database": alias},
    )
    return ImproperlyConfigured(
        f"The idempotency records table of DATABASES[{alias!r}] is not migrated ({what}): "
        f"run `{COMMAND} --database {alias}`."
    )
