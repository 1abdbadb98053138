"""The operators' screen: find stuck records and resolve them through the state machine.

Records are evidence, so nothing here edits a field: every change is an action
that calls ``transitions.transition`` (optimistic and fenced, like the protocol)
or the operation's resolver, is refused with the reason when the state machine
forbids it, and is written to the admin log. Actions need the
``idempotency.resolve_idempotencyrecord`` permission; viewing needs the view
(or change) permission. Deleting is left to Django's delete permission, and only
for records that are settled: a ``PROCESSING`` or ``NEEDS_REVIEW`` record must be
resolved, never deleted (its first run may have had its effect).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.auth import get_permission_codename
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from idempotency import replay_cache
from idempotency.admin_actions import ResolveActions
from idempotency.admin_filters import AgeFilter, OperationFilter, StuckFilter
from idempotency.models import IdempotencyRecord, IdempotencyStep, Status
from idempotency.stores import records_database

# Statuses a person must resolve; deleting them would invite a blind re-run.
UNDELETABLE = frozenset({Status.PROCESSING, Status.NEEDS_REVIEW})
# Characters of a stored body shown on the detail page.
BODY_DISPLAY_LIMIT = 20_000


def readable_body(body: bytes | memoryview | None, content_type: str = "") -> str:
    """The stored body as text: pretty JSON when it is JSON, bounded in length."""
    if body is None:
        return ""
    raw = bytes(body)
    text = raw.decode("utf-8", errors="replace")
    if "json" in content_type.lower() or raw.lstrip()[:1] in (b"{", b"["):
        # Not JSON after all: show the text as stored.
        with suppress(ValueError):
            text = json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    if len(text) > BODY_DISPLAY_LIMIT:
        hidden = len(text) - BODY_DISPLAY_LIMIT
        text = (
            text[:BODY_DISPLAY_LIMIT] + "\n" + gettext("… (%(n)d more characters)") % {"n": hidden}
        )
    return text


def _header(headers: Iterable[Sequence[str]], name: str) -> str:
    for pair in headers or ():
        if len(pair) == 2 and str(pair[0]).lower() == name.lower():
            return str(pair[1])
    return ""


if TYPE_CHECKING:
    RecordAdminBase = admin.ModelAdmin[IdempotencyRecord]
else:  # ModelAdmin is generic for the type checker only
    RecordAdminBase = admin.ModelAdmin


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ResolveActions, RecordAdminBase):
    list_display = (
        "scope",
        "idem_key",
        "status",
        "response_status",
        "attempts",
        "lease_end",
        "age",
    )
    list_display_links = ("idem_key",)
    list_filter = ("status", StuckFilter, OperationFilter, AgeFilter)
    # Exact key and resource id (served by the unique index for a known scope),
    # scope by prefix ("user:42:" finds every operation of user 42).
    search_fields = ("=idem_key", "^scope", "=resource_id")
    search_help_text = _(
        "Exact key or resource id, or the start of a scope. Quote a scope or resource id "
        "that has spaces (keys never do)."
    )
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    list_per_page = 50
    # A second COUNT(*) of the whole table on every filtered page: not during an incident.
    show_full_result_count = False
    change_form_template = "admin/idempotency/idempotencyrecord/change_form.html"

    fieldsets = (
        (None, {"fields": ("scope", "idem_key", "operation", "status", "resource_id")}),
        (_("Request"), {"fields": ("request_method", "request_path", "request_hash")}),
        (
            _("Response replayed to repeats"),
            {"fields": ("response_status", "response_headers_display", "response_body_display")},
        ),
        (
            _("Lease and attempts"),
            {
                "fields": (
                    "lease_state",
                    "lease_until",
                    "owner_token",
                    "attempts",
                    "recovery_attempts",
                    "version",
                )
            },
        ),
        # Calls to other idempotent APIs (idempotency.steps): what a later attempt reuses.
        (_("Steps"), {"fields": ("steps_display",)}),
        (
            _("Timeline"),
            {"fields": ("created_at", "updated_at", "completed_at", "expires_at")},
        ),
    )
    readonly_fields = tuple(
        name for _title, options in fieldsets for name in cast(Sequence[str], options["fields"])
    )

    # -- permissions: view, resolve, delete what is settled; never add or edit

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Records are evidence: the detail page is view-only, whoever looks.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # One settled record at a time, from its page: without an object this is the
        # changelist's bulk delete, which would take PROCESSING rows too (purge is the
        # bulk tool), so Django leaves that action out.
        if obj is None or obj.status in UNDELETABLE:
            return False
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: IdempotencyRecord) -> None:
        super().delete_model(request, obj)
        replay_cache.forget_records([obj])  # a deleted record is never replayed from the cache

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        records = list(queryset.only("scope", "idem_key"))
        super().delete_queryset(request, queryset)
        replay_cache.forget_records(records)

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        codename = get_permission_codename("resolve", opts)
        return request.user.has_perm(f"{opts.app_label}.{codename}")

    def get_queryset(self, request: HttpRequest) -> QuerySet[IdempotencyRecord]:
        # From the records' database, where writes go: never a replica a router reads
        # from, whose lag would show a finished record as stuck and act on it.
        # Bodies can be large: the detail page loads them on demand.
        records = super().get_queryset(request).using(records_database())
        return records.defer("response_body")

    # -- columns and readable fields

    @admin.display(description=_("lease end"), ordering="lease_until")
    def lease_end(self, record: IdempotencyRecord) -> str:
        if record.lease_until is None:
            return "-"
        stamp = timezone.localtime(record.lease_until).strftime("%Y-%m-%d %H:%M:%S")
        if record.status == Status.PROCESSING and record.lease_until < timezone.now():
            return gettext("%(stamp)s (expired)") % {"stamp": stamp}
        return stamp

    @admin.display(description=_("age"), ordering="-created_at")
    def age(self, record: IdempotencyRecord) -> str:
        return timesince(record.created_at) if record.created_at else "-"

    @admin.display(description=_("lease"))
    def lease_state(self, record: IdempotencyRecord) -> str:
        if record.status != Status.PROCESSING:
            return gettext("none (not in flight)")
        if record.lease_until is None:
            return gettext("none (atomic mode: held by the request's transaction)")
        if record.lease_until < timezone.now():
            return gettext("expired %(ago)s ago: the worker is presumed dead") % {
                "ago": timesince(record.lease_until)
            }
        return gettext("live for %(left)s more") % {
            "left": timesince(timezone.now(), record.lease_until)
        }

    @admin.display(description=_("response headers"))
    def response_headers_display(self, record: IdempotencyRecord) -> str:
        lines = "\n".join(f"{name}: {value}" for name, value in record.response_headers or ())
        return format_html("<pre>{}</pre>", lines) if lines else "-"

    @admin.display(description=_("response body"))
    def response_body_display(self, record: IdempotencyRecord) -> str:
        if record.response_body is None:
            return "-"
        content_type = _header(record.response_headers, "Content-Type")
        text = readable_body(record.response_body, content_type)
        return format_html('<pre class="idempotency-body">{}</pre>', text)

    @admin.display(description=_("steps recorded"))
    def steps_display(self, record: IdempotencyRecord) -> str:
        # The current request's rows only: an earlier request under a replaced record
        # left rows its replacement deletes on its first step.
        rows = (
            IdempotencyStep.objects.using(record._state.db or records_database())
            .filter(record_id=record.pk, request_started=record.created_at)
            .exclude(step_key="")
            .order_by("created_at", "pk")
        )
        lines = [
            f"{step} {step.step_key} at {timezone.localtime(step.created_at):%Y-%m-%d %H:%M:%S}"
            f"\n    {readable_body((step.result or '').encode())}"
            for step in rows
        ]
        if not lines:
            return gettext("none recorded")
        return format_html('<pre class="idempotency-steps">{}</pre>', "\n".join(lines))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        context = {
            **(extra_context or {}),
            "resolve_actions": self._detail_actions(request),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return super().change_view(request, object_id, form_url, extra_context=context)

    def _detail_actions(self, request: HttpRequest) -> list[tuple[str, str]]:
        if not self.has_resolve_permission(request):
            return []
        return [
            (name, str(description))
            for name, description in self.get_action_choices(request, default_choices=[])
        ]
