"""Celery tasks for recovery and purge: each a few lines over the service it calls.

Only this module imports Celery; ``import idempotency`` never needs it. Add the
ready schedule from ``idempotency.beat`` to run them periodically.
"""

from __future__ import annotations

import logging

from celery import shared_task

from idempotency.progress import OnProgress, Progress, every
from idempotency.recovery import recover_everywhere, total
from idempotency.retention import purge_everywhere, purge_orphan_steps_everywhere

logger = logging.getLogger("idempotency")

# A long pass logs where it stands at most this often (seconds); a short one not at all.
LOG_PROGRESS_EVERY = 10.0


@shared_task(name="idempotency.recover_expired_leases")
def recover_expired_leases(
    batch_size: int | None = None, database: str | None = None
) -> dict[str, int | bool]:
    """Settle records whose lease expired, in every shard; several workers may run this at once."""
    reports = recover_everywhere(
        database=database,
        batch_size=batch_size,
        progress=_logged("Recovering", "recovery_progress"),
    )
    return total(report for _, report in reports).as_dict()


@shared_task(name="idempotency.purge_expired_records")
def purge_expired_records(batch_size: int | None = None, database: str | None = None) -> int:
    """Delete records whose retention window has passed, in every shard; returns how many.

    Steps whose record is gone (left by an earlier release) go too, and are logged.
    """
    purged = purge_everywhere(
        database=database, batch_size=batch_size, progress=_logged("Purging", "purge_progress")
    )
    orphans = purge_orphan_steps_everywhere(database=database, batch_size=batch_size)
    steps = sum(count for _, count in orphans)
    if steps:
        logger.info(
            "Purged %s steps whose record was gone",
            steps,
            extra={"event": "idempotency.orphan_steps_purged", "count": steps},
        )
    return sum(count for _, count in purged)


def _logged(verb: str, event: str) -> OnProgress:
    def log(progress: Progress) -> None:
        shard = f" {progress.shard}" if progress.shard else ""
        logger.info(
            "%s%s... %s",
            verb,
            shard,
            progress.describe(),
            extra={
                "event": f"idempotency.{event}",
                "batches": progress.batches,
                "done": progress.done,
                "shard": progress.shard,
            },
        )

    return every(LOG_PROGRESS_EVERY, log)
