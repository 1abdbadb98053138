"""The operators' screen: find stuck records and resolve them through the state machine.

Records are evidence, so nothing here edits a field: every change is an action
that makes a move of the record's state machine (``idempotency.protocol.states``,
optimistic and fenced) or asks the operation's resolver, is refused with the reason
when the state machine forbids it, and is written to the admin log. Actions need the
``idempotency.resolve_idempotencyrecord`` permission; viewing needs the view
(or change) permission. Deleting is left to Django's delete permission, and only
for records that are settled: a ``PROCESSING`` or ``NEEDS_REVIEW`` record must be
resolved, never deleted (its first run may have had its effect).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import suppress
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth import get_permission_codename
from django.db.models import DurationField, QuerySet, Value
from django.db.models.functions import Now
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from idempotency import recovery, replay_cache
from idempotency.models import IdempotencyRecord, IdempotencyStep, Status
from idempotency.outcomes import StoredResponse
from idempotency.stores import records_database, store_for

# --- the resolution form ----------------------------------------------------------------


class MarkSucceededForm(forms.Form):
    """Per selected record: what the first run created, and what repeats of its key get.

    A replay never runs the view, so the operator gives the answer the client
    expects (the status, and the body: the created resource as the view renders it);
    without a body repeats get that status with an empty body. A blank resource id
    keeps the stored one. Each field is prefilled from what the record stores.
    """

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
            self.fields[f"status_{record.pk}"] = forms.IntegerField(
                label=_("status"),
                min_value=200,
                max_value=299,
                required=False,
                initial=recovery.stored_status(record),
                help_text=_("The status repeats get (2xx)."),
            )
            self.fields[f"content_type_{record.pk}"] = forms.CharField(
                label=_("content type"),
                max_length=255,
                required=False,
                initial=recovery.stored_content_type(record) or recovery.JSON,
                help_text=_("Sent with a body; blank: application/json."),
            )
            self.fields[f"body_{record.pk}"] = forms.CharField(
                label=_("body"),
                required=False,
                strip=False,
                widget=forms.Textarea(attrs={"rows": 3, "cols": 40}),
                initial=recovery.stored_text(record),
                help_text=_("The body repeats get, e.g. the created resource's JSON."),
            )

    @staticmethod
    def field_name(record: IdempotencyRecord) -> str:
        return f"resource_id_{record.pk}"

    def rows(self) -> list[tuple[IdempotencyRecord, list[forms.BoundField]]]:
        return [
            (record, [self[f"{kind}_{record.pk}"] for kind in ("resource_id", *_ANSWER_FIELDS)])
            for record in self.records
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        self.responses: dict[int, StoredResponse] = {}
        for record in self.records:
            try:
                self.responses[record.pk] = recovery.operator_response(
                    record,
                    status=cleaned.get(f"status_{record.pk}"),
                    body=cleaned.get(f"body_{record.pk}") or "",
                    content_type=cleaned.get(f"content_type_{record.pk}") or "",
                )
            except ValueError as error:
                self.add_error(f"body_{record.pk}", str(error))
        return cleaned

    def resource_id(self, record: IdempotencyRecord) -> str | None:
        value = self.cleaned_data.get(self.field_name(record), "").strip()
        return value or None

    def response(self, record: IdempotencyRecord) -> StoredResponse:
        """What repeats of ``record``'s key get, as the operator gave it."""
        return self.responses[record.pk]


# The fields of the answer repeats get, beside the resource id, in the form's columns.
_ANSWER_FIELDS = ("status", "content_type", "body")


# --- list filters -------------------------------------------------------------------------


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


# --- actions that resolve stuck records ------------------------------------------------------

# One admin request resolves at most this many records; past an incident's first
# handful, ``manage.py idempotency_recover`` is the tool.
ACTION_LIMIT = 500
# Records one "mark succeeded" form asks resource ids for.
FORM_LIMIT = 100
# Refused records named one by one in the refusal message.
REFUSALS_SHOWN = 10

