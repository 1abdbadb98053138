"""Celery tasks for recovery and purge: each a few lines over the service it calls.

Only this module imports Celery; ``import idempotency`` never needs it. Add the
ready schedule from ``idempotency.beat`` to run them periodically.
"""

from __future__ import annotations

from celery import shared_task

from idempotency.progress import logged
from idempotency.recovery import recover_everywhere, total
from idempotency.retention import scheduled_purge


@shared_task(name="idempotency.recover_expired_leases")
def recover_expired_leases(
    batch_size: int | None = None, database: str | None = None
) -> dict[str, int | bool]:
    """Settle records whose lease expired, in every shard; several workers may run this at once."""
    reports = recover_everywhere(
        database=database,
        batch_size=batch_size,
        progress=logged("Recovering", "recovery_progress"),
    )
    return total(report for _, report in reports).as_dict()


@shared_task(name="idempotency.purge_expired_records")
def purge_expired_records(batch_size: int | None = None, database: str | None = None) -> int:
    """Delete records whose retention window has passed, in every shard; returns how many.

    Steps whose record is gone (left by an earlier release) go too, and are logged.
    """
    records, _ = scheduled_purge(
        database=database, batch_size=batch_size, progress=logged("Purging", "purge_progress")
    )
    return records
