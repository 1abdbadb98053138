"""The admin's actions: operators resolve the selected records through ``idempotency.resolution``.

Each action is refused per record with the reason when the state machine
forbids it, writes each change to the admin log, and needs the
``idempotency.resolve_idempotencyrecord`` permission.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from idempotency import recovery
from idempotency.admin_forms import ResourceIdsForm
from idempotency.models import IdempotencyRecord, Status

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
        "%(count)d record marked as succeeded: repeats now get its stored outcome.",
        "%(count)d records marked as succeeded: repeats now get their stored outcomes.",
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
        form = ResourceIdsForm(request.POST if "apply" in request.POST else None, records=records)
        if not form.is_valid():
            return self._resource_ids_page(request, form)
        selected = self._bounded(request, records)
        report = recovery.mark_records(selected, Status.SUCCEEDED, resource_ids=form.resource_id)
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

    def _resource_ids_page(self, request: HttpRequest, form: ResourceIdsForm) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Mark succeeded with a resource id"),
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
