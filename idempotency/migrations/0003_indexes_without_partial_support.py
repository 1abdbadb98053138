"""The lease and expiry indexes become ``PartialIndex``: same partial indexes on PostgreSQL
and SQLite (nothing to rebuild there), a composite (status, lease_until) index instead of the
condition-less one 0001 left on MySQL and MariaDB.
"""

from django.db import migrations, models

import idempotency.indexes

OLD_LEASE_INDEX = models.Index(
    fields=["lease_until"], name="idempotency_lease_idx", condition=models.Q(status="PROCESSING")
)
NEW_LEASE_INDEX = idempotency.indexes.PartialIndex(
    fields=["lease_until"],
    where=models.Q(status="PROCESSING"),
    fallback_fields=["status", "lease_until"],
    name="idempotency_lease_idx",
)


def _swap(apps, schema_editor, old, new):
    # Where partial indexes exist, 0001 already built exactly the partial form.
    if schema_editor.connection.features.supports_partial_indexes:
        return
    model = apps.get_model("idempotency", "IdempotencyRecord")
    schema_editor.remove_index(model, old)
    schema_editor.add_index(model, new)


def rebuild_lease_index(apps, schema_editor):
    _swap(apps, schema_editor, OLD_LEASE_INDEX, NEW_LEASE_INDEX)


def restore_lease_index(apps, schema_editor):
    _swap(apps, schema_editor, NEW_LEASE_INDEX, OLD_LEASE_INDEX)


class Migration(migrations.Migration):

    dependencies = [
        ("idempotency", "0002_resolve_permission"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="idempotencyrecord", name="idempotency_lease_idx"),
                migrations.RemoveIndex(
                    model_name="idempotencyrecord", name="idempotency_expires_idx"
                ),
                migrations.AddIndex(model_name="idempotencyrecord", index=NEW_LEASE_INDEX),
                migrations.AddIndex(
                    model_name="idempotencyrecord",
                    index=idempotency.indexes.PartialIndex(
                        fields=["expires_at"],
                        where=models.Q(expires_at__isnull=False),
                        fallback_fields=["expires_at"],
                        name="idempotency_expires_idx",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunPython(rebuild_lease_index, restore_lease_index, elidable=False),
            ],
        ),
    ]
