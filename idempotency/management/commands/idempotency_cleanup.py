"""``manage.py idempotency_cleanup``: purge expired records (the purge task's service)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from idempotency.fanout import purge_everywhere
from idempotency.management._common import (
    add_database_argument,
    add_dry_run_and_batch_size,
    chosen_database,
    parse_age,
    positive_int,
    records,
    shards,
    statuses,
)
from idempotency.models import PURGEABLE
from idempotency.retention import Progress
from idempotency.shards import Shard
from idempotency.stores import records_database


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
