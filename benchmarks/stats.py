"""Summaries of samples: medians and tail latencies pooled, throughput per round."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from benchmarks.loadgen import Sample

T = TypeVar("T")


def rotated(items: Sequence[T], by: int) -> list[T]:
    """Round ``by`` starts with a different item, so no one always runs first (or last)."""
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Summary:
    requests: int
    throughput: float  # requests per second: the median over rounds
    p50: float  # milliseconds, pooled over rounds
    p95: float
    p99: float
    statuses: Counter[int]
    failures: int
    replayed: int

    @property
    def non_2xx(self) -> int:
        return sum(count for status, count in self.statuses.items() if not 200 <= status < 300)


def summarize(samples: Sequence[Sample]) -> Summary:
    latencies = [seconds * 1000 for sample in samples for seconds in sample.latencies]
    statuses: Counter[int] = Counter()
    for sample in samples:
        statuses.update(sample.statuses)
    rates = [sample.throughput for sample in samples if sample.requests]
    return Summary(
        requests=len(latencies),
        throughput=statistics.median(rates) if rates else 0.0,
        p50=percentile(latencies, 50),
        p95=percentile(latencies, 95),
        p99=percentile(latencies, 99),
        statuses=statuses,
        failures=sum(sample.failures for sample in samples),
        replayed=sum(sample.replayed for sample in samples),
    )
