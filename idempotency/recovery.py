"""Recovery: records whose lease expired, and records an operator resolves, in every shard.

A lost lease is never re-run blindly: the first attempt may have had its
effect. The resolver looks at the business facts; its answer moves the record
(``states.recover``: ``SUCCEEDED``, ``FAILED_RETRYABLE``, or after
``MAX_RESOLVE_ATTEMPTS`` unknown answers ``NEEDS_REVIEW``). ``recover_expired``
is one pass over a database, ``recover_everywhere`` over every database and
schema that holds records (the beat task and ``idempotency_recover``), and
``mark_records`` and ``run_resolvers`` are an operator's resolution (the
admin's actions, the command's ``--mark`` and ``--resolve``). Every change goes
through the record's state machine (``idempotency.protocol.states``), optimistic
and fenced; what it will not move is refused with the reason, never forced.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from idempotency.conf import idempotency_settings
from idempotency.exceptions import IdempotencyError, TransitionNotAllowed
from idempotency.models import IdempotencyRecord, IdempotencyRecordQuerySet, Status
from idempotency.outcomes import Recovered, StoredResponse
from idempotency.progress import Meter, OnProgress
from idempotency.protocol.states import (
    can_transition,
    recover,
    recovery_outcome,
    transition,
)
from idempotency.resolvers import ask, resolver_for
from idempotency.shards import Shard, in_every_shard
from idempotency.stores import records_database


@dataclass
class RecoveryReport:
    """Counts of one recovery pass; with ``dry_run``, what the pass would have done."""

    dry_run: bool = False
    succeeded: int = 0
    released: int = 0
    needs_review: int = 0
    unknown: int = 0
    skipped: int = 0

    @property
    def examined(self) -> int:
        return self.succeeded + self.released + self.needs_review + self.unknown + self.skipped

    def add(self, outcome: Recovered) -> None:
        setattr(self, outcome.value, getattr(self, outcome.value) + 1)

    def as_dict(self) -> dict[str, int | bool]:
        return {**asdict(self), "examined": self.examined}

    def outcomes(self) -> dict[str, int]:
        """How many records each outcome took so far (``skipped`` only where there were some)."""
        shown = [outcome for outcome in Recovered if outcome != Recovered.SKIPPED or self.skipped]
        return {outcome.value: getattr(self, outcome.value) for outcome in shown}


def resolve_record(record: IdempotencyRecord) -> Recovered:
    """Ask ``record``'s resolver now and apply the answer; returns what happened.

    Works on a ``PROCESSING`` record whose lease expired and on a
    ``NEEDS_REVIEW`` record (an operator asking again). Anything else, or a
    record another worker holds right now, is ``"skipped"``.
    """
    database = records_database(record=record)
    with transaction.atomic(using=database):
        locked = (
            _eligible(IdempotencyRecord.objects.using(database))
            .select_for_update(skip_locked=True)
            .filter(pk=record.pk)
            .first()
        )
        if locked is None:
            return Recovered.SKIPPED
        outcome, _ = recover(locked, resolver_for(locked.operation))
    return outcome


def recover_expired(
    batch_size: int | None = None,
    dry_run: bool = False,
    database: str | None = None,
    progress: OnProgress | None = None,
) -> RecoveryReport:
    """One recovery pass over every record whose lease has expired, in bounded batches.

    Each batch is one short transaction that locks its rows with
    ``SKIP LOCKED``: several workers can run this at once and never handle the
    same record. With ``dry_run`` the resolvers are asked (they only read) but
    nothing is written. ``database``: that alias (``recover_everywhere``
    visits every one that holds records). ``progress(Progress)`` is called after
    each batch that found records, with the outcomes so far in ``counts``.
    """
    size = batch_size or idempotency_settings.RECOVERY_BATCH_SIZE
    if size < 1:
        raise ValueError("batch_size should be a positive integer.")
    database = records_database(database)
    report = RecoveryReport(dry_run=dry_run)
    meter = Meter(progress)
    after: IdempotencyRecord | None = None
    while True:
        with transaction.atomic(using=database):
            batch = expired_batch(database, after=after, size=size, lock=not dry_run)
            for record in batch:
                report.add(_recover_one(record, dry_run=dry_run))
        if batch:
            meter.batch(report.examined, report.outcomes())
        if len(batch) < size:
            return report
        after = batch[-1]


def recover_everywhere(
    database: str | None = None, progress: OnProgress | None = None, **options: Any
) -> list[tuple[Shard, RecoveryReport]]:
    """``recover_expired`` in every shard (``shards(database)``): each one's report.

    ``progress`` gets each shard's ``Progress``, with the shard's label where there are several.
    """
    return in_every_shard(recover_expired, database, progress, options)


def total(reports: Iterable[RecoveryReport], dry_run: bool = False) -> RecoveryReport:
    """The reports of several shards added up."""
    summed = RecoveryReport(dry_run=dry_run)
    for report in reports:
        for outcome in Recovered:
            name = outcome.value
            setattr(summed, name, getattr(summed, name) + getattr(report, name))
    return summed


def _recover_one(record: IdempotencyRecord, *, dry_run: bool) -> Recovered:
    resolver = resolver_for(record.operation)
    if dry_run:
        return recovery_outcome(record, ask(resolver, record) if resolver is not None else None)
    try:
        outcome, _ = recover(record, resolver)
    except TransitionNotAllowed:
        # The first attempt finished (or renewed) between our read and our write.
        return Recovered.SKIPPED
    return outcome


def expired_batch(
    database: str, *, after: IdempotencyRecord | None, size: int, lock: bool
) -> list[IdempotencyRecord]:
    """The next expired leases after ``after``, oldest first; skips rows another worker holds.

    Read through the partial index ``idempotency_leased_idx`` (rows holding a lease only).
    """
    records = IdempotencyRecord.objects.using(database).expired_leases()
    if after is not None:
        # A cursor, so that rows this pass left as they were are not read again.
        records = records.filter(
            Q(lease_until__gt=after.lease_until) | Q(lease_until=after.lease_until, pk__gt=after.pk)
        )
    if lock:
        records = records.select_for_update(skip_locked=True)
    return list(records.order_by("lease_until", "pk")[:size])


def _eligible(records: IdempotencyRecordQuerySet) -> IdempotencyRecordQuerySet:
    return records.expired_leases() | records.filter(status=Status.NEEDS_REVIEW)


# --- an operator's resolution ---------------------------------------------------------

NOT_RESOLVABLE = _(
    "only a PROCESSING record with an expired lease or a NEEDS_REVIEW record can be "
    "resolved, and not while another worker holds it."
)
ResourceIds = Callable[[IdempotencyRecord], "str | None"]
Responses = Callable[[IdempotencyRecord], "StoredResponse | None"]


@dataclass(frozen=True)
class Change:
    """One record moved: as it was, as it is now, and the resolver's outcome if one ran."""

    before: IdempotencyRecord
    after: IdempotencyRecord
    outcome: Recovered | None = None
    # What the operator gave repeats to get, if anything (``mark_records(responses=...)``).
    response: StoredResponse | None = None

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
        # Said from what the operator gave, not read back: a record listed by the admin
        # leaves its body unread (deferred), and reading it now could ask a replica.
        if self.response is not None:
            message += " " + gettext("Repeats get status %(status)s, %(size)d bytes.") % {
                "status": self.response.status,
                "size": len(self.response.body or b""),
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
    responses: Responses | None = None,
) -> ResolutionReport:
    """Move each record to ``target`` (``SUCCEEDED``, ``FAILED_RETRYABLE``, ``FAILED_FINAL``).

    ``resource_ids(record)`` gives what the first run created (``None`` keeps
    what is stored): with ``SUCCEEDED``, repeats then get the stored outcome.
    ``responses(record)`` gives that outcome: what repeats are answered (``None``
    keeps what is stored; with none stored, an empty ``200``).
    """
    report = ResolutionReport()
    for record in records:
        resource_id = resource_ids(record) if resource_ids else None
        response = responses(record) if responses else None
        try:
            updated = _transition(record, target, resource_id, response)
        except TransitionNotAllowed as error:
            report.refused.append(f"{record}: {error.detail}")
            continue
        report.changes.append(Change(record, updated, response=response))
    return report


