"""Retention: delete finished records once their window has passed, in bounded batches.

``expires_at`` is set when a record reaches a final state (``retention_for``:
``RETENTION`` per status, ``OPERATION_RETENTION`` per operation). Purge deletes
rows whose ``expires_at`` has passed, reading them through the partial index
on ``expires_at``, so its cost grows with the rows it deletes, not with the
table. ``PROCESSING`` and ``NEEDS_REVIEW`` records are never purged.

Each batch is its own transaction, sized by time: ``BatchSizer`` grows or
shrinks it so that a batch lasts about ``PURGE_BATCH_SECONDS``, never more than
``PURGE_BATCH_SIZE`` rows. A large table is then purged in few, large batches
(a statement per batch costs little next to its rows), and a busy or slow
database still holds no batch's locks for long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Max, Min
from django.db.models.functions import Now
from django.utils import timezone

from idempotency import replay_cache, signals
from idempotency.conf import idempotency_settings
from idempotency.models import PURGEABLE, IdempotencyRecord, IdempotencyRecordQuerySet
from idempotency.progress import Meter, OnProgress
from idempotency.shards import Shard, in_every_shard
from idempotency.stores import records_database, store_for

logger = logging.getLogger("idempotency")


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
    - ``database``: that alias (``purge_everywhere`` visits
      every one that holds records).

    Each batch is its own short transaction, of at most ``batch_size``
    (``PURGE_BATCH_SIZE``) rows, sized to last about ``PURGE_BATCH_SECONDS``;
    rows locked by a running request are skipped.
    """
    size = batch_size or idempotency_settings.PURGE_BATCH_SIZE
    if size < 1:
        raise ValueError("batch_size should be a positive integer.")
    sizer = BatchSizer(idempotency_settings.PURGE_BATCH_SECONDS, size)
    database = records_database(database)
    candidates = purgeable(database, older_than=older_than, statuses=statuses, scope=scope)
    if dry_run:
        deleted = candidates.count()
    else:
        deleted = _delete_in_batches(database, candidates, sizer, Meter(progress))
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
        # The index idempotency_expires_idx serves this.
        records = records.filter(
            expires_at__isnull=False, expires_at__lt=Now(), status__in=chosen
        ).order_by("expires_at")
    else:
        # Along the primary key, oldest first, up to the first id made since the cut:
        # ids grow with created_at, so that range holds the rows older than the cut,
        # with no index of created_at for every create to write (docs/performance.md).
        # A replaced record keeps its id and gets a new created_at: the filter reads it.
        records = records.filter(status__in=chosen, created_at__lt=Now() - older_than)
        since = first_id_since(records.model.objects.using(records.db), older_than)
        if since is not None:
            records = records.filter(id__lt=since)
        records = records.order_by("id")
    if scope:
        records = (
            records.filter(scope__startswith=scope[:-1])
            if scope.endswith("*")
            else records.filter(scope=scope)
        )
    return records


# Rows each probe of ``first_id_since`` reads.
PROBE = 16


def first_id_since(records: IdempotencyRecordQuerySet, age: timedelta) -> int | None:
    """The lowest id of a record made less than ``age`` ago, by bisection of the primary key.

    About 25 reads of a few rows each on a table of 10^7: where an index of
    ``created_at`` would cost every create an entry to answer it. A record replaced
    by a new request keeps its id and gets a new ``created_at``: each probe reads
    ``PROBE`` rows and counts the range as old where any of them is, so that a
    replaced record among old ones does not end the range early. ``None`` when no
    record is that young.
    """
    cut = timezone.now() - age
    bounds = records.aggregate(low=Min("id"), high=Max("id"))
    low, high = bounds["low"], bounds["high"]
    if high is None or records.filter(id=high, created_at__lt=cut).exists():
        return None
    rows = records.order_by("id").values_list("id", "created_at")
    while low < high:  # below low: made before the cut; from high on: since
        middle = (low + high) // 2
        probe = list(rows.filter(id__gte=middle, id__lt=high)[:PROBE])
        old = [pk for pk, created in probe if created < cut]
        if not probe:
            high = middle
        elif old:
            low = max(old) + 1
        else:
            high = probe[0][0]
    return high


def batch(records: IdempotencyRecordQuerySet, size: int) -> IdempotencyRecordQuerySet:
    """One batch to delete: locked, skipping rows a request holds (must run in a transaction)."""
    return records.select_for_update(skip_locked=True)[:size]


