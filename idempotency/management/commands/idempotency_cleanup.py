"""``manage.py idempotency_cleanup``: purge expired records (the purge task's service)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from idempotency.management._common import (
    add_dry_run_and_batch_size,
    parse_age,
    positive_int,
    records,
    statuses,
)
from idempotency.models import PURGEABLE
from idempotency.retention import purge


class Command(BaseCommand):
    help = (
        "Delete idempotency records whose retention window has passed, in bounded batches. "
        "PROCESSING and NEEDS_REVIEW records are never deleted."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        add_dry_run_and_batch_size(
            parser,
            dry_run="Count what would be deleted; delete nothing.",
            batch="Rows deleted per transaction",
            setting="PURGE_BATCH_SIZE",
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
