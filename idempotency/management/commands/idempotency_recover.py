"""``manage.py idempotency_recover``: one recovery pass (the recovery task's service).

With ``--id``, the chosen records instead, through the admin's service
(``idempotency.recovery``): their resolvers, or ``--mark`` a status.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from idempotency import recovery
from idempotency.management._common import (
    ProgressLines,
    Stopwatch,
    add_shared_arguments,
    chosen_database,
    positive_int,
    records,
    shards,
)
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import StoredResponse
from idempotency.recovery import RecoveryReport, recover_everywhere, total
from idempotency.shards import Shard
from idempotency.shards import shards as shards_of

# What repeats of a record marked succeeded get, as the operator gives it.
ANSWER = ("resource_id", "status", "body", "content_type")
MARKS = {
    "succeeded": Status.SUCCEEDED,
    "retry": Status.FAILED_RETRYABLE,
    "final": Status.FAILED_FINAL,
}


class Command(BaseCommand):
    help = (
        "Settle PROCESSING records whose lease expired by asking their resolver: "
        "succeeded, released for retry, or needs review. With --id, only those records "
        "(their resolver, or --mark a status)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        add_shared_arguments(
            parser,
            dry_run="Ask the resolvers and report what would happen; change nothing.",
            batch="Records per transaction",
            setting="RECOVERY_BATCH_SIZE",
        )
        parser.add_argument(
            "--id",
            action="append",
            type=int,
            dest="ids",
            metavar="ID",
            help="Only this record (repeatable): a PROCESSING record whose lease expired or "
            "a NEEDS_REVIEW record. Its resolver is asked now, unless --mark.",
        )
        parser.add_argument(
            "--mark",
            choices=sorted(MARKS),
            help="With --id: settle the records by hand instead of asking their resolver "
            "(succeeded: SUCCEEDED, retry: FAILED_RETRYABLE, final: FAILED_FINAL).",
        )
        parser.add_argument(
            "--resource-id",
            metavar="RID",
            help="With --mark succeeded: what the first attempt created, given to repeats.",
        )
        parser.add_argument(
            "--status",
            type=int,
            metavar="CODE",
            help="With --mark succeeded: the 2xx status repeats get (default: the stored "
            "one; with none stored, 201 for a POST, else 200).",
        )
        parser.add_argument(
            "--body",
            metavar="TEXT",
            help="With --mark succeeded: the body repeats get, e.g. the created resource's "
            "JSON (default: the stored one; '' for none).",
        )
        parser.add_argument(
            "--content-type",
            metavar="TYPE",
            help="With --mark succeeded: the body's content type (default: the stored one, "
            "else application/json).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        database = chosen_database(options["database"])
        if options["ids"]:
            self.resolve_chosen(options["ids"], database, options)
            return
        if options["mark"] or any(options[name] is not None for name in ANSWER):
            raise CommandError(
                "--mark, --resource-id, --status, --body and --content-type need the records "
                "chosen with --id."
            )
        lines = ProgressLines(self, "Recovering", options)
        watch = Stopwatch()
        try:
            reports = recover_everywhere(
                database=database,
                batch_size=positive_int(options["batch_size"], "--batch-size"),
                dry_run=bool(options["dry_run"]),
                progress=lines.callback,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            lines.close()
        if options["verbosity"] > 0:
            self.summary(reports, bool(options["dry_run"]), watch)

    def summary(
        self, reports: list[tuple[Shard, RecoveryReport]], dry_run: bool, watch: Stopwatch
    ) -> None:
        everything = total((report for _, report in reports), dry_run)
        took = watch.took(everything.examined)
        if len(reports) == 1:
            self.stdout.write(self.style.SUCCESS(f"{summary(everything)} {took}."))
            return
        for shard, report in reports:
            self.stdout.write(f"{shard.label}: {summary(report)}.")
        self.stdout.write(self.style.SUCCESS(f"{summary(everything)} in {shards(reports)} {took}."))

    def resolve_chosen(self, ids: list[int], database: str | None, options: dict[str, Any]) -> None:
        if options["dry_run"]:
            raise CommandError("--dry-run reports a recovery pass; it does not go with --id.")
        given = [name for name in ANSWER if options[name] is not None]
        if given and options["mark"] != "succeeded":
            flags = " and ".join("--" + name.replace("_", "-") for name in given)
            raise CommandError(
                f"{flags} {'goes' if len(given) == 1 else 'go'} with --mark succeeded."
            )
        shard = one_shard(database)
        with shard.active():
            chosen = list(
                IdempotencyRecord.objects.using(shard.alias).filter(pk__in=ids).order_by("pk")
            )
            report = settle(chosen, options)
        missing = sorted(set(ids) - {record.pk for record in chosen})
        for change in report.changes:
            outcome = f" Resolver: {change.outcome}." if change.outcome else ""
            if options["verbosity"] > 0:
                self.stdout.write(f"Record {change.after.pk}: {change.describe()}{outcome}")
        for refusal in report.refused:
            self.stderr.write(f"Refused: {refusal}")
        for pk in missing:
            self.stderr.write(f"No record {pk} in {shard.label}.")
        if report.refused or missing:
            raise CommandError(
                f"{len(report.refused) + len(missing)} of {records(len(set(ids)))} not changed."
            )
        if options["verbosity"] > 0:
            self.stdout.write(self.style.SUCCESS(f"Changed {records(len(report.changes))}."))


def settle(chosen: list[IdempotencyRecord], options: dict[str, Any]) -> recovery.ResolutionReport:
    mark, resource_id = options["mark"], options["resource_id"]
    if mark is None:
        return recovery.run_resolvers(chosen)
    answered = any(options[name] is not None for name in ("status", "body", "content_type"))
    responses = _answers(chosen, options) if answered else None
    given = (lambda record: resource_id) if resource_id else None
    return recovery.mark_records(chosen, MARKS[mark], resource_ids=given, responses=responses)


def _answers(chosen: list[IdempotencyRecord], options: dict[str, Any]) -> recovery.Responses:
    """Every record's answer, checked before any record moves: a bad one changes nothing."""
    answers = {record.pk: _answer(record, options) for record in chosen}
    return lambda record: answers[record.pk]


def _answer(record: IdempotencyRecord, options: dict[str, Any]) -> StoredResponse:
    try:
        return recovery.operator_response(
            record,
            status=options["status"],
            body=options["body"],
            content_type=options["content_type"],
        )
    except ValueError as error:
        raise CommandError(f"Record {record.pk}: {error}") from None


def one_shard(database: str | None) -> Shard:
    """Ids are a shard's own: the chosen records must be looked for in one shard."""
    found = shards_of(database)
    if len(found) > 1:
        raise CommandError(
            f"--id takes records of one shard; there are {len(found)} "
            f"({', '.join(shard.label for shard in found)}). Choose a database with "
            "--database ALIAS, or a tenant's schema with "
            "`manage.py tenant_command idempotency_recover --schema=NAME ...`."
        )
    return found[0]


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
    return f"{verb} {records(report.examined)}: {', '.join(parts)}"