class BatchSizer:
    """How many rows the next batch takes, so that each lasts about ``target`` seconds.

    The first batch is ``FIRST`` rows (or ``bound`` if smaller): nothing says yet
    how fast this database deletes, and 10,000 rows took 0.03 to 0.08 s on a busy
    2-core machine, while starting at 1,000 made a purge of 100,000 rows take
    1.5x as long (docs/retention.md). After each full batch the next one
    is what the last one's rate would delete in ``target`` seconds: at most twice
    as many rows (one fast batch, a cache's luck, should not make the next one
    huge), as few as the rate says when a batch ran long (a busy database gets
    short transactions at once), never more than ``bound`` nor fewer than one.
    """

    FIRST = 10_000
    GROWTH = 2

    def __init__(self, target: float, bound: int) -> None:
        if target <= 0:
            raise ValueError("PURGE_BATCH_SECONDS should be a positive number.")
        self.target, self.bound = target, bound
        self.size = min(self.FIRST, bound)

    def observe(self, rows: int, seconds: float) -> int:
        """A batch of ``rows`` took ``seconds``: the size of the next one."""
        if rows > 0:
            grown = self.size * self.GROWTH
            wanted = grown if seconds <= 0 else int(rows * self.target / seconds)
            self.size = max(1, min(self.bound, grown, wanted))
        return self.size


def _delete_in_batches(
    database: str,
    candidates: IdempotencyRecordQuerySet,
    sizer: BatchSizer,
    meter: Meter,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    if meter.callback is not None:
        meter.total = candidates.count()
    ordering = str(candidates.query.order_by[0])  # expires_at, or id with older_than
    deleted = 0
    floor = None  # where the last batch ended, in purge order
    while True:
        # Start each batch where the last one ended: the index scan then steps over
        # none of the entries the earlier batches left dead (they would make each batch
        # slower than the one before until vacuum). Rows skipped as locked wait for the next pass.
        chosen = candidates if floor is None else candidates.filter(**{f"{ordering}__gte": floor})
        size, began = sizer.size, clock()
        cached = idempotency_settings.REPLAY_CACHE is not None
        with transaction.atomic(using=database):
            count, floor, picked, keys = store_for(database).delete_batch(
                batch(chosen, size), ordering, keys=cached
            )
        if keys:
            # A purged record is never answered from the cache again.
            replay_cache.forget(keys, database, tombstone=False)
        # Timed to the commit's end: what other transactions wait for is the whole batch.
        sizer.observe(count, clock() - began)
        deleted += count
        if count:
            meter.batch(deleted)
        # Fewer chosen than asked: no more to take (held rows are skipped, not counted).
        # Fewer deleted than chosen is no end: rows changed under the batch stay.
        if picked < size:
            return deleted


def _statuses(statuses: Iterable[str] | None) -> list[str]:
    if statuses is None:
        return list(PURGEABLE)
    chosen = [str(status).upper() for status in statuses]
    refused = sorted(set(chosen) - {str(status) for status in PURGEABLE})
    if refused:
        allowed = ", ".join(PURGEABLE)
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


def purge_orphan_steps(
    batch_size: int | None = None,
    dry_run: bool = False,
    database: str | None = None,
    progress: OnProgress | None = None,
) -> int:
    """Delete steps whose record is gone, in batches of ``batch_size``; returns how many.

    A record's steps go with it whichever way it is deleted; only an earlier
    release (its purge with a replay cache) or a hand-made ``DELETE`` left such
    steps behind. Each batch is one short statement; with ``dry_run``, a count.
    """
    size = batch_size or idempotency_settings.PURGE_BATCH_SIZE
    if size < 1:
        raise ValueError("batch_size should be a positive integer.")
    store = store_for(records_database(database))
    if dry_run:
        return store.count_orphan_steps()
    meter, deleted = Meter(progress), 0
    while (count := store.delete_orphan_steps(size)) > 0:
        deleted += count
        meter.batch(deleted)
        if count < size:
            break
    return deleted


def purge_orphan_steps_everywhere(
    database: str | None = None, progress: OnProgress | None = None, **options: Any
) -> list[tuple[Shard, int]]:
    """``purge_orphan_steps`` in every shard: how many steps each lost."""
    return in_every_shard(purge_orphan_steps, database, progress, options)


def scheduled_purge(
    database: str | None = None,
    batch_size: int | None = None,
    progress: OnProgress | None = None,
) -> tuple[int, int]:
    """The purge a schedule runs (the Celery and ``django.tasks`` purge tasks, the scheduler).

    Every shard's expired records, then any step an earlier release left without
    its record (logged when there were some). Returns how many records and how
    many such steps went.
    """
    purged = purge_everywhere(database=database, batch_size=batch_size, progress=progress)
    orphans = purge_orphan_steps_everywhere(database=database, batch_size=batch_size)
    steps = sum(count for _, count in orphans)
    if steps:
        logger.info(
            "Purged %s steps whose record was gone",
            steps,
            extra={"event": "idempotency.orphan_steps_purged", "count": steps},
        )
    return sum(count for _, count in purged), steps
