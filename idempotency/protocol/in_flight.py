"""Duplicates of an attempt in flight: what they are told, and how many may wait here.

A duplicate that arrives while an attempt runs either waits for its outcome
(atomic mode: on the row lock, up to ``LOCK_TIMEOUT``; lease mode:
``WAIT_SECONDS``) or gets ``KeyInUse`` (409) with a ``Retry-After`` a client can
use: when the attempt is likely done, never past its lease. Both rest on what
this process knows without a query: how long the operation's recent attempts
took here, and how many of its requests are waiting right now.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from idempotency import signals
from idempotency.conf import idempotency_settings
from idempotency.exceptions import KeyInUse
from idempotency.models import IdempotencyRecord
from idempotency.protocol.operation import Operation

_OPERATIONS = 256  # operation names remembered, the least recently finished forgotten first
_SAMPLES = 32  # durations remembered per operation


def in_use(
    operation: Operation, record: IdempotencyRecord, *, unresolved: bool = False
) -> KeyInUse:
    """The 409 for a key ``record``'s attempt holds, with when to come back."""
    remaining: timedelta | None = getattr(record, "lease_remaining", None)
    if unresolved:
        # The resolver answered "unknown": it is asked again when this pause (the lease) ends.
        pause = remaining.total_seconds() if remaining is not None else 0
        seconds = max(idempotency_settings.RETRY_AFTER, math.ceil(pause))
    else:
        seconds = retry_after(
            operation.name, elapsed=_running_for(record, remaining), lease_remaining=remaining
        )
    signals.key_in_use.send(IdempotencyRecord, operation=operation, retry_after=seconds)
    return KeyInUse(retry_after=seconds)


def busy(operation: Operation) -> KeyInUse:
    """The 409 for a claim whose wait on the row lock ran past its bound."""
    seconds = idempotency_settings.RETRY_AFTER
    signals.key_in_use.send(IdempotencyRecord, operation=operation, retry_after=seconds)
    return KeyInUse(retry_after=seconds)


def _running_for(record: IdempotencyRecord, remaining: timedelta | None) -> timedelta | None:
    """How long the record's attempt has run, by the database clock (claims set ``updated_at``)."""
    if remaining is None or record.lease_until is None or record.updated_at is None:
        return None
    return record.lease_until - remaining - record.updated_at


def retry_after(name: str, *, elapsed: timedelta | None, lease_remaining: timedelta | None) -> int:
    """``Retry-After`` of a ``409``: whole seconds until the answer is likely there.

    The operation's median duration here less what the attempt has run so far,
    else ``RETRY_AFTER`` (also once the attempt runs longer than usual); never
    past the end of its lease; at least one second.
    """
    seconds = float(idempotency_settings.RETRY_AFTER)
    median = durations.median(name)
    if median is not None and elapsed is not None and median > elapsed.total_seconds():
        seconds = median - elapsed.total_seconds()
    if lease_remaining is not None and lease_remaining > timedelta(0):
        seconds = min(seconds, lease_remaining.total_seconds())
    return max(1, math.ceil(seconds))


class Durations:
    """The durations of each operation's latest finished attempts in this process, bounded."""

    def __init__(self, operations: int = _OPERATIONS, samples: int = _SAMPLES) -> None:
        self._lock = threading.Lock()
        self._operations = operations
        self._samples = samples
        self._by_name: OrderedDict[str, deque[float]] = OrderedDict()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            samples = self._by_name.pop(name, None) or deque(maxlen=self._samples)
            samples.append(seconds)
            self._by_name[name] = samples
            while len(self._by_name) > self._operations:
                self._by_name.popitem(last=False)

    def median(self, name: str) -> float | None:
        with self._lock:
            samples = list(self._by_name.get(name, ()))
        return statistics.median(samples) if samples else None


durations = Durations()


class Waiters:
    """How many requests of this process wait for an outcome now, at most ``MAX_WAITERS``.

    A waiting request holds a worker thread (and its database connection, idle);
    past the bound, duplicates get ``409`` at once, so a hot key cannot take
    every thread of a process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @contextmanager
    def admitted(self) -> Iterator[bool]:
        with self._lock:
            admitted = self._count < idempotency_settings.MAX_WAITERS
            self._count += admitted
        try:
            yield admitted
        finally:
            if admitted:
                with self._lock:
                    self._count -= 1

    @property
    def count(self) -> int:
        return self._count


waiters = Waiters()
