"""The indexes an atomic-mode finish leaves alone, built online.

Recovery's index holds the rows with a lease (``lease_until IS NOT NULL``)
instead of the ``PROCESSING`` ones, and ``(status, created_at)`` becomes
``(created_at)``, and the records nothing expires get an index of their own
(``created_at WHERE expires_at IS NULL``, for the admin's stuck filter): no
index reads ``status`` any more, so PostgreSQL can apply the finish in place
(a HOT update). On PostgreSQL each new index is built with
``CREATE INDEX CONCURRENTLY`` before the old one is dropped the same way: the
table takes writes throughout, and the migration runs outside a transaction.
Run again after an interruption, it rebuilds what it had left unfinished.
Where the caller already holds a transaction (django-tenants migrating a new
tenant's schema from a ``TenantMixin.save()`` inside ``transaction.atomic()``,
or ``get_or_create``), PostgreSQL refuses ``CONCURRENTLY``: there the indexes
are built plainly, on a table no other session can see yet. On
MySQL and MariaDB the lease index keeps its columns and is only renamed.
"""

from django.db import migrations, models

import idempotency.indexes

OLD_LEASE = idempotency.indexes.PartialIndex(
    fields=["lease_until"],
    where=models.Q(status="PROCESSING"),
    fallback_fields=["status", "lease_until"],
    name="idempotency_lease_idx",
)
NEW_LEASE = idempotency.indexes.PartialIndex(
    fields=["lease_until"],
    where=models.Q(lease_until__isnull=False),
    fallback_fields=["status", "lease_until"],
    name="idempotency_leased_idx",
)
OLD_STATUS = models.Index(fields=["status", "created_at"], name="idempotency_status_idx")
NEW_CREATED = models.Index(fields=["created_at"], name="idempotency_created_idx")
UNEXPIRING = idempotency.indexes.PartialIndex(
    fields=["created_at"],
    where=models.Q(expires_at__isnull=True),
    fallback_fields=["expires_at", "created_at"],
    name="idempotency_unexpiring_idx",
)


def _replace(schema_editor, model, old, new):
    """``new`` in place of ``old`` (either may be ``None``: only added, only removed)."""
    concurrently = hasattr(schema_editor, "sql_create_index_concurrently")  # PostgreSQL's
    if not concurrently or schema_editor.connection.in_atomic_block:
        if new is not None:
            schema_editor.add_index(model, new)
        if old is not None:
            schema_editor.remove_index(model, old)
        return
    if new is not None:
        # Its DROP INDEX says IF EXISTS: first, what an interrupted CREATE INDEX
        # CONCURRENTLY left behind (an invalid index) goes.
        schema_editor.remove_index(model, new, concurrently=True)
        schema_editor.add_index(model, new, concurrently=True)
    if old is not None:
        schema_editor.remove_index(model, old, concurrently=True)


def _swap(apps, schema_editor, pairs):
    model = apps.get_model("idempotency", "IdempotencyRecord")
    for old, new in pairs:
        partial = schema_editor.connection.features.supports_partial_indexes
        if old is not None and new is not None and old.fields == new.fields and not partial:
            schema_editor.rename_index(model, old, new)  # the same columns, no condition
        else:
            _replace(schema_editor, model, old, new)


def forwards(apps, schema_editor):
    _swap(
        apps,
        schema_editor,
        [(OLD_LEASE, NEW_LEASE), (OLD_STATUS, NEW_CREATED), (None, UNEXPIRING)],
    )


def backwards(apps, schema_editor):
    _swap(
        apps,
        schema_editor,
        [(NEW_LEASE, OLD_LEASE), (NEW_CREATED, OLD_STATUS), (UNEXPIRING, None)],
    )


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("idempotency", "0003_indexes_without_partial_support"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(
                    model_name="idempotencyrecord", name="idempotency_lease_idx"
                ),
                migrations.RemoveIndex(
                    model_name="idempotencyrecord", name="idempotency_status_idx"
                ),
                migrations.AddIndex(model_name="idempotencyrecord", index=NEW_LEASE),
                migrations.AddIndex(model_name="idempotencyrecord", index=NEW_CREATED),
                migrations.AddIndex(model_name="idempotencyrecord", index=UNEXPIRING),
            ],
            database_operations=[
                migrations.RunPython(forwards, backwards, elidable=False),
            ],
        ),
    ]
