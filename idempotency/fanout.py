"""Recovery and purge in every shard: each database, and each schema, that holds records.

What ``idempotency_recover``, ``idempotency_cleanup`` and the beat tasks call:
each shard's pass runs with its connection switched to the shard's schema
(``Shard.active``), one after the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

from idempotency.progress import OnProgress, Progress
from idempotency.recovery import RecoveryReport, recover_expired
from idempotency.retention import purge
from idempotency.shards import Shard, shards

__all__ = ["purge_everywhere", "recover_everywhere", "total"]

T = TypeVar("T")


def purge_everywhere(
    database: str | None = None, progress: OnProgress | None = None, **options: Any
) -> list[tuple[Shard, int]]:
    """``retention.purge`` in every shard (``shards(database)``): how many each lost.

    ``progress`` gets each shard's ``Progress``, with the shard's label where there are several.
    """
    return _in_every_shard(purge, database, progress, options)


def recover_everywhere(
    database: str | None = None, progress: OnProgress | None = None, **options: Any
) -> list[tuple[Shard, RecoveryReport]]:
    """``recovery.recover_expired`` in every shard (``shards(database)``): each one's report.

    ``progress`` as for ``purge_everywhere``.
    """
    return _in_every_shard(recover_expired, database, progress, options)


def _in_every_shard(
    service: Callable[..., T],
    database: str | None,
    progress: OnProgress | None,
    options: dict[str, Any],
) -> list[tuple[Shard, T]]:
    visited, done = shards(database), []
    for shard in visited:
        with shard.active():
            report = _labelled(progress, shard, visited)
            done.append((shard, service(database=shard.alias, progress=report, **options)))
    return done


def total(reports: Iterable[RecoveryReport], dry_run: bool = False) -> RecoveryReport:
    """The reports of several shards added up."""
    summed = RecoveryReport(dry_run=dry_run)
    for report in reports:
        for name in ("succeeded", "released", "needs_review", "unknown", "skipped"):
            setattr(summed, name, getattr(summed, name) + getattr(report, name))
    return summed


def _labelled(progress: OnProgress | None, shard: Shard, visited: list[Shard]) -> OnProgress | None:
    if progress is None or len(visited) == 1:
        return progress

    def told(current: Progress) -> None:
        progress(replace(current, shard=shard.label))

    return told