JSON = "application/json"


def operator_response(
    record: IdempotencyRecord,
    *,
    status: int | None = None,
    body: str | None = None,
    content_type: str | None = None,
) -> StoredResponse:
    """What repeats of ``record``'s key get, as an operator gives it (``mark_records``).

    A replay never runs the view, so the operator gives the answer a client
    expects: a 2xx status and a body (the created resource as the view renders
    it). ``None`` keeps what the record stores (without a stored success, a
    POST's 201, else 200); a blank content type is JSON. A task's or function's repeats
    return the body's JSON, so there, as under a JSON content type, the body must
    be JSON. Raises ``ValueError`` saying what is wrong, for the operator.
    """
    status = status or stored_status(record)
    if not 200 <= status <= 299:
        raise ValueError(gettext("Not a 2xx status: %d.") % status)
    text = stored_text(record) if body is None else body
    if content_type is None:
        content_type = stored_content_type(record)
    content_type = content_type.strip() or JSON
    raw = text.encode()
    if len(raw) > idempotency_settings.MAX_RESPONSE_BYTES:
        raise ValueError(gettext("Larger than MAX_RESPONSE_BYTES."))
    if text.strip() and (is_json(content_type) or not record.request_method):
        try:
            json.loads(text)
        except ValueError as error:
            raise ValueError(gettext("Not JSON: %(error)s.") % {"error": error}) from None
    headers = [("Content-Type", content_type)] if raw else []
    # b"", not None: None is a body too large to store, replayed as "omitted".
    return StoredResponse(status=status, headers=headers, body=raw)


def stored_status(record: IdempotencyRecord) -> int:
    """The stored status if it is a success; else (a lost attempt) a POST's 201, else 200."""
    if record.response_status and 200 <= record.response_status <= 299:
        return record.response_status
    return 201 if record.request_method.upper() == "POST" else 200


def stored_content_type(record: IdempotencyRecord) -> str:
    for pair in record.response_headers or ():
        if len(pair) == 2 and str(pair[0]).lower() == "content-type":
            return str(pair[1])
    return ""


def stored_text(record: IdempotencyRecord) -> str:
    """The stored body as text; a body that is not UTF-8 text, as none."""
    try:
        return bytes(record.response_body or b"").decode()
    except UnicodeDecodeError:
        return ""


def is_json(content_type: str) -> bool:
    media_type = content_type.split(";")[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def _transition(
    record: IdempotencyRecord,
    target: Status,
    resource_id: str | None,
    response: StoredResponse | None = None,
) -> IdempotencyRecord:
    if not can_transition(record, target):
        raise TransitionNotAllowed(
            gettext("a %(status)s record cannot become %(target)s: %(rule)s")
            % {"status": record.status, "target": target, "rule": NOT_RESOLVABLE}
        )
    return transition(
        record, target, resource_id=resource_id, response=response, using=record._state.db
    )


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


def _resolved(record: IdempotencyRecord) -> Recovered:
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
    if outcome == Recovered.SKIPPED:
        raise TransitionNotAllowed(str(NOT_RESOLVABLE))
    return outcome
