"""Celery tasks for recovery and purge: each a few lines over the service it calls.

Only this module imports Celery; ``import idempotency`` never needs it. Add the
ready schedule from ``idempotency.beat`` to run them periodically.
"""

from __future__ import annotations

from celery import shared_task

from idempotency.recovery import recover_expired
from idempotency.retention import purge


@shared_task(name="idempotency.recover_expired_leases")
def recover_expired_leases(batch_size: int | None = None) -> dict[str, int | bool]:
    """Settle records whose lease expired; several workers may run this at once."""
    return recover_expired(batch_size=batch_size).as_dict()


@shared_task(name="idempotency.purge_expired_records")
def purge_expired_records(batch_size: int | None = None) -> int:
    """Delete records whose retention window has passed; returns how many."""
    return purge(batch_size=batch_size)
