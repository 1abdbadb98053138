"""A ready Celery beat schedule for the recovery and purge tasks.

With plain ``celery beat`` or with django-celery-beat's ``DatabaseScheduler``
(which copies ``beat_schedule`` into its tables on start), add it in one line::

    from idempotency.beat import IDEMPOTENCY_BEAT_SCHEDULE

    app.conf.beat_schedule.update(IDEMPOTENCY_BEAT_SCHEDULE)

This module imports neither Celery nor Django models.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

RECOVER_TASK = "idempotency.recover_expired_leases"
PURGE_TASK = "idempotency.purge_expired_records"


def beat_schedule(
    recover_every: float = 60.0, purge_every: float = 3600.0
) -> dict[str, dict[str, Any]]:
    """The two entries, run every ``recover_every`` and ``purge_every`` seconds."""
    return {
        "idempotency-recover-expired-leases": _entry(RECOVER_TASK, recover_every),
        "idempotency-purge-expired-records": _entry(PURGE_TASK, purge_every),
    }


def _entry(task: str, every: float) -> dict[str, Any]:
    # A run that waited in the queue past the next one is dropped, not piled up
    # (``expires`` for plain beat, ``expire_seconds`` for django-celery-beat).
    return {
        "task": task,
        "schedule": timedelta(seconds=every),
        "options": {"expires": every, "expire_seconds": every},
    }


IDEMPOTENCY_BEAT_SCHEDULE = beat_schedule()
