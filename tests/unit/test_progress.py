"""``idempotency.progress``: what a pass says after each batch, and how often it is passed on."""

from __future__ import annotations

import pytest

from idempotency import progress
from idempotency.progress import Meter, Progress, duration, every


class Clock:
    """``monotonic`` at the times a test sets."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(progress, "monotonic", fake)
    return fake


def test_a_purge_line_with_its_total():
    line = Progress(batches=3, done=3000, total=12400, elapsed=2.0).describe()
    assert line == "3 batches, 3,000/12,400 records (24%), 1,500 records/s, 2.0 s"


def test_a_recovery_line_with_its_outcomes():
    counts = {"succeeded": 1, "released": 2, "needs_review": 0, "unknown": 0}
    line = Progress(batches=1, done=3, total=None, elapsed=0.5, counts=counts).describe()
    assert line == (
        "1 batch, 3 records (1 succeeded, 2 released, 0 needs review, 0 unknown), "
        "6.0 records/s, 0.5 s"
    )


def test_no_rate_before_any_time_has_passed():
    assert Progress(batches=1, done=1, total=0, elapsed=0.0).rate == 0.0
    assert "1/0 records (100%), 0.0 records/s" in Progress(1, 1, 0, 0.0).describe()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.04, "0.0 s"),
        (12.34, "12.3 s"),
        (59.9, "59.9 s"),
        (252, "4 min 12 s"),
        (7500, "2 h 05 min"),
    ],
)
def test_durations(seconds, text):
    assert duration(seconds) == text


def test_the_meter_counts_batches_and_time(clock):
    seen: list[Progress] = []
    meter = Meter(seen.append)
    meter.total = 10
    clock.now += 2
    meter.batch(4)
    clock.now += 2
    meter.batch(12, {"released": 12})  # more expired meanwhile: the total grows with them
    assert seen == [Progress(1, 4, 10, 2.0), Progress(2, 12, 12, 4.0, {"released": 12})]
    assert seen[1].rate == 3.0


def test_every_passes_at_most_one_progress_per_interval(clock):
    passed: list[int] = []
    throttled = every(2.5, lambda current: passed.append(current.done))
    for step, done in ((1.0, 1), (1.5, 2), (0.5, 3), (1.5, 4), (10.0, 5)):
        clock.now += step
        throttled(Progress(done, done, None, 0.0))
    assert passed == [2, 5]  # at 2.5 s and 14.5 s; 3 s and 4.5 s came too soon after 2.5 s


def test_every_zero_passes_each_one(clock):
    passed: list[int] = []
    throttled = every(0, lambda current: passed.append(current.done))
    for done in range(3):
        throttled(Progress(done, done, None, 0.0))
    assert passed == [0, 1, 2]
