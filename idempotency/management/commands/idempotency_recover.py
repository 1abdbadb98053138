"""``manage.py idempotency_recover``: one recovery pass (the recovery task's service)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from idempotency.fanout import recover_everywhere, total
from idempotency.management._common import (
    add_database_argument,
    add_dry_run_and_batch_size,
    chosen_database,
    positive_int,
    records,
    shards,
)
from idempotency.recovery import RecoveryReport


class Command(BaseCommand):
    help = (
        "Settle PROCESSING records whose lease expired by asking their resolver: "
        "succeeded, released for retry, or needs review."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        add_dry_run_and_batch_size(
            parser,
            dry_run="Ask the resolvers and report what would happen; change nothing.",
            batch="Records per transaction",
            setting="RECOVERY_BATCH_SIZE",
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        batch_size = positive_int(options["batch_size"], "--batch-size")
        dry_run = bool(options["dry_run"])
        try:
            reports = recover_everywhere(
                database=chosen_database(options["database"]),
                batch_size=batch_size,
                dry_run=dry_run,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if len(reports) == 1:
            self.stdout.write(self.style.SUCCESS(summary(reports[0][1])))
            return
        for shard, report in reports:
            self.stdout.write(f"{shard.label}: {summary(report)}")
        everything = summary(total((report for _, report in reports), dry_run))
        self.stdout.write(self.style.SUCCESS(f"{everything[:-1]} in {shards(reports)}."))


def summary(report: RecoveryReport) -> str:
    verb = "Would recover" if report.dry_run else "Recovered"
    parts = [
        f"{report.succeeded:,} succeeded",
        f"{report.released:,} released for retry",
        f"{report.needs_review:,} need review",
        f"{report.unknown:,} unknown (asked again later)",
    ]
    if report.skipped:
        parts.append(f"{report.skipped:,} skipped (changed meanwhile)")
    return f"{verb} {records(report.examined)}: {', '.join(parts)}."
