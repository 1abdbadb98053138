"""After a lost lease: did the report get made? Look for it by the request's key."""

from __future__ import annotations

from rest_framework.renderers import JSONRenderer

from example_project.reports.models import Report
from example_project.reports.serializers import ReportSerializer
from idempotency import IdempotencyRecord, Resolution, StoredResponse


def report_resolver(record: IdempotencyRecord) -> Resolution:
    report = Report.objects.filter(
        idempotency_scope=record.scope, idempotency_key=record.idem_key
    ).first()
    if report is None:
        # Reports are made in one INSERT at the end of the work: no row, no effect.
        return Resolution.not_done()
    return Resolution.done(report.pk, response=created_response(report))


def created_response(report: Report) -> StoredResponse:
    """What the view would have answered, for the client's retry to receive."""
    body = JSONRenderer().render(ReportSerializer(report).data)
    headers = [("Content-Type", "application/json"), ("Location", f"/api/reports/{report.pk}/")]
    return StoredResponse(status=201, headers=headers, body=body)
