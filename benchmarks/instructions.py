#!/usr/bin/env python
"""This app's own CPU per request, in instructions: ``.venv/bin/python benchmarks/instructions.py``.

Runs the requests of ``benchmarks/inprocess.py`` (Django's test client, no
HTTP) in one process under valgrind's callgrind, which counts the
instructions that process executes: the same code and inputs give the same
count whatever else the machine is doing, so the variants compare across runs
on a shared machine, where CPU times move by tens of percent. The variants
alternate in rounds, and the counter is read around each block of requests
(callgrind dumps its counts at every ``getppid()``, which nothing else in the
process calls). Only the Django process is counted, not PostgreSQL's.

Prints per request: the instructions of each variant, and of the protected
create and the replays over the unprotected create (the app's own cost).
``--baseline N`` also prints the protected create's cost as a share of ``N``
instructions (the cost of an earlier version, in millions). Needs valgrind
(Debian's package) and PostgreSQL as ``benchmarks/run.py`` does; creates and
drops the database ``idempotency_instructions``.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The variants, in the order of the table; "replays" are answered through the
# claim's transaction, "replays, read first" from one read before it (READ_FIRST);
# "the twin" is the unprotected create's own view with the mixin, routed alike
# (``/api/orders/``, the example's viewset under a router, costs a little more).
VARIANTS = (
    "unprotected",
    "idempotency (atomic)",
    "idempotency (atomic), the twin",
    "replays",
    "replays, read first",
    "placed order, unprotected",
    "placed order, idempotency (atomic)",
)
_TOTALS = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.child:
        return _child(args)
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("valgrind is not installed: apt-get install valgrind", file=sys.stderr)
        return 1
    from benchmarks.server import Database

    database = Database.named(args.database)
    database.recreate()
    try:
        with tempfile.TemporaryDirectory() as folder:
            counts = _measure(valgrind, database, Path(folder), args)
    finally:
        database.drop()
    print(_table(counts, args.requests * args.rounds, args.baseline))
    return 0


def _measure(valgrind: str, database: object, folder: Path, args: argparse.Namespace) -> list[int]:
    """Instructions of each block of requests, in the order the child ran them."""
    command = [
        valgrind,
        "--tool=callgrind",
        "--dump-before=getppid",
        "--dump-instr=no",
        "--compress-strings=no",
        f"--callgrind-out-file={folder}/callgrind.out",
        sys.executable,
        __file__,
        "--child",
        f"--rounds={args.rounds}",
        f"--requests={args.requests}",
        f"--database-url={database.url}",  # type: ignore[attr-defined]
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dumps = sorted(
        folder.glob("callgrind.out.*"), key=lambda path: int(path.name.rsplit(".", 1)[1])
    )
    return [_total(path) for path in dumps]


def _total(path: Path) -> int:
    found = _TOTALS.search(path.read_text(errors="replace"))
    if found is None:
        raise RuntimeError(f"{path}: no totals line")
    return int(found.group(1))


def _child(args: argparse.Namespace) -> int:
    """Under callgrind: warm up, then each block of requests between two ``getppid()``."""
    from django.test import override_settings

    from benchmarks.inprocess import requests_of
    from benchmarks.server import Database
    from benchmarks.stats import rotated

    name = args.database_url.rsplit("/", 1)[1]
    work = requests_of(Database.from_url(args.database_url, name))
    # A full collection costs in proportion to every object alive, and lands in
    # whichever block it happens to fall: each block starts with none pending.
    gc.collect()
    gc.freeze()
    for round_ in range(args.rounds):
        for variant in rotated(list(VARIANTS), round_):
            request, read_first = _variant(work, variant)
            # Set before the block, and read once by a request before it, so that the
            # block does not count the settings' reload and the checks that follow it.
            with override_settings(IDEMPOTENCY={"READ_FIRST": read_first}):
                request()
                gc.collect()
                os.getppid()  # dump: what ran before this block
                for _ in range(args.requests):
                    request()
                os.getppid()  # dump: this block
    return 0


def _variant(work: dict[str, Callable[[], None]], name: str) -> tuple[Callable[[], None], str]:
    """The request of the variant ``name``, and the READ_FIRST it runs with."""
    if name == "replays, read first":
        return work["replays"], "always"
    return work[name], "never"


def _blocks(counts: list[int], rounds: int) -> dict[str, int]:
    """Sum each variant's blocks: every second dump, in the child's rotated order."""
    from benchmarks.stats import rotated

    order = [name for round_ in range(rounds) for name in rotated(list(VARIANTS), round_)]
    # Dumps alternate: the gap before a block (setup, or the previous block's tail), the block.
    measured = counts[1::2]
    if len(measured) < len(order):
        raise RuntimeError(f"expected {len(order)} blocks, callgrind dumped {len(measured)}")
    totals = dict.fromkeys(VARIANTS, 0)
    for name, count in zip(order, measured, strict=False):
        totals[name] += count
    return totals


def _table(counts: list[int], requests: int, baseline: float | None) -> str:
    rounds = len(counts) // (2 * len(VARIANTS))
    per_request = {name: total / requests for name, total in _blocks(counts, rounds).items()}
    plain = per_request["unprotected"]
    placed = per_request["placed order, unprotected"]
    rows = [
        "| variant | instructions per request, millions | over its unprotected create |",
        "|---|---:|---:|",
    ]
    for name, value in per_request.items():
        base = placed if name.startswith("placed") else plain
        over = "-" if value is base else f"{(value - base) / 1e6:+.3f}"
        rows.append(f"| {name} | {value / 1e6:.3f} | {over} |")
    own = (per_request["idempotency (atomic)"] - plain) / 1e6
    twin = (per_request["idempotency (atomic), the twin"] - plain) / 1e6
    rows.append("")
    rows.append(f"The app's own cost per protected create: {own:.3f} million instructions.")
    rows.append(f"On the unprotected create's own view: {twin:.3f} million.")
    if baseline:
        rows.append(f"Against {baseline:.3f} million before: {own / baseline:.2f}x.")
    return "\n".join(rows)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=25, help="per variant and round")
    parser.add_argument("--baseline", type=float, help="an earlier cost, millions per create")
    parser.add_argument(
        "--database",
        default=os.environ.get("BENCH_INSTRUCTIONS_DATABASE", "idempotency_instructions"),
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
