"""Operators' resolution of stuck records, one record or many at a time.

What the admin's actions do, usable as well from a management command, a
Celery task or a shell: every change goes through the state machine
(``transitions.transition``, optimistic and fenced) or through the
operation's resolver (``recovery.resolve_record``). A record the state
machine will not move is refused with the reason, never forced; the caller
decides how to report (the admin logs each change and shows the refusals).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from idempotency.exceptions import IdempotencyError, TransitionNotAllowed
from idempotency.models import IdempotencyRecord, Status
from idempotency.recovery import SKIPPED, resolve_record
from idempotency.resolvers import resolver_for
from idempotency.stores import records_database
from idempotency.transitions import can_transition, transition

NOT_RESOLVABLE = _(
    "only a PROCESSING record with an expired lease or a NEEDS_REVIEW record can be "
    "resolved, and not while another worker holds it."
)
ResourceIds = Callable[[IdempotencyRecord], "str | None"]


@dataclass(frozen=True)
class Change:
    """One record moved: as it was, as it is now, and the resolver's outcome if one ran."""

    before: IdempotencyRecord
    after: IdempotencyRecord
    outcome: str = ""

    def describe(self) -> str:
        """The change in a sentence, for an audit log."""
        before, after = self.before, self.after
        message = gettext("Status %(before)s → %(after)s.") % {
            "before": before.status,
            "after": after.status,
        }
        if after.resource_id != before.resource_id:
            message += " " + gettext("Resource id %(old)r → %(new)r.") % {
                "old": before.resource_id,
                "new": after.resource_id,
            }
        return message


@dataclass
class ResolutionReport:
    """What one resolution did: the records changed and, for the others, why not."""

    changes: list[Change] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    @property
    def outcomes(self) -> Counter[str]:
        """How many records each resolver outcome settled (``run_resolvers``)."""
        return Counter(change.outcome for change in self.changes if change.outcome)


def mark_records(
    records: Iterable[IdempotencyRecord],
    target: Status,
    *,
    resource_ids: ResourceIds | None = None,
) -> ResolutionReport:
    """Move each record to ``target`` (``SUCCEEDED``, ``FAILED_RETRYABLE``, ``FAILED_FINAL``).

    ``resource_ids(record)`` gives what the first run created (``None`` keeps
    what is stored): with ``SUCCEEDED``, repeats then get the stored outcome.
    """
    report = ResolutionReport()
    for record in records:
        resource_id = resource_ids(record) if resource_ids else None
        try:
            updated = _transition(record, target, resource_id)
        except TransitionNotAllowed as error:
            report.refused.append(f"{record}: {error.detail}")
            continue
        report.changes.append(Change(record, updated))
    return report


def _transition(
    record: IdempotencyRecord, target: Status, resource_id: str | None
) -> IdempotencyRecord:
    if not can_transition(record, target):
        raise TransitionNotAllowed(
            gettext("a %(status)s record cannot become %(target)s: %(rule)s")
            % {"status": record.status, "target": target, "rule": NOT_RESOLVABLE}
        )
    return transition(record, target, resource_id=resource_id, using=record._state.db)


def run_resolvers(records: Iterable[IdempotencyRecord]) -> ResolutionReport:
    """Ask each record's resolver now and apply its answer (``recovery.resolve_record``)."""
    report = ResolutionReport()
    for record in records:
        try:
            outcome = _resolved(record)
        except IdempotencyError as error:
            report.refused.append(f"{record}: {error.detail}")
            continue
        after = IdempotencyRecord.objects.using(records_database(record=record)).get(pk=record.pk)
        report.changes.append(Change(record, after, outcome))
    return report


def _resolved(record: IdempotencyRecord) -> str:
    if resolver_for(record.operation) is None:
        raise TransitionNotAllowed(
            gettext(
                "operation %(operation)s has no resolver. Give it one where it is "
                "declared: resolver= on @idempotent or @idempotent_function, "
                "idempotency_resolver= on a DRF view or an IdempotentTask; or set "
                "IDEMPOTENCY['RESOLVERS'][%(operation_repr)s]; or settle the record "
                "with another action."
            )
            % {"operation": record.operation, "operation_repr": repr(record.operation)}
        )
    outcome = resolve_record(record)
    if outcome == SKIPPED:
        raise TransitionNotAllowed(str(NOT_RESOLVABLE))
    return outcome
