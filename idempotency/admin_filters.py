"""The admin's filters of the records' list: stuck, by age (the database clock), by operation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import DurationField, QuerySet, Value
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _


def _ago(delta: timedelta) -> Any:
    return Now() - Value(delta, output_field=DurationField())


class StuckFilter(admin.SimpleListFilter):
    title = _("stuck state")
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Expired lease or needs review"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "yes":
            return queryset.stuck()  # type: ignore[attr-defined,no-any-return]
        return queryset


class AgeFilter(admin.SimpleListFilter):
    """Age by the database clock, like the lease checks."""

    title = _("age")
    parameter_name = "age"
    RANGES: dict[str, tuple[str, timedelta, Any]] = {
        "1h": ("lt", timedelta(hours=1), _("Less than an hour")),
        "1d": ("lt", timedelta(days=1), _("Less than a day")),
        "gt1h": ("gt", timedelta(hours=1), _("Older than an hour")),
        "gt1d": ("gt", timedelta(days=1), _("Older than a day")),
        "gt7d": ("gt", timedelta(days=7), _("Older than 7 days")),
        "gt30d": ("gt", timedelta(days=30), _("Older than 30 days")),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(value, label) for value, (_op, _delta, label) in self.RANGES.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() not in self.RANGES:
            return queryset
        younger_or_older, delta, _label = self.RANGES[str(self.value())]
        if younger_or_older == "lt":
            return queryset.filter(created_at__gt=_ago(delta))
        return queryset.filter(created_at__lte=_ago(delta))


class OperationFilter(admin.SimpleListFilter):
    title = _("operation")
    parameter_name = "operation"
    # A filter sidebar, not a report: beyond this, type ?operation=... in the URL.
    MAX_CHOICES = 100

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = (
            model_admin.get_queryset(request)
            .order_by("operation")
            .values_list("operation", flat=True)
            .distinct()[: self.MAX_CHOICES]
        )
        return [(name, name or gettext("(none)")) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() is None:
            return queryset
        return queryset.filter(operation=self.value())
