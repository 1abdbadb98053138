"""Migration guard: the model and its migrations agree."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_pending_migrations_for_idempotency():
    out = StringIO()
    try:
        call_command("makemigrations", "idempotency", "--check", "--dry-run", stdout=out)
    except SystemExit:  # --check exits non-zero when a migration would be written
        pytest.fail(f"idempotency has model changes without a migration:\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()
