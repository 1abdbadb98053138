"""``manage.py idempotency_cleanup``: purge expired records (the purge task's service)."""

from __future__ import annotations

import re
from argparse import ArgumentParser
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from idempotency.models import PURGEABLE
from idempotency.retention import purge

_AGE = re.compile(r"^\s*(\d+)\s*([dhms])\s*$", re.IGNORECASE)
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


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


class Command(BaseCommand):
    help = (
        "Delete idempotency records whose retention window has passed, in bounded batches. "
        "PROCESSING and NEEDS_REVIEW records are never deleted."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument(
            "--older-than",
            metavar="AGE",
            help="Instead of the retention windows, take finished records created more than "
            "AGE ago: 7d, 12h, 30m or 45s.",
        )
        parser.add_argument(
            "--status",
            action="append",
            metavar="STATUS",
            help=f"Only records in this status (repeatable, or comma-separated): "
            f"{', '.join(PURGEABLE)}.",
        )
        parser.add_argument(
            "--scope", help="Only records of this scope; a trailing * matches a prefix."
        )
        parser.add_argument(
            "--batch-size",
            metavar="N",
            help="Rows deleted per transaction (default: IDEMPOTENCY['PURGE_BATCH_SIZE']).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run = bool(options["dry_run"])
        try:
            count = purge(
                batch_size=positive_int(options["batch_size"], "--batch-size"),
                older_than=parse_age(options["older_than"]) if options["older_than"] else None,
                statuses=statuses(options["status"]),
                scope=options["scope"] or None,
                dry_run=dry_run,
                progress=self.show_progress if self.stdout.isatty() and not dry_run else None,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if self.stdout.isatty() and not dry_run and count:
            self.stdout.write("")  # leave the progress line
        verb = "Would purge" if dry_run else "Purged"
        self.stdout.write(self.style.SUCCESS(f"{verb} {records(count)}."))

    def show_progress(self, done: int, total: int) -> None:
        percent = 100 * done // total if total else 100
        self.stdout.write(f"\rPurging... {done:,}/{total:,} ({percent}%)", ending="")
        self.stdout.flush()


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
