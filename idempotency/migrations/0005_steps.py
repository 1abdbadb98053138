"""The steps of calls to other idempotent APIs (``idempotency.steps``), deleted with their record.

The database deletes a record's steps with it: a foreign key ``ON DELETE CASCADE``
on MySQL and MariaDB, a trigger after each delete of a record on SQLite (which cannot
add a constraint to a table), and on PostgreSQL the store's own statements, which
delete a record's steps in the statement that deletes the record (a foreign key
there checks every deleted record on its own: the purge took four times as long). A later migration that makes SQLite rebuild the records
table drops the trigger with it, and must call ``add_cascade`` again
(``idempotency.stores.step_cascade``, where the vendors' statements live).
"""

import django.db.models.deletion
from django.db import migrations, models

from idempotency.stores.step_cascade import add_cascade, drop_cascade


class Migration(migrations.Migration):
    dependencies = [
        ("idempotency", "0004_indexes_a_finish_leaves_alone"),
    ]

    operations = [
        migrations.CreateModel(
            name="IdempotencyStep",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "request_started",
                    models.DateTimeField(
                        help_text="The record's created_at when this row was written.",
                        verbose_name="request started",
                    ),
                ),
                ("name", models.CharField(blank=True, max_length=255, verbose_name="step")),
                (
                    "position",
                    models.PositiveIntegerField(blank=True, null=True, verbose_name="position"),
                ),
                ("step_key", models.CharField(blank=True, max_length=80, verbose_name="step key")),
                ("seed", models.CharField(blank=True, max_length=64, verbose_name="seed")),
                (
                    "result",
                    models.TextField(blank=True, verbose_name="recorded result (JSON)"),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True, verbose_name="created at")),
                (
                    "record",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="steps",
                        to="idempotency.idempotencyrecord",
                        verbose_name="record",
                    ),
                ),
            ],
            options={
                "verbose_name": "idempotency step",
                "verbose_name_plural": "idempotency steps",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("record", "step_key"), name="idempotency_step_uniq"
                    )
                ],
            },
        ),
        # Not in a transaction of its own: MySQL and MariaDB refuse DDL inside one.
        migrations.RunPython(add_cascade, drop_cascade, atomic=False),
    ]
