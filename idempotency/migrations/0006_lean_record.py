"""A lean record before the schema freezes: binary digests, two indexes fewer.

- ``request_hash`` keeps the first 128 bits of the fingerprint as 16 bytes, where it
  kept SHA-256's 64 hexadecimal characters; ``owner_token`` its 16 random bytes,
  where it kept 32 characters. Existing values are converted, not dropped: a record
  made before keeps answering its retries (a fingerprint compares by the first 128
  bits of the same digest), and an attempt in flight keeps its fence.
- ``idempotency_created_idx`` and ``idempotency_unexpiring_idx`` go: the admin lists
  newest first by the primary key, ``purge --older-than`` reads along it, and the
  admin's stuck filter reads ``expires_at IS NULL`` from ``idempotency_expires_idx``,
  which becomes a full index (it was partial, ``expires_at IS NOT NULL``, on
  PostgreSQL and SQLite; MySQL and MariaDB had the full index already).

How each database converts the table: ``idempotency.stores.digests``; what it costs
a table of 10^7 records: docs/performance.md. Backwards, the digests become
hexadecimal text again, 32 characters of the 64 the fingerprint had: a retry of a
record made before, after the rollback, is answered ``422``.
"""

from django.db import migrations, models

import idempotency.indexes
import idempotency.models
from idempotency.stores.digests import digests_to_bytes, digests_to_text, is_postgres
from idempotency.stores.step_cascade import add_cascade_lost_with_the_table

CREATED = models.Index(fields=["created_at"], name="idempotency_created_idx")
UNEXPIRING = idempotency.indexes.PartialIndex(
    fields=["created_at"],
    where=models.Q(expires_at__isnull=True),
    fallback_fields=["expires_at", "created_at"],
    name="idempotency_unexpiring_idx",
)
PARTIAL_EXPIRES = idempotency.indexes.PartialIndex(
    fields=["expires_at"],
    where=models.Q(expires_at__isnull=False),
    fallback_fields=["expires_at"],
    name="idempotency_expires_idx",
)
FULL_EXPIRES = models.Index(fields=["expires_at"], name="idempotency_expires_idx")


def forwards(apps, schema_editor):
    model = apps.get_model("idempotency", "IdempotencyRecord")
    if is_postgres(schema_editor):
        # The indexes that go, first: the rewrite rebuilds every index left.
        _drop_created_indexes(schema_editor, model)
        digests_to_bytes(schema_editor, model, idempotency.models.DigestField())
    else:
        # Then: SQLite's remade table gets the indexes of the model as it was.
        digests_to_bytes(schema_editor, model, idempotency.models.DigestField())
        _drop_created_indexes(schema_editor, model)
    if schema_editor.connection.features.supports_partial_indexes:
        schema_editor.remove_index(model, PARTIAL_EXPIRES)
        schema_editor.add_index(model, FULL_EXPIRES)
    add_cascade_lost_with_the_table(apps, schema_editor)


def backwards(apps, schema_editor):
    model = apps.get_model("idempotency", "IdempotencyRecord")
    digests_to_text(schema_editor, model)
    if schema_editor.connection.features.supports_partial_indexes:
        schema_editor.remove_index(model, FULL_EXPIRES)
        schema_editor.add_index(model, PARTIAL_EXPIRES)
    schema_editor.add_index(model, CREATED)
    schema_editor.add_index(model, UNEXPIRING)
    add_cascade_lost_with_the_table(apps, schema_editor)


def _drop_created_indexes(schema_editor, model):
    schema_editor.remove_index(model, CREATED)
    schema_editor.remove_index(model, UNEXPIRING)


class Migration(migrations.Migration):
    dependencies = [
        ("idempotency", "0005_steps"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(
                    model_name="idempotencyrecord", name="idempotency_created_idx"
                ),
                migrations.RemoveIndex(
                    model_name="idempotencyrecord", name="idempotency_unexpiring_idx"
                ),
                migrations.RemoveIndex(
                    model_name="idempotencyrecord", name="idempotency_expires_idx"
                ),
                migrations.AddIndex(model_name="idempotencyrecord", index=FULL_EXPIRES),
                migrations.AlterField(
                    model_name="idempotencyrecord",
                    name="request_hash",
                    field=idempotency.models.DigestField(
                        help_text="The first 128 bits of the request's SHA-256 fingerprint.",
                        verbose_name="request hash",
                    ),
                ),
                migrations.AlterField(
                    model_name="idempotencyrecord",
                    name="owner_token",
                    field=idempotency.models.DigestField(
                        help_text="Random token of the attempt holding the record; fences its writes.",
                        verbose_name="owner token",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunPython(forwards, backwards, elidable=False),
            ],
        ),
    ]
