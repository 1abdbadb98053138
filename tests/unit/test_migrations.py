"""Migration guard: the model and its migrations agree."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from idempotency.fingerprint import digest_of
from idempotency.models import IdempotencyRecord
from idempotency.stores import store_for

LEASE = timedelta(minutes=1)


@pytest.mark.django_db
def test_no_pending_migrations_for_idempotency():
    out = StringIO()
    try:
        call_command("makemigrations", "idempotency", "--check", "--dry-run", stdout=out)
    except SystemExit:  # --check exits non-zero when a migration would be written
        pytest.fail(f"idempotency has model changes without a migration:\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()


# A record a preview wrote (0005): SHA-256's hexadecimal fingerprint, a 32-character token.
PREVIEW_HASH = hashlib.sha256(b"a preview's request").hexdigest()
PREVIEW_TOKEN = secrets.token_hex(16)


@pytest.mark.django_db(transaction=True)
def test_0006_converts_a_previews_records_and_back():
    """A record made before keeps answering its retries: its fingerprint's first 128 bits
    are what a repeat's request_hash is now, and its attempt keeps its fence."""
    executor = MigrationExecutor(connection)
    executor.migrate([("idempotency", "0005_steps")])
    try:
        preview = executor.loader.project_state(("idempotency", "0005_steps")).apps
        old = preview.get_model("idempotency", "IdempotencyRecord").objects.create(
            scope="user:1:orders.create",
            idem_key="k-1",
            request_hash=PREVIEW_HASH,
            owner_token=PREVIEW_TOKEN,
            lease_until=timezone.now(),
        )
        executor.loader.build_graph()
        executor.migrate([("idempotency", "0006_lean_record")])
        record = IdempotencyRecord.objects.get(pk=old.pk)
        assert record.request_hash == digest_of(PREVIEW_HASH) == bytes.fromhex(PREVIEW_HASH[:32])
        assert record.owner_token == bytes.fromhex(PREVIEW_TOKEN)
        assert store_for("default").renew(record.pk, bytes.fromhex(PREVIEW_TOKEN), LEASE)

        executor.loader.build_graph()
        executor.migrate([("idempotency", "0005_steps")])
        back = preview.get_model("idempotency", "IdempotencyRecord").objects.get(pk=old.pk)
        assert (back.request_hash, back.owner_token) == (PREVIEW_HASH[:32], PREVIEW_TOKEN)
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes("idempotency"))
        IdempotencyRecord.objects.all().delete()