# The success message of an action, by how many records it changed.
Done = Callable[[int], str]
Records = QuerySet[IdempotencyRecord]


def _released(n: int) -> str:
    return ngettext(
        "%(count)d record released for retry: the client's next request with "
        "its key runs the work again.",
        "%(count)d records released for retry: the clients' next requests with "
        "their keys run the work again.",
        n,
    )


def _marked_final(n: int) -> str:
    return ngettext(
        "%(count)d record marked as a final failure.",
        "%(count)d records marked as final failures.",
        n,
    )


def _marked_succeeded(n: int) -> str:
    return ngettext(
        "%(count)d record marked as succeeded: repeats of its key now get the status and "
        "body given, as replays.",
        "%(count)d records marked as succeeded: repeats of their keys now get the statuses "
        "and bodies given, as replays.",
        n,
    )


if TYPE_CHECKING:
    ActionsBase = admin.ModelAdmin[IdempotencyRecord]
else:  # a mixin of ModelAdmin, typed as one
    ActionsBase = object


class ResolveActions(ActionsBase):
    """The resolving actions of the records' ModelAdmin."""

    actions = ("release_for_retry", "mark_succeeded", "mark_final_failure", "run_resolver")

    # -- actions

    @admin.action(permissions=["resolve"], description=_("Release for retry (FAILED_RETRYABLE)"))
    def release_for_retry(self, request: HttpRequest, queryset: Records) -> None:
        self._mark(request, queryset, Status.FAILED_RETRYABLE, _released)

    @admin.action(permissions=["resolve"], description=_("Mark final failure (FAILED_FINAL)"))
    def mark_final_failure(self, request: HttpRequest, queryset: Records) -> None:
        self._mark(request, queryset, Status.FAILED_FINAL, _marked_final)

    @admin.action(
        permissions=["resolve"], description=_("Mark succeeded with a resource id (SUCCEEDED)")
    )
    def mark_succeeded(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> TemplateResponse | None:
        records = list(queryset[: FORM_LIMIT + 1])
        if len(records) > FORM_LIMIT:
            self.message_user(
                request,
                gettext("Select at most %(limit)d records to mark succeeded.")
                % {"limit": FORM_LIMIT},
                messages.ERROR,
            )
            return None
        form = MarkSucceededForm(request.POST if "apply" in request.POST else None, records=records)
        if not form.is_valid():
            return self._resource_ids_page(request, form)
        selected = self._bounded(request, records)
        report = recovery.mark_records(
            selected, Status.SUCCEEDED, resource_ids=form.resource_id, responses=form.response
        )
        self._report(request, report, _marked_succeeded)
        return None

    @admin.action(permissions=["resolve"], description=_("Run the operation's resolver now"))
    def run_resolver(self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]) -> None:
        report = recovery.run_resolvers(self._bounded(request, queryset))
        for change in report.changes:
            self.log_change(
                request,
                change.after,
                gettext("Ran the resolver: %(outcome)s (%(before)s → %(after)s).")
                % {
                    "outcome": change.outcome,
                    "before": change.before.status,
                    "after": change.after.status,
                },
            )
        if report.changes:
            summary = ", ".join(f"{outcome}: {n}" for outcome, n in sorted(report.outcomes.items()))
            count = len(report.changes)
            self.message_user(
                request,
                ngettext(
                    "The resolver ran for %(count)d record (%(summary)s).",
                    "The resolver ran for %(count)d records (%(summary)s).",
                    count,
                )
                % {"count": count, "summary": summary},
                messages.SUCCESS,
            )
        self._report_refused(request, report.refused)

    # -- the shared machinery of the actions

    def _mark(self, request: HttpRequest, records: Records, status: Status, done: Done) -> None:
        self._report(request, recovery.mark_records(self._bounded(request, records), status), done)

    def _report(self, request: HttpRequest, report: recovery.ResolutionReport, done: Done) -> None:
        for change in report.changes:
            self.log_change(request, change.after, change.describe())
        if changed := len(report.changes):
            self.message_user(request, done(changed) % {"count": changed}, messages.SUCCESS)
        elif not report.refused:
            self.message_user(
                request,
                gettext("No record was changed: the selection no longer matches the list."),
                messages.WARNING,
            )
        self._report_refused(request, report.refused)

    def _bounded(
        self,
        request: HttpRequest,
        records: QuerySet[IdempotencyRecord] | Sequence[IdempotencyRecord],
    ) -> list[IdempotencyRecord]:
        selected = list(records[: ACTION_LIMIT + 1])
        if len(selected) > ACTION_LIMIT:
            self.message_user(
                request,
                gettext(
                    "Only the first %(limit)d records were processed; run the action again "
                    "or use manage.py idempotency_recover for the rest."
                )
                % {"limit": ACTION_LIMIT},
                messages.WARNING,
            )
        return selected[:ACTION_LIMIT]

    def _report_refused(self, request: HttpRequest, refused: list[str]) -> None:
        if not refused:
            return
        shown = "; ".join(refused[:REFUSALS_SHOWN])
        if len(refused) > REFUSALS_SHOWN:
            shown += "; …"
        self.message_user(
            request,
            ngettext(
                "%(count)d record was not changed: %(reasons)s",
                "%(count)d records were not changed: %(reasons)s",
                len(refused),
            )
            % {"count": len(refused), "reasons": shown},
            messages.ERROR,
        )

    def _resource_ids_page(self, request: HttpRequest, form: MarkSucceededForm) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Mark succeeded: what repeats of the key get"),
            "opts": self.opts,
            "form": form,
            "action_name": "mark_succeeded",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        return TemplateResponse(
            request,
            "admin/idempotency/idempotencyrecord/mark_succeeded.html",
            context,
        )


