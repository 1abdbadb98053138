"""The results as one markdown document: tables, ratios against the targets, query plans."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.bulk import PURGE, RAW, UNBATCHED, PurgeResult, RecoveryResult
from benchmarks.floor import (
    PROTECTED,
    PROTOCOLS,
    TRANSACTION,
    UNPROTECTED,
    WRITTEN_ONCE,
    FloorResult,
    measurement,
)
from benchmarks.http_scenarios import (
    LEASE_SLOW_WAITING,
    ORDER_GET,
    ORDER_GET_CACHED,
    ORDER_GET_PREPARED,
    OURS,
    OURS_CACHED,
    OURS_PREPARED,
    PLACED,
    PLACED_OURS,
    PLAIN,
    PLAIN_ATOMIC,
    PLAIN_PREPARED,
    PREPARED,
    TWIN,
    HotKey,
)
from benchmarks.http_scenarios import (
    WRITTEN_ONCE as WRITTEN_ONCE_TWIN,
)
from benchmarks.loadgen import Sample
from benchmarks.stats import Summary, percentile, summarize

CACHED = OURS_CACHED.name.removeprefix(OURS.name)


class RoundRatio(float):
    """The median of per-round ratios, remembering the lowest and the highest round."""

    low = math.nan
    high = math.nan

    @classmethod
    def of(cls, pairs: Sequence[float]) -> RoundRatio:
        ratio = cls(statistics.median(pairs))
        ratio.low, ratio.high = min(pairs), max(pairs)
        return ratio


@dataclass(frozen=True)
class Ratio:
    name: str
    value: float
    target: str = ""  # ">= 0.9", "<= 2", "> 1" or "" (reported, no target)

    @property
    def verdict(self) -> str:
        if not self.target or math.isnan(self.value):
            return "-"
        operator, bound = self.target.split()
        limit = float(bound)
        met = {
            ">=": self.value >= limit,
            "<=": self.value <= limit,
            ">": self.value > limit,
        }[operator]
        return "met" if met else "missed"


@dataclass
class Results:
    setup: list[str]
    first: dict[str, list[Sample]] = field(default_factory=dict)
    replays: dict[str, list[Sample]] = field(default_factory=dict)
    hot: dict[str, HotKey] = field(default_factory=dict)
    purge: PurgeResult | None = None
    recovery: RecoveryResult | None = None
    floor: FloorResult | None = None
    alternatives: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)


def render(results: Results) -> str:
    first = {name: summarize(samples) for name, samples in results.first.items()}
    replays = {name: summarize(samples) for name, samples in results.replays.items()}
    parts = [
        "# Benchmark results",
        "",
        *(f"- {line}" for line in results.setup),
        "",
        "## Ratios",
        "",
        _ratio_table(_ratios(results)),
        "",
        "## First requests (a new key each; the unprotected twin sends none)",
        "",
        _http_table(first),
        "",
        "## Replays of recorded keys, alternating with fresh creates and an order's GET",
        "",
        _http_table(replays),
        "",
    ]
    if results.hot:
        parts += ["## Hot key: simultaneous duplicates of one key", "", _hot_table(results.hot), ""]
    if results.purge is not None or results.recovery is not None:
        parts += ["## Purge and recovery", "", _bulk_table(results), ""]
    if results.floor is not None:
        parts += [
            "## Database floor: the same statements, without HTTP or Django (pgbench; "
            "on MariaDB benchmarks/mysql_floor.py)",
            "",
        ]
        parts += [_floor_table(results.floor), ""]
    if results.unsupported:
        parts += ["## Not supported", "", *(f"- {line}" for line in results.unsupported), ""]
    parts += _plans(results)
    return "\n".join(parts).rstrip() + "\n"


def _ratios(results: Results) -> list[Ratio]:
    first, replays = results.first, results.replays
    ours, lease = OURS.name, "idempotency (lease)"
    fresh, replayed = f"{OURS.name}, fresh keys", f"{OURS.name}, replays"
    ratios = [
        Ratio(
            "first requests, throughput: idempotency / unprotected",
            _paired(first, ours, PLAIN.name),
            ">= 0.9",
        ),
        Ratio(
            f"first requests, throughput: idempotency / unprotected{PREPARED}",
            _paired(first, OURS_PREPARED.name, PLAIN_PREPARED.name),
            ">= 0.9",
        ),
        Ratio(
            "first requests, throughput: idempotency / unprotected in a transaction",
            _paired(first, ours, PLAIN_ATOMIC.name),
        ),
        Ratio("first requests, throughput: lease / atomic mode", _paired(first, lease, ours)),
        Ratio(
            "first requests, throughput: placed order, idempotency / unprotected",
            _paired(first, PLACED_OURS.name, PLACED.name),
            ">= 0.9",
        ),
        Ratio(
            "replays / fresh creates, throughput: placed order",
            _paired(replays, f"{PLACED_OURS.name}, replays", f"{PLACED_OURS.name}, fresh keys"),
            ">= 2",
        ),
        Ratio("replays / fresh creates, throughput", _paired(replays, replayed, fresh), ">= 2"),
        Ratio(
            f"replays / fresh creates, throughput{PREPARED}",
            _paired(replays, f"{OURS_PREPARED.name}, replays", f"{OURS_PREPARED.name}, fresh keys"),
            ">= 2",
        ),
        Ratio(
            f"replays / fresh creates, throughput{CACHED}",
            _paired(replays, f"{OURS_CACHED.name}, replays", f"{OURS_CACHED.name}, fresh keys"),
            ">= 3",  # issue 18's target for the cache, which issue 32 holds it to
        ),
        Ratio(
            f"first requests, throughput: idempotency{CACHED} / unprotected",
            _paired(first, OURS_CACHED.name, PLAIN.name),
            ">= 0.9",
        ),
        Ratio(
            f"first requests, throughput: idempotency{CACHED} / without it",
            _paired(first, OURS_CACHED.name, ours),
        ),
    ]
    ratios += _stack_floor_ratios(results.replays)
    ratios += _written_once_ratios(results)
    ratios += _floor_ratios(results.floor)
    ratios += _hot_ratios(results.hot, results.alternatives)
    ratios += _purge_ratios(results.purge)
    for alternative in results.alternatives:
        ratios.append(
            Ratio(
                f"first requests, throughput: idempotency / {alternative}",
                _paired(first, ours, alternative),
                "> 1",
            )
        )
        ratios.append(
            Ratio(
                f"replays, throughput: idempotency / {alternative}",
                _paired(replays, replayed, f"{alternative}, replays"),
                "> 1",
            )
        )
        ratios.append(
            Ratio(
                f"replays, throughput: idempotency{CACHED} / {alternative}",
                _paired(replays, f"{OURS_CACHED.name}, replays", f"{alternative}, replays"),
                "> 1",
            )
        )
    return [ratio for ratio in ratios if not math.isnan(ratio.value)]


def _stack_floor_ratios(replays: dict[str, list[Sample]]) -> list[Ratio]:
    """What a replay costs against the cheapest request of its own stack, on its own server.

    A cost is the inverse of throughput: the GET's throughput over the replay's,
    per round. Fresh creates are set against the same GET, for scale.
    """
    sides = [
        (OURS.name, ORDER_GET.name, "", ""),
        (OURS_CACHED.name, ORDER_GET_CACHED.name, CACHED, "<= 1.2"),
        (OURS_PREPARED.name, ORDER_GET_PREPARED.name, PREPARED, ""),
        (PLACED_OURS.name, ORDER_GET.name, ": placed order", ""),
    ]
    ratios = []
    for variant, read, label, target in sides:
        ratios += [
            Ratio(
                f"cost: a replay / an order's GET{label}",
                _paired(replays, read, f"{variant}, replays"),
                target,
            ),
            Ratio(
                f"cost: a fresh create / an order's GET{label}",
                _paired(replays, read, f"{variant}, fresh keys"),
            ),
        ]
    return ratios


def _written_once_ratios(results: Results) -> list[Ratio]:
    """The record written once (issue 32) beside the default protocol, on the same view."""
    first, replays = results.first, results.replays
    once, twin = WRITTEN_ONCE_TWIN.name, TWIN.name
    ratios = [
        Ratio(
            "first requests, throughput: written once / default protocol",
            _paired(first, once, twin),
        ),
        Ratio(
            "first requests, throughput: written once / unprotected",
            _paired(first, once, PLAIN.name),
            ">= 0.9",
        ),
        Ratio(
            "first requests, throughput: default protocol (the twin) / unprotected",
            _paired(first, twin, PLAIN.name),
            ">= 0.9",
        ),
        Ratio(
            "replays / fresh creates, throughput: written once",
            _paired(replays, f"{once}, replays", f"{once}, fresh keys"),
            ">= 2",
        ),
        Ratio(
            "replays / fresh creates, throughput: default protocol (the twin)",
            _paired(replays, f"{twin}, replays", f"{twin}, fresh keys"),
            ">= 2",
        ),
    ]
    hot = results.hot
    distinct = next((result for name, result in hot.items() if "distinct" in name), None)
    for name, label in ((once, "written once"), (twin, "default protocol (the twin)")):
        if name in hot and distinct is not None:
            ratios += [
                Ratio(
                    f"hot key, {label}, p50 latency: duplicates / a burst of distinct creates",
                    percentile(hot[name].latencies, 50) / percentile(distinct.latencies, 50),
                    "<= 2",
                ),
                Ratio(
                    f"hot key, {label}: share answered with the outcome, one effect",
                    hot[name].score,
                    ">= 1",
                ),
            ]
    return ratios


def _paired(samples: dict[str, list[Sample]], a: str, b: str) -> float:
    """The median over rounds of a's throughput over b's in the same round.

    Rounds alternate the variants, so the two sides of one round ran seconds
    apart, under the same neighbours' load: a ratio per round cancels drift
    that a ratio of medians would keep.
    """
    pairs = [
        one.throughput / other.throughput
        for one, other in zip(samples.get(a, []), samples.get(b, []), strict=False)
        if other.throughput
    ]
    return RoundRatio.of(pairs) if pairs else math.nan


def _purge_ratios(purge: PurgeResult | None) -> list[Ratio]:
    if purge is None or PURGE not in purge.seconds:
        return []
    ours = statistics.median(purge.seconds[PURGE])
    ratios = []
    for name, seconds in purge.seconds.items():
        if name == PURGE:
            continue
        versus = {RAW: "a raw batched DELETE"}.get(name, name.split(":")[0])
        ratios.append(
            Ratio(
                f"purge / {versus}, rows per second",
                statistics.median(seconds) / ours,
                ">= 0.5" if name in (RAW, UNBATCHED) else "> 1",  # issue 40: one DELETE
            )
        )
    return ratios


def _floor_ratios(floor: FloorResult | None) -> list[Ratio]:
    if floor is None or not floor.tps:
        return []
    ratios = []
    for protocol in PROTOCOLS:
        simple = protocol == "simple"
        ratios += [
            Ratio(
                f"database floor ({protocol}), throughput: protected / unprotected create",
                _floor_paired(floor, PROTECTED, UNPROTECTED, protocol),
            ),
            Ratio(
                f"database floor ({protocol}), throughput: protected / BEGIN; INSERT; COMMIT",
                _floor_paired(floor, PROTECTED, TRANSACTION, protocol),
                ">= 0.45" if simple else ">= 0.6",  # issue 32 keeps issue 24's
            ),
            Ratio(
                f"database floor ({protocol}), throughput: written once / BEGIN; INSERT; COMMIT",
                _floor_paired(floor, WRITTEN_ONCE, TRANSACTION, protocol),
                ">= 0.55" if simple else ">= 0.7",
            ),
            Ratio(
                f"database floor ({protocol}), throughput: written once / protected",
                _floor_paired(floor, WRITTEN_ONCE, PROTECTED, protocol),
            ),
            Ratio(
                f"database floor ({protocol}), throughput: INSERT in a transaction / alone",
                _floor_paired(floor, TRANSACTION, UNPROTECTED, protocol),
            ),
        ]
    return ratios


def _floor_paired(floor: FloorResult, top: str, bottom: str, protocol: str) -> float:
    """Per-round ratios, as the HTTP figures are: the rounds alternate the scripts."""
    rounds = zip(
        floor.tps.get(measurement(top, protocol), []),
        floor.tps.get(measurement(bottom, protocol), []),
        strict=True,
    )
    pairs = [a / b for a, b in rounds if b]
    return RoundRatio.of(pairs) if pairs else math.nan


def _floor_table(floor: FloorResult) -> str:
    if floor.missing:
        return floor.missing
    rows = [
        f"| statements, protocol ({floor.clients} clients) | transactions/s (median) | rounds |",
        "|---|---:|---|",
    ]
    for name, values in floor.tps.items():
        runs = ", ".join(f"{value:.0f}" for value in values)
        rows.append(f"| {name} | {floor.median(name):.0f} | {runs} |")
    return "\n".join(rows)


def _hot_ratios(hot: dict[str, HotKey], alternatives: Sequence[str]) -> list[Ratio]:
    distinct = next((result for name, result in hot.items() if "distinct" in name), None)
    ours = hot.get(OURS.name)
    if distinct is None or ours is None:
        return []
    waiting = hot.get(LEASE_SLOW_WAITING.name)
    ratios = [
        Ratio(
            "hot key, p50 latency: duplicates / a burst of distinct creates",
            percentile(ours.latencies, 50) / percentile(distinct.latencies, 50),
            "<= 2",
        ),
        Ratio(
            "hot key, p95 latency: duplicates / a burst of distinct creates",
            percentile(ours.latencies, 95) / percentile(distinct.latencies, 95),
            "<= 2",
        ),
    ]
    if waiting is not None:
        ratios.append(
            Ratio(
                "hot key, lease mode, 2 s job, duplicates wait: share answered with the "
                "outcome, one effect",
                waiting.score,
                ">= 1",
            )
        )
    for alternative in alternatives:
        if alternative in hot:
            theirs = hot[alternative].score
            ratios.append(
                Ratio(
                    "hot key, duplicates answered with the outcome, one effect: "
                    f"idempotency / {alternative}",
                    ours.score / theirs if theirs else math.inf,
                    ">= 1",
                )
            )
    return ratios


def _ratio_table(ratios: Sequence[Ratio]) -> str:
    rows = ["| comparison | ratio | rounds | target | |", "|---|---:|---|---|---|"]
    rows += [
        f"| {ratio.name} | {ratio.value:.2f} | {_spread(ratio.value)} | {ratio.target or '-'} "
        f"| {ratio.verdict} |"
        for ratio in ratios
    ]
    return "\n".join(rows)


def _spread(value: float) -> str:
    """The range of the per-round ratios behind a median; "-" where there are no rounds."""
    if not isinstance(value, RoundRatio):
        return "-"
    return f"{value.low:.2f} to {value.high:.2f}"


def _http_table(summaries: dict[str, Summary]) -> str:
    rows = [
        "| variant | requests | 2xx/s (median of rounds) | p50 ms | p95 ms | p99 ms "
        "| replayed | non-2xx |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, summary in summaries.items():
        rows.append(
            f"| {name} | {summary.requests} | {summary.throughput:.0f} | {summary.p50:.1f} "
            f"| {summary.p95:.1f} | {summary.p99:.1f} | {summary.replayed} "
            f"| {_errors(summary.statuses, summary.failures)} |"
        )
    return "\n".join(rows)


def _hot_table(hot: dict[str, HotKey]) -> str:
    rows = [
        "| variant | replies | p50 ms | p95 ms | max ms | executed (not replays) "
        "| statuses | orders created per burst |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for name, result in hot.items():
        executed = (
            f"{len(result.executed)}, p50 {percentile(result.executed, 50):.1f} ms"
            if result.executed
            else "0"
        )
        statuses = ", ".join(
            f"{count}x {status}" for status, count in sorted(result.statuses.items())
        )
        if result.failures:
            statuses += f", {result.failures}x connection error"
        rows.append(
            f"| {name} | {len(result.latencies)} | {percentile(result.latencies, 50):.1f} "
            f"| {percentile(result.latencies, 95):.1f} | {max(result.latencies, default=0):.1f} "
            f"| {executed} | {statuses} | {', '.join(map(str, result.effects))} |"
        )
    return "\n".join(rows)


def _bulk_table(results: Results) -> str:
    rows = ["| operation | rows | seconds (median) | rows/s | runs |", "|---|---:|---:|---:|---|"]
    purge = results.purge
    if purge is not None:
        for name, seconds in purge.seconds.items():
            deleted = max(purge.deleted[name], default=0)
            median = statistics.median(seconds)
            runs = ", ".join(f"{value:.2f}" for value in seconds)
            rows.append(
                f"| {name} | {deleted:,} | {median:.2f} | {deleted / median:,.0f} | {runs} |"
            )
    recovery = results.recovery
    if recovery is not None:
        table_rows = recovery.finished_rows + recovery.expired_leases
        rows.append(
            f"| recover_expired(), {recovery.expired_leases} expired leases "
            f"| {table_rows} | {recovery.seconds:.3f} | - | {_report(recovery.report)} |"
        )
        rows.append(
            f"| recover_expired(), nothing expired | {recovery.finished_rows} "
            f"| {recovery.idle_seconds:.3f} | - | |"
        )
    return "\n".join(rows)


def _report(report: dict[str, object]) -> str:
    return ", ".join(
        f"{key} {value}" for key, value in report.items() if value and key != "dry_run"
    )


def _plans(results: Results) -> list[str]:
    plans = []
    if results.purge is not None:
        plans += [(f"{name}: one batch", plan) for name, plan in results.purge.plans.items()]
    if results.recovery is not None:
        plans += [("recovery scan", plan) for plan in results.recovery.plans]
    parts = ["## Query plans", ""] if plans else []
    for title, plan in plans:
        if plan:
            parts += [f"### {title}", "", "```", _elide_ids(plan), "```", ""]
    return parts


def _elide_ids(plan: str) -> str:
    """A batch deleted by its ids (MariaDB's purge) names thousands: the first and last say it."""

    def shorter(found: re.Match[str]) -> str:
        ids = found.group(1).split(", ")
        return f"IN ({ids[0]}, ..., {ids[-1]}: {len(ids):,} ids)"

    return re.sub(r"IN \((\d+(?:, \d+){9,})\)", shorter, plan)


def _errors(statuses: object, failures: int) -> str:
    assert isinstance(statuses, dict)
    bad = [f"{count}x {status}" for status, count in sorted(statuses.items()) if status >= 300]
    if failures:
        bad.append(f"{failures}x connection error")
    return ", ".join(bad) or "0"
