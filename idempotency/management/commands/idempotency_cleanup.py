"""``manage.py idempotency_cleanup``: purge expired records (the purge task's service)."""

from __future__ import annotations

import re
from argparse import ArgumentParser
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from idempotency.fanout import purge_everywhere
from idempotency.models import PURGEABLE
from idempotency.retention import Progress
from idempotency.shards import Shard
from idempotency.stores import records_database

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
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run = bool(options["dry_run"])
        watched = self.stdout.isatty() and not dry_run
        try:
            counts = purge_everywhere(
                database=chosen_database(options["database"]),
                batch_size=positive_int(options["batch_size"], "--batch-size"),
                older_than=parse_age(options["older_than"]) if options["older_than"] else None,
                statuses=statuses(options["status"]),
                scope=options["scope"] or None,
                dry_run=dry_run,
                progress=self.progress_of if watched else None,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        verb = "Would purge" if dry_run else "Purged"
        count = sum(count for _, count in counts)
        if watched and count:
            self.stdout.write("")  # leave the progress line
        if len(counts) > 1:
            for shard, purged in counts:
                self.stdout.write(f"{shard.label}: {verb.lower()} {records(purged)}.")
            self.stdout.write(self.style.SUCCESS(f"{verb} {records(count)} in {shards(counts)}."))
        else:
            self.stdout.write(self.style.SUCCESS(f"{verb} {records(count)}."))

    def progress_of(self, shard: Shard) -> Progress:
        """The progress line of one shard's pass (named where there are several)."""
        named = "" if shard.label == records_database() else f" {shard.label}"

        def show(done: int, total: int) -> None:
            percent = 100 * done // total if total else 100
            self.stdout.write(f"\rPurging{named}... {done:,}/{total:,} ({percent}%)", ending="")
            self.stdout.flush()

        return show


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


def shards(results: list[Any]) -> str:
    return f"{len(results)} shard{'' if len(results) == 1 else 's'}"


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
