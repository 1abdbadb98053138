"""What the package's management commands share: their options and how they are read.

A module of its own, so that no command imports another command's module.
"""

from __future__ import annotations

import re
from argparse import ArgumentParser
from collections.abc import Sized
from datetime import timedelta
from time import monotonic
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from idempotency.models import PURGEABLE
from idempotency.progress import OnProgress, Progress, duration, every, rate

_AGE = re.compile(r"^\s*(\d+)\s*([dhms])\s*$", re.IGNORECASE)
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def add_shared_arguments(parser: ArgumentParser, *, dry_run: str, batch: str, setting: str) -> None:
    """What both commands take: ``--dry-run`` (whose help is ``dry_run``), ``--batch-size N``
    (default: ``setting``), ``--database`` and ``--progress-every``."""
    parser.add_argument("--dry-run", action="store_true", help=dry_run)
    parser.add_argument(
        "--batch-size", metavar="N", help=f"{batch} (default: IDEMPOTENCY[{setting!r}])."
    )
    add_database_argument(parser)
    parser.add_argument(
        "--progress-every",
        metavar="SECONDS",
        type=float,
        default=2.0,
        help="Where the output is not a terminal, a progress line at most every SECONDS "
        "(default: 2; 0: after every batch). On a terminal, one line updated as it goes.",
    )


def parse_age(value: str) -> timedelta:
    """``7d``, ``12h``, ``30m`` or ``45s`` as a ``timedelta``."""
    match = _AGE.match(value)
    if match is None or int(match.group(1)) == 0:
        raise CommandError(
            f"--older-than should be a positive number with a unit d, h, m or s "
            f"(e.g. 7d, 12h, 30m, 45s), not {value!r}."
        )
    return timedelta(**{_UNITS[match.group(2).lower()]: int(match.group(1))})


def records(count: int) -> str:
    return f"{count:,} record{'' if count == 1 else 's'}"


def positive_int(value: str | int | None, option: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise CommandError(f"{option} should be a positive integer, not {value!r}.")
    return number


def statuses(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    chosen = [part.strip().upper() for value in values for part in value.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(PURGEABLE))
    if unknown:
        raise CommandError(
            f"--status should be one of {', '.join(PURGEABLE)}, not {', '.join(unknown)} "
            "(PROCESSING and NEEDS_REVIEW records are never purged)."
        )
    return chosen


def add_database_argument(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--database",
        metavar="ALIAS",
        help="Only this database (default: every database that holds records: "
        "IDEMPOTENCY['SHARDS'], else the routers' allow_migrate; each tenant schema under "
        "django-tenants).",
    )


def chosen_database(alias: str | None) -> str | None:
    if alias is not None and alias not in connections:
        raise CommandError(
            f"--database should be an alias of DATABASES ({', '.join(connections)}), not {alias!r}."
        )
    return alias


def shards(results: Sized) -> str:
    return f"{len(results)} shard{'' if len(results) == 1 else 's'}"


class ProgressLines:
    """A command's progress: on a terminal one updating line, else a line every few seconds.

    ``-v 0`` (``verbosity`` 0) gives ``callback`` ``None``: the pass says nothing.
    """

    def __init__(self, command: BaseCommand, verb: str, options: dict[str, Any]) -> None:
        self.out, self.verb = command.stdout, verb
        self.terminal = self.out.isatty()
        self.width, self.shard = 0, ""
        seconds = float(options["progress_every"])
        if seconds < 0:
            raise CommandError(f"--progress-every should be 0 or more seconds, not {seconds:g}.")
        self.callback: OnProgress | None = None
        if options["verbosity"] > 0:
            self.callback = self.show if self.terminal else every(seconds, self.show)

    def show(self, progress: Progress) -> None:
        shard = f" {progress.shard}" if progress.shard else ""
        line = f"{self.verb}{shard}... {progress.describe()}"
        if not self.terminal:
            self.out.write(line)
            return
        if progress.shard != self.shard and self.width:
            self.out.write("")  # keep the last shard's line
            self.width = 0
        self.out.write(f"\r{line.ljust(self.width)}", ending="")
        self.out.flush()
        self.width, self.shard = len(line), progress.shard

    def close(self) -> None:
        """Leave the updating line before the summary."""
        if self.width:
            self.out.write("")
            self.width = 0


class Stopwatch:
    """The time a command's passes took, for its summary."""

    def __init__(self) -> None:
        self.started = monotonic()

    def took(self, count: int | None = None) -> str:
        """``(12.3 s, 98 records/s)``; with ``count`` ``None``, the time only."""
        elapsed = monotonic() - self.started
        if count is None:
            return f"({duration(elapsed)})"
        return f"({duration(elapsed)}, {rate(count / elapsed if elapsed > 0 else 0.0)})"
