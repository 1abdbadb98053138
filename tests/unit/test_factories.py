"""The factories build the states they are named for, as the model's queries see them."""

from __future__ import annotations

import pytest
from django.utils import timezone

from idempotency.models import IdempotencyRecord, Status
from tests.support.factories import IdempotencyRecordFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def records() -> dict[str, IdempotencyRecord]:
    traits = [
        "in_flight",
        "expired_lease",
        "succeeded",
        "failed_retryable",
        "failed_final",
        "needs_review",
        "expired",
    ]
    return {trait: IdempotencyRecordFactory(**{trait: True}) for trait in traits}


def names(queryset, records: dict[str, IdempotencyRecord]) -> set[str]:
    pks = set(queryset.values_list("pk", flat=True))
    return {name for name, record in records.items() if record.pk in pks}


def test_statuses(records):
    assert {name: record.status for name, record in records.items()} == {
        "in_flight": Status.PROCESSING,
        "expired_lease": Status.PROCESSING,
        "succeeded": Status.SUCCEEDED,
        "failed_retryable": Status.FAILED_RETRYABLE,
        "failed_final": Status.FAILED_FINAL,
        "needs_review": Status.NEEDS_REVIEW,
        "expired": Status.SUCCEEDED,
    }


def test_leases(records):
    now = timezone.now()
    assert records["in_flight"].lease_until > now
    assert records["expired_lease"].lease_until < now


def test_stored_responses(records):
    assert records["succeeded"].response_status == 201
    assert bytes(records["succeeded"].response_body).startswith(b"{")
    assert records["failed_final"].response_status == 402


def test_past_creation_time_is_stored(records):
    expired = IdempotencyRecord.objects.get(pk=records["expired"].pk)
    assert (timezone.now() - expired.created_at).days >= 2


def test_queries_see_the_scenarios(records):
    objects = IdempotencyRecord.objects
    assert names(objects.expired_leases(), records) == {"expired_lease"}
    assert names(objects.stuck(), records) == {"expired_lease", "needs_review"}
    assert names(objects.purgeable(), records) == {"expired"}


def test_keys_and_scopes_are_unique(records):
    pairs = {(record.scope, record.idem_key) for record in records.values()}
    assert len(pairs) == len(records)


def test_user_password():
    user = UserFactory()
    assert user.check_password("secret")
    assert UserFactory(username=user.username) == user
