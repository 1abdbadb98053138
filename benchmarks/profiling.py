#!/usr/bin/env python
"""What this app's own code costs per request: ``.venv/bin/python benchmarks/profiling.py``.

Serves the benchmark project's order create through Django's test client in
this process, as ``benchmarks/inprocess.py`` does, and profiles it with
``cProfile`` in alternating rounds: the unprotected create, the protected
create (atomic mode) and replays of recorded keys. Per request it prints the
Python function calls (deterministic: the same code makes the same calls, so
the count compares across runs on a noisy machine), the profiled CPU time, and
the difference between the protected and the unprotected create: the app's
own cost. ``--top N`` prints each variant's N costliest functions by their own
time, the profile's top entries. ``--pyinstrument`` prints a pyinstrument call
tree of the protected create instead (the ``dev`` extra installs it). Needs
PostgreSQL as ``benchmarks/run.py`` does; creates and drops the database
``idempotency_profile``.

An authenticated ``GET`` of one order through the same view set (``/api/orders/``)
is profiled beside them: the cheapest request of a replay's own stack.
``--replay-cache`` serves everything with this app's replay cache in Redis
(``benchmarks/settings.py``, ``BENCH_REDIS_URL``), so that replays are read from it.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import io
import os
import pstats
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.inprocess import requests_of  # noqa: E402
from benchmarks.server import PASSWORD, USER, Database  # noqa: E402
from benchmarks.stats import rotated  # noqa: E402

ORDER_GET = "an order's GET (the same view set)"
VARIANTS = ("unprotected", "idempotency (atomic)", "replays", ORDER_GET)


@dataclass
class Profiled:
    requests: int = 0
    calls: int = 0
    seconds: float = 0.0  # CPU time under the profiler
    cpu: float = 0.0  # CPU time without it
    stats: pstats.Stats | None = field(default=None, repr=False)

    def per_request(self, total: float) -> float:
        return total / self.requests if self.requests else 0.0


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    database = Database.named(args.database)
    database.recreate()
    try:
        if args.replay_cache:
            os.environ["BENCH_REPLAY_CACHE"] = "1"  # read by benchmarks/settings.py
        work = {**requests_of(database), ORDER_GET: _order_get()}
        if args.pyinstrument:
            print(_pyinstrument(work[args.pyinstrument], args.requests))
            return 0
        profiled = _profile(work, args.rounds, args.requests)
    finally:
        database.drop()
    print(_table(profiled))
    if args.top:
        for name, result in profiled.items():
            print(f"\n### {name}: top {args.top} functions by own time\n")
            print(_top(result, args.top))
    return 0


def _order_get() -> Callable[[], None]:
    """One request: an authenticated GET of one of the caller's orders, as the creates' view set."""
    from django.test import Client

    from example_project.shop.models import Order

    client = Client(HTTP_HOST="127.0.0.1")
    credentials = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    path = f"/api/orders/{Order.objects.order_by('pk').values_list('pk', flat=True).first()}/"

    def get() -> None:
        response = client.get(path, HTTP_AUTHORIZATION=f"Basic {credentials}")
        if response.status_code != 200:
            raise RuntimeError(f"{path}: {response.status_code} {response.content[:300]!r}")

    return get


def _profile(
    work: dict[str, Callable[[], None]], rounds: int, requests: int
) -> dict[str, Profiled]:
    results = {name: Profiled() for name in VARIANTS}
    for round_ in range(rounds):
        for name in rotated(list(VARIANTS), round_):
            result, request = results[name], work[name]
            before = time.process_time()
            for _ in range(requests):
                request()
            result.cpu += time.process_time() - before
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            for _ in range(requests):
                request()
            profiler.disable()
            stats = pstats.Stats(profiler)
            result.calls += stats.total_calls  # type: ignore[attr-defined]
            result.seconds += stats.total_tt  # type: ignore[attr-defined]
            result.requests += requests
            if result.stats is None:
                result.stats = stats
            else:
                result.stats.add(profiler)
    return results


def _table(results: dict[str, Profiled]) -> str:
    base = results["unprotected"]
    rows = [
        "| variant | requests | calls per request | profiled CPU ms | CPU ms (no profiler) "
        "| calls over unprotected | CPU ms over unprotected |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        calls = result.per_request(result.calls)
        cpu = result.per_request(result.cpu) * 1000
        extra_calls = calls - base.per_request(base.calls)
        extra_cpu = cpu - base.per_request(base.cpu) * 1000
        rows.append(
            f"| {name} | {result.requests} | {calls:.0f} "
            f"| {result.per_request(result.seconds) * 1000:.2f} | {cpu:.2f} "
            f"| {extra_calls:+.0f} | {extra_cpu:+.2f} |"
        )
    return "\n".join(rows)


def _top(result: Profiled, count: int) -> str:
    assert result.stats is not None
    rows = ["| function | calls per request | own ms per request | cumulative ms per request |"]
    rows.append("|---|---:|---:|---:|")
    stats = result.stats.stats  # type: ignore[attr-defined]
    entries = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:count]
    for (filename, line, function), (_, calls, own, cumulative, _) in entries:
        where = _short(filename)
        rows.append(
            f"| `{where}:{line}({function})` | {calls / result.requests:.1f} "
            f"| {own / result.requests * 1000:.3f} | {cumulative / result.requests * 1000:.3f} |"
        )
    return "\n".join(rows)


def _short(filename: str) -> str:
    for marker in ("site-packages/", str(ROOT) + "/", "lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def _pyinstrument(request: Callable[[], None], requests: int) -> str:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0002)
    profiler.start()
    for _ in range(requests):
        request()
    profiler.stop()
    buffer = io.StringIO()
    buffer.write(profiler.output_text(unicode=False, color=False, show_all=False))
    return buffer.getvalue()


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=200, help="per variant and round")
    parser.add_argument("--top", type=int, default=0, help="print the N costliest functions")
    parser.add_argument(
        "--pyinstrument",
        nargs="?",
        const="idempotency (atomic)",
        choices=VARIANTS,
        help="print a pyinstrument call tree of this variant (the protected create by default)",
    )
    parser.add_argument("--replay-cache", action="store_true", help="REPLAY_CACHE in Redis")
    parser.add_argument(
        "--database", default=os.environ.get("BENCH_PROFILE_DATABASE", "idempotency_profile")
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
