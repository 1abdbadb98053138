"""Retention: delete finished records once their window has passed, in bounded batches.

``expires_at`` is set when a record reaches a final state (``retention_for``:
``RETENTION`` per status, ``OPERATION_RETENTION`` per operation). Purge deletes
rows whose ``expires_at`` has passed, reading them through the partial index
on ``expires_at``, so its cost grows with the rows it deletes, not with the
table. ``PROCESSING`` and ``NEEDS_REVIEW`` records are never purged.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from idempotency import replay_cache, signals
from idempotency.conf import idempotency_settings
from idempotency.models import PURGEABLE, IdempotencyRecord, IdempotencyRecordQuerySet
from idempotency.progress import Meter, OnProgress
from idempotency.shards import Shard, in_every_shard
from idempotency.stores import records_database, store_for


def purge(
    batch_size: int | None = None,
    older_than: timedelta | None = None,
    statuses: Iterable[str] | None = None,
    scope: str | None = None,
    dry_run: bool = False,
    progress: OnProgress | None = None,
    database: str | None = None,
) -> int:
    """Delete expired records; returns how many (with ``dry_run``, how many would go).

    - ``older_than``: instead of each record's retention window, take the
      finished records created more than this long ago.
    - ``statuses``: only these (``SUCCEEDED``, ``FAILED_FINAL``, ``FAILED_RETRYABLE``).
    - ``scope``: only this scope; a trailing ``*`` matches a prefix (``user:42:*``).
    - ``progress(Progress)`` is called after each batch that deleted rows
      (``idempotency.progress``: batches, records so far, of how many, time).
    - ``database``: that alias (``idempotency.fanout.purge_everywhere`` visits
      every one that holds records).

    Each batch of ``batch_size`` (``PURGE_BATCH_SIZE``) rows is its own short
    transaction; rows locked by a running request are skipped.
    """
    size = batch_size or idempotency_settings.PURGE_BATCH_SIZE
    if size < 1:
        raise ValueError("batch_size should be a positive integer.")
    database = records_database(database)
    candidates = purgeable(database, older_than=older_than, statuses=statuses, scope=scope)
    if dry_run:
        deleted = candidates.count()
    else:
        deleted = _delete_in_batches(database, candidates, size, Meter(progress))
    signals.records_purged.send(IdempotencyRecord, count=deleted, dry_run=dry_run)
    return deleted


def purgeable(
    database: str | None = None,
    *,
    older_than: timedelta | None = None,
    statuses: Iterable[str] | None = None,
    scope: str | None = None,
) -> IdempotencyRecordQuerySet:
    """The records purge would take, oldest first, in an order an index serves."""
    chosen = _statuses(statuses)
    records = IdempotencyRecord.objects.using(records_database(database))
    if older_than is None:
        # The partial index idempotency_expires_idx (expires_at IS NOT NULL) serves this.
        records = records.filter(
            expires_at__isnull=False, expires_at__lt=Now(), status__in=chosen
        ).order_by("expires_at")
    else:
        # The index idempotency_created_idx (created_at) serves this.
        records = records.filter(status__in=chosen, created_at__lt=Now() - older_than).order_by(
            "created_at"
        )
    if scope:
        records = (
            records.filter(scope__startswith=scope[:-1])
            if scope.endswith("*")
            else records.filter(scope=scope)
        )
    return records


def batch(records: IdempotencyRecordQuerySet, size: int) -> IdempotencyRecordQuerySet:
    """One batch to delete: locked, skipping rows a request holds (must run in a transaction)."""
    return records.select_for_update(skip_locked=True)[:size]


def _delete_in_batches(
    database: str,
    candidates: IdempotencyRecordQuerySet,
    size: int,
    meter: Meter,
) -> int:
    if meter.callback is not None:
        meter.total = candidates.count()
    ordering = str(candidates.query.order_by[0])  # expires_at, or created_at with older_than
    deleted = 0
    floor = None  # where the last batch ended, in purge order
    while True:
        # Start each batch where the last one ended: the index scan then steps over
        # none of the entries the earlier batches left dead (they would make each batch
        # slower than the one before until vacuum). Rows skipped as locked wait for the next pass.
        chosen = candidates if floor is None else candidates.filter(**{f"{ordering}__gte": floor})
        with transaction.atomic(using=database):
            if idempotency_settings.REPLAY_CACHE is None:
                # One statement where the store can: no list of ids goes back and forth.
                count, floor = store_for(database).delete_batch(batch(chosen, size), ordering)
            else:
                count, floor = _delete_and_forget(database, batch(chosen, size), ordering)
        deleted += count
        if count:
            meter.batch(deleted)
        if count < size:
            return deleted


def _delete_and_forget(
    database: str, picked: IdempotencyRecordQuerySet, ordering: str
) -> tuple[int, Any]:
    """With a replay cache: lock the batch reading its keys, delete it, forget the keys."""
    rows = list(picked.values_list("pk", "scope", "idem_key", ordering))
    IdempotencyRecord.objects.using(database).filter(pk__in=[row[0] for row in rows]).delete()
    replay_cache.forget([(row[1], row[2]) for row in rows], database, tombstone=False)
    return len(rows), max((row[3] for row in rows), default=None)


def _statuses(statuses: Iterable[str] | None) -> list[str]:
    if statuses is None:
        return [str(status) for status in PURGEABLE]
    chosen = [str(status).upper() for status in statuses]
    refused = sorted(set(chosen) - {str(status) for status in PURGEABLE})
    if refused:
        allowed = ", ".join(str(status) for status in PURGEABLE)
        raise ValueError(
            f"Cannot purge {', '.join(refused)} records: only {allowed} records are purged "
            "(PROCESSING and NEEDS_REVIEW records are never purged)."
        )
    return chosen


def purge_everywhere(
    database: str | None = None, progress: OnProgress | None = None, **options: Any
) -> list[tuple[Shard, int]]:
    """``purge`` in every shard (``shards(database)``): how many each lost.

    ``progress`` gets each shard's ``Progress``, with the shard's label where there are several.
    """
    return in_every_shard(purge, database, progress, options)
