"""The example project's ``create_operator``: a staff user who may resolve, not a superuser."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from tests.support.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db


def create_operator(*args: str) -> str:
    out = StringIO()
    call_command("create_operator", *args, "--no-input", stdout=out)
    return out.getvalue()


def test_creates_a_staff_operator_who_can_resolve(monkeypatch):
    monkeypatch.setenv("OPERATOR_PASSWORD", "s3cret-pw")
    assert "Created operator 'oncall'" in create_operator("oncall", "--email", "o@example.com")
    user = get_user_model().objects.get(username="oncall")
    assert user.is_staff and not user.is_superuser and user.check_password("s3cret-pw")
    assert user.has_perm("idempotency.view_idempotencyrecord")
    assert user.has_perm("idempotency.resolve_idempotencyrecord")
    assert not user.has_perm("idempotency.delete_idempotencyrecord")
    assert not user.has_perm("auth.change_user")

    client = Client()
    assert client.login(username="oncall", password="s3cret-pw")
    record = IdempotencyRecordFactory(needs_review=True)
    changelist = reverse("admin:idempotency_idempotencyrecord_changelist")
    client.post(changelist, {"action": "mark_final_failure", "_selected_action": [record.pk]})
    record.refresh_from_db()
    assert record.status == "FAILED_FINAL"


def test_running_again_updates_and_can_grant_delete(monkeypatch):
    monkeypatch.setenv("OPERATOR_PASSWORD", "first")
    create_operator("oncall")
    monkeypatch.setenv("OPERATOR_PASSWORD", "second")
    assert "Updated operator" in create_operator("oncall", "--can-delete")
    user = get_user_model().objects.get(username="oncall")
    assert user.check_password("second")
    assert user.has_perm("idempotency.delete_idempotencyrecord")


def test_no_input_needs_the_password_variable(monkeypatch):
    monkeypatch.delenv("OPERATOR_PASSWORD", raising=False)
    with pytest.raises(CommandError, match="OPERATOR_PASSWORD"):
        create_operator("oncall")
    assert not get_user_model().objects.filter(username="oncall").exists()
