"""idempotency.recovery: an operator's resolution (the admin's bulk actions) as a service."""

from __future__ import annotations

import pytest

from idempotency import ResolutionReport, mark_records, run_resolvers
from idempotency.models import IdempotencyRecord, Status
from idempotency.resolvers import Resolution
from tests.support.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db

RESOLVER = "tests.unit.test_recovery.resolved_done"


def resolved_done(record: IdempotencyRecord) -> Resolution:
    return Resolution.done("order-42")


def test_mark_records_moves_what_the_state_machine_allows_and_says_why_not_the_rest():
    stuck = IdempotencyRecordFactory(expired_lease=True)
    review = IdempotencyRecordFactory(needs_review=True)
    live = IdempotencyRecordFactory(in_flight=True)
    settled = IdempotencyRecordFactory(succeeded=True)
    ids = {stuck.pk: "order-1", review.pk: None}

    report = mark_records(
        [stuck, review, live, settled], Status.SUCCEEDED, resource_ids=lambda r: ids.get(r.pk)
    )

    assert isinstance(report, ResolutionReport)
    assert [(c.before.pk, c.after.status) for c in report.changes] == [
        (stuck.pk, Status.SUCCEEDED),
        (review.pk, Status.SUCCEEDED),
    ]
    assert report.changes[0].after.resource_id == "order-1"
    assert report.changes[1].after.resource_id == review.resource_id  # None keeps it
    assert "Resource id" in report.changes[0].describe()
    assert len(report.refused) == 2
    assert "lease is still live" in report.refused[0]
    assert f"a {settled.status} record cannot become SUCCEEDED" in report.refused[1]
    live.refresh_from_db()
    assert live.status == Status.PROCESSING


def test_run_resolvers_applies_each_answer_and_refuses_records_without_a_resolver(settings):
    settings.IDEMPOTENCY = {"RESOLVERS": {"tests.operation": RESOLVER}}
    stuck = IdempotencyRecordFactory(expired_lease=True)
    orphan = IdempotencyRecordFactory(expired_lease=True, operation="no.resolver")
    settled = IdempotencyRecordFactory(succeeded=True)

    report = run_resolvers([stuck, orphan, settled])

    (change,) = report.changes
    assert (change.before.status, change.after.status) == (Status.PROCESSING, Status.SUCCEEDED)
    assert change.after.resource_id == "order-42"
    assert report.outcomes == {"succeeded": 1}
    assert "no.resolver has no resolver" in report.refused[0]
    assert "only a PROCESSING record with an expired lease" in report.refused[1]
