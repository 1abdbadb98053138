from __future__ import annotations

import time
from typing import Any

from django.db.models import QuerySet
from rest_framework import mixins, viewsets
from rest_framework.serializers import BaseSerializer

from example_project.reports.models import Report
from example_project.reports.serializers import ReportSerializer
from idempotency import Attempt, IdempotentCreateMixin


class ReportViewSet(
    IdempotentCreateMixin,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.ListModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """The caller's reports. `POST {"seconds": 0..30}` with an `Idempotency-Key` header.

    Generating takes `seconds`: too long to hold a transaction, so the view
    runs in lease mode. It renews its lease while it works; if the process
    dies, the resolver tells recovery whether the report was made.
    """

    serializer_class = ReportSerializer
    idempotency_operation = "reports.create"
    idempotency_mode = "lease"
    idempotency_lease_seconds = 10.0
    idempotency_resolver = "example_project.reports.resolvers.report_resolver"

    def get_queryset(self) -> QuerySet[Report]:
        return Report.objects.filter(owner_id=self.request.user.pk)

    def perform_create(self, serializer: BaseSerializer[Report]) -> None:
        attempt: Attempt = self.request.idempotency  # type: ignore[attr-defined]
        seconds = serializer.validated_data["seconds"]
        generate(attempt, seconds)
        serializer.save(
            owner=self.request.user,
            idempotency_scope=attempt.operation.scope,
            idempotency_key=attempt.operation.key,
        )

    def get_success_headers(self, data: Any) -> dict[str, str]:
        return {"Location": f"/api/reports/{data['id']}/"}


def generate(attempt: Attempt, seconds: float, renew_every: float = 2.0) -> None:
    """Simulated long work that keeps its lease alive (``LeaseLost`` if it was taken over)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, renew_every))
        attempt.renew()
