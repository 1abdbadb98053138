"""Recovery: settle ``PROCESSING`` records whose lease expired, by asking their resolver.

A lost lease is never re-run blindly: the first attempt may have had its
effect. The resolver looks at the business facts; its answer moves the record
through ``transitions`` (``SUCCEEDED``, ``FAILED_RETRYABLE``, or after
``MAX_RESOLVE_ATTEMPTS`` unknown answers ``NEEDS_REVIEW``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.db import transaction
from django.db.models import Q

from idempotency import signals
from idempotency.conf import idempotency_settings
from idempotency.exceptions import TransitionNotAllowed
from idempotency.models import IdempotencyRecord, IdempotencyRecordQuerySet, Status
from idempotency.progress import Meter, OnProgress
from idempotency.resolvers import Resolution, Resolver, ask, resolver_for
from idempotency.stores import records_database
from idempotency.transitions import postpone, transition

# What happened to a record (the ``outcome`` of ``signals.record_recovered``).
SUCCEEDED = "succeeded"
RELEASED = "released"
NEEDS_REVIEW = "needs_review"
UNKNOWN = "unknown"
SKIPPED = "skipped"


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

    def add(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)

    def as_dict(self) -> dict[str, int | bool]:
        return {**asdict(self), "examined": self.examined}

    def outcomes(self) -> dict[str, int]:
        """How many records each outcome took so far (``skipped`` only where there were some)."""
        counts = {
            name: getattr(self, name) for name in (SUCCEEDED, RELEASED, NEEDS_REVIEW, UNKNOWN)
        }
        return {**counts, SKIPPED: self.skipped} if self.skipped else counts


def resolve_record(record: IdempotencyRecord) -> str:
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
            return SKIPPED
        outcome, _ = settle(locked, resolver_for(locked.operation))
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
    nothing is written. ``database``: that alias (``idempotency.fanout.recover_everywhere``
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


def settle(record: IdempotencyRecord, resolver: Resolver | None) -> tuple[str, IdempotencyRecord]:
    """Apply ``resolver``'s answer to ``record``, which the caller has locked.

    Returns what happened and the record as it is now.
    """
    resolution = ask(resolver, record) if resolver is not None else None
    outcome = decide(record, resolution)
    updated = _apply(record, outcome, resolution)
    # idempotency/logs.py logs this signal.
    signals.record_recovered.send(
        IdempotencyRecord, record=updated, operation=record.operation, outcome=outcome
    )
    return outcome, updated


def decide(record: IdempotencyRecord, resolution: Resolution | None) -> str:
    """What a resolver's answer (``None``: there is no resolver) does to ``record``."""
    if resolution is None:
        if record.status == Status.NEEDS_REVIEW:
            return UNKNOWN
        return RELEASED if idempotency_settings.RELEASE_EXPIRED_WITHOUT_RESOLVER else NEEDS_REVIEW
    if resolution.answer == "done":
        return SUCCEEDED
    if resolution.answer == "not_done":
        return RELEASED
    if record.status == Status.PROCESSING and (
        record.recovery_attempts + 1 >= idempotency_settings.MAX_RESOLVE_ATTEMPTS
    ):
        return NEEDS_REVIEW
    return UNKNOWN


def _apply(
    record: IdempotencyRecord, outcome: str, resolution: Resolution | None
) -> IdempotencyRecord:
    # The caller locked ``record`` on the records' database: its writes go there too.
    database = record._state.db
    if outcome == SUCCEEDED:
        assert resolution is not None
        return transition(
            record,
            Status.SUCCEEDED,
            resource_id=resolution.resource_id,
            response=resolution.response,
            using=database,
            recovery_attempt=True,
        )
    if outcome == RELEASED:
        return transition(record, Status.FAILED_RETRYABLE, using=database, recovery_attempt=True)
    if outcome == NEEDS_REVIEW:
        return transition(record, Status.NEEDS_REVIEW, using=database, recovery_attempt=True)
    if record.status == Status.PROCESSING:
        # Unknown: look again after a pause rather than at every request or pass.
        return postpone(record, idempotency_settings.RESOLVE_RETRY_SECONDS, using=database)
    return record


def _recover_one(record: IdempotencyRecord, *, dry_run: bool) -> str:
    resolver = resolver_for(record.operation)
    if dry_run:
        return decide(record, ask(resolver, record) if resolver is not None else None)
    try:
        outcome, _ = settle(record, resolver)
    except TransitionNotAllowed:
        # The first attempt finished (or renewed) between our read and our write.
        return SKIPPED
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
