"""Recovery and purge in every shard: each database, and each schema, that holds records.

What ``idempotency_recover``, ``idempotency_cleanup`` and the beat tasks call:
each shard's pass runs with its connection switched to the shard's schema
(``Shard.active``), one after the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from idempotency.recovery import RecoveryReport, recover_expired
from idempotency.retention import Progress, purge
from idempotency.shards import Shard, shards

__all__ = ["purge_everywhere", "recover_everywhere", "total"]


def purge_everywhere(
    database: str | None = None,
    progress: Callable[[Shard], Progress | None] | None = None,
    **options: Any,
) -> list[tuple[Shard, int]]:
    """``retention.purge`` in every shard (``shards(database)``): how many each lost.

    ``progress(shard)`` gives the progress callback of that shard's pass.
    """
    done = []
    for shard in shards(database):
        with shard.active():
            report = progress(shard) if progress is not None else None
            done.append((shard, purge(database=shard.alias, progress=report, **options)))
    return done


def recover_everywhere(
    database: str | None = None, **options: Any
) -> list[tuple[Shard, RecoveryReport]]:
    """``recovery.recover_expired`` in every shard (``shards(database)``): each one's report."""
    done = []
    for shard in shards(database):
        with shard.active():
            done.append((shard, recover_expired(database=shard.alias, **options)))
    return done


def total(reports: Iterable[RecoveryReport], dry_run: bool = False) -> RecoveryReport:
    """The reports of several shards added up."""
    summed = RecoveryReport(dry_run=dry_run)
    for report in reports:
        for name in ("succeeded", "released", "needs_review", "unknown", "skipped"):
            setattr(summed, name, getattr(summed, name) + getattr(report, name))
    return summed
