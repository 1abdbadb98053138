"""How far a long purge or recovery pass has gone, told after each batch.

One shape for both passes, so that a command's output and a task's log read
alike: ``retention.purge``, ``recovery.recover_expired`` and their ``*_everywhere``
functions take ``progress=``, a callable that receives a ``Progress``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from time import monotonic

__all__ = ["OnProgress", "Progress", "duration", "every", "logged", "rate"]

logger = logging.getLogger("idempotency")

# A long pass run by a task logs where it stands at most this often (seconds); a short
# one not at all.
LOG_PROGRESS_EVERY = 10.0


@dataclass(frozen=True)
class Progress:
    """Where a pass stands after a batch.

    - ``batches``: batches done; ``done``: records handled so far.
    - ``total``: records the pass expects (purge counts them first), else ``None``.
    - ``elapsed``: seconds since the pass began.
    - ``counts``: what became of the records so far (recovery's outcomes:
      ``succeeded``, ``released``, ``needs_review``, ``unknown``, ``skipped``).
    - ``shard``: the shard's label where the pass visits several, else ``""``.
    """

    batches: int
    done: int
    total: int | None
    elapsed: float
    counts: Mapping[str, int] = field(default_factory=dict)
    shard: str = ""

    @property
    def rate(self) -> float:
        """Records per second so far."""
        return self.done / self.elapsed if self.elapsed > 0 else 0.0

    def describe(self) -> str:
        """``3 batches, 3,000/12,400 records (24%), 1,480 records/s, 2.0 s``."""
        records = f"{self.done:,}"
        if self.total is not None:
            percent = 100 * self.done // self.total if self.total else 100
            records += f"/{self.total:,} records ({percent}%)"
        else:
            records += " record" if self.done == 1 else " records"
        if self.counts:
            named = ", ".join(f"{n:,} {name.replace('_', ' ')}" for name, n in self.counts.items())
            records += f" ({named})"
        batches = f"{self.batches:,} batch{'' if self.batches == 1 else 'es'}"
        return f"{batches}, {records}, {rate(self.rate)}, {duration(self.elapsed)}"


OnProgress = Callable[[Progress], None]


class Meter:
    """A pass's batches and time: builds its ``Progress`` after each batch."""

    def __init__(self, callback: OnProgress | None) -> None:
        self.callback = callback
        self.total: int | None = None
        self.batches = 0
        self.started = monotonic()

    def batch(self, done: int, counts: Mapping[str, int] | None = None) -> None:
        self.batches += 1
        if self.callback is None:
            return
        total = None if self.total is None else max(self.total, done)  # more may expire meanwhile
        elapsed = monotonic() - self.started
        self.callback(Progress(self.batches, done, total, elapsed, dict(counts or {})))


def every(seconds: float, callback: OnProgress) -> OnProgress:
    """``callback``, at most once per ``seconds`` (``0``: after every batch).

    The first call passes once ``seconds`` have gone by, so a short pass says nothing.
    """
    last = monotonic()

    def throttled(progress: Progress) -> None:
        nonlocal last
        now = monotonic()
        if now - last >= seconds:
            last = now
            callback(progress)

    return throttled


def logged(verb: str, event: str) -> OnProgress:
    """A task's ``progress=``: ``Purging... 600 batches, ...`` to the ``idempotency`` logger,
    at ``INFO``, at most every ``LOG_PROGRESS_EVERY`` seconds (``event``: its ``extra``)."""

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


def rate(per_second: float) -> str:
    return f"{per_second:,.{1 if per_second < 10 else 0}f} records/s"


def duration(seconds: float) -> str:
    """``0.4 s``, ``12.3 s``, ``4 min 12 s``, ``2 h 05 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"