# --- the records' admin ---------------------------------------------------------------------
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
    # Newest first along the primary key (ids grow with created_at): no index of
    # created_at for every create to write. No date hierarchy either: its first
    # query would read created_at across the whole table (docs/performance.md).
    ordering = ("-pk",)
    list_per_page = 50
    # A second COUNT(*) of the whole table on every filtered page: not during an incident.
    show_full_result_count = False
    change_form_template = "admin/idempotency/idempotencyrecord/change_form.html"

    fieldsets = (
        (None, {"fields": ("scope", "idem_key", "operation", "status", "resource_id")}),
        (_("Request"), {"fields": ("request_method", "request_path", "request_fingerprint")}),
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
                    "owner",
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
        self.delete_queryset(
            request, IdempotencyRecord.objects.using(obj._state.db).filter(pk=obj.pk)
        )

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        records = list(queryset.only("scope", "idem_key"))
        # The store deletes them with their steps (the records' one writer).
        store_for(queryset.db).delete_records([record.pk for record in records])
        replay_cache.forget_records(records)  # a deleted record is never replayed from the cache

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

    @admin.display(description=_("request hash"))
    def request_fingerprint(self, record: IdempotencyRecord) -> str:
        return _hexadecimal(record.request_hash)

    @admin.display(description=_("owner token"))
    def owner(self, record: IdempotencyRecord) -> str:
        return _hexadecimal(record.owner_token)

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
        content_type = recovery.stored_content_type(record)
        text = readable_body(record.response_body, content_type)
        return format_html('<pre class="idempotency-body">{}</pre>', text)

    @admin.display(description=_("steps recorded"))
    def steps_display(self, record: IdempotencyRecord) -> str:
        # The current request's rows only (a replacement deletes an earlier request's;
        # an earlier release left them until the new request's first step).
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


def _hexadecimal(digest: bytes | memoryview | None) -> str:
    """A digest as a person reads and searches logs for it."""
    return "-" if not digest else bytes(digest).hex()
