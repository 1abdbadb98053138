"""The admin's form asking the resource id of each record to mark succeeded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from idempotency.models import IdempotencyRecord


class ResourceIdsForm(forms.Form):
    """One optional resource id per selected record; blank keeps what is stored."""

    def __init__(self, *args: Any, records: Sequence[IdempotencyRecord], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records = list(records)
        for record in self.records:
            self.fields[self.field_name(record)] = forms.CharField(
                label=str(record),
                max_length=255,
                required=False,
                initial=record.resource_id,
                help_text=_("What the first run created, e.g. the order id."),
            )

    @staticmethod
    def field_name(record: IdempotencyRecord) -> str:
        return f"resource_id_{record.pk}"

    def rows(self) -> list[tuple[IdempotencyRecord, forms.BoundField]]:
        return [(record, self[self.field_name(record)]) for record in self.records]

    def resource_id(self, record: IdempotencyRecord) -> str | None:
        value = self.cleaned_data.get(self.field_name(record), "").strip()
        return value or None
