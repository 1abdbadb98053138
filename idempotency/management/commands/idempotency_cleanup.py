"""``manage.py idempotency_cleanup``: purge expired records (the purge task's service)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from idempotency.management._common import (
    ProgressLines,
    Stopwatch,
    add_shared_arguments,
    chosen_database,
    parse_age,
    positive_int,
    records,
    shards,
    statuses,
)
from idempotency.models import PURGEABLE
from idempotency.retention import purge_everywhere, purge_orphan_steps_everywhere
from idempotency.shards import Shard


class Command(BaseCommand):
    help = (
        "Delete idempotency records whose retention window has passed, in bounded batches, "
        "and any step whose record is gone. PROCESSING and NEEDS_REVIEW records are never "
        "deleted."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        add_shared_arguments(
            parser,
            dry_run="Count what would be deleted; delete nothing.",
            batch="The most rows deleted per transaction, each sized by PURGE_BATCH_SECONDS",
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
        lines = ProgressLines(self, "Purging", options)
        watch = Stopwatch()
        database = chosen_database(options["database"])
        batch_size = positive_int(options["batch_size"], "--batch-size")
        try:
            counts = purge_everywhere(
                database=database,
                batch_size=batch_size,
                older_than=parse_age(options["older_than"]) if options["older_than"] else None,
                statuses=statuses(options["status"]),
                scope=options["scope"] or None,
                dry_run=dry_run,
                progress=None if dry_run else lines.callback,
            )
            orphans = purge_orphan_steps_everywhere(
                database=database, batch_size=batch_size, dry_run=dry_run
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            lines.close()
        if options["verbosity"] > 0:
            self.summary(counts, sum(count for _, count in orphans), dry_run, watch)

    def summary(
        self, counts: list[tuple[Shard, int]], orphans: int, dry_run: bool, watch: Stopwatch
    ) -> None:
        verb = "Would purge" if dry_run else "Purged"
        count = sum(count for _, count in counts)
        took = watch.took(None if dry_run else count)
        # Steps an earlier release left without their record: said only where there were some.
        steps = f" and {orphans:,} step{'' if orphans == 1 else 's'} whose record was gone"
        steps = steps if orphans else ""
        if len(counts) > 1:
            for shard, purged in counts:
                self.stdout.write(f"{shard.label}: {verb.lower()} {records(purged)}.")
            message = f"{verb} {records(count)}{steps} in {shards(counts)} {took}."
        else:
            message = f"{verb} {records(count)}{steps} {took}."
        self.stdout.write(self.style.SUCCESS(message))
