"""Recovery, purge and the requeue of lost tasks as ``django.tasks`` tasks.

Each is a few lines over the service it calls, as the Celery tasks of
``idempotency.tasks`` are. Defined for the default task backend and its
``default`` queue; ``.using(queue_name=..., backend=...)`` sends them elsewhere
(a backend whose ``QUEUES`` leave out ``default`` refuses this module at import:
define your own three-line tasks over the same services, docs/tasks.md). Only
this module and ``idempotency.django_tasks`` import the framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from idempotency import django_tasks
from idempotency.progress import logged
from idempotency.recovery import recover_everywhere, total
from idempotency.retention import scheduled_purge

if TYPE_CHECKING:
    from django.tasks import task
else:
    try:
        from django.tasks import task
    except ImportError:  # Django 5.2: the backport (idempotency.django_tasks says if it is missing)
        from django_tasks import task

__all__ = ["purge_expired_records", "recover_expired_leases", "requeue_lost_tasks"]


@task()
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


@task()
def purge_expired_records(batch_size: int | None = None, database: str | None = None) -> int:
    """Delete records whose retention window has passed, in every shard; returns how many.

    Steps whose record is gone (left by an earlier release) go too, and are logged.
    """
    records, _ = scheduled_purge(
        database=database, batch_size=batch_size, progress=logged("Purging", "purge_progress")
    )
    return records


@task()
def requeue_lost_tasks(stale_after: float, backend: str | None = None) -> int:
    """django-tasks-db: run again the protected tasks ``RUNNING`` for over ``stale_after``
    seconds (``idempotency.django_tasks.requeue_lost_tasks``); returns how many."""
    return django_tasks.requeue_lost_tasks(stale_after, backend=backend)
