"""``idempotency_cleanup`` and ``idempotency_recover``: thin, clear, and safe to run by hand."""

from __future__ import annotations

import io
import re
import subprocess
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from idempotency import progress
from idempotency.management import _common
from idempotency.management._common import parse_age
from idempotency.models import IdempotencyRecord, Status
from idempotency.resolvers import Resolution, register
from tests.support import output
from tests.support.factories import IdempotencyRecordFactory
from tests.support.output import timeless
from tests.support.processes import process_env, python

pytestmark = pytest.mark.django_db

OPERATION = "tests.commands"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(command: str, *args: str, stdout: io.StringIO | None = None, **options: Any) -> str:
    """The output without the summary's timing (``TestProgress`` reads that)."""
    return timeless(output.run(command, *args, stdout=stdout, **options))


def expired(count: int, **fields: Any) -> list[IdempotencyRecord]:
    return [IdempotencyRecordFactory(expired=True, **fields) for _ in range(count)]


@pytest.fixture
def resolver():
    register(OPERATION, lambda record: Resolution.not_done())
    yield
    from idempotency import resolvers

    resolvers._registry.pop(OPERATION, None)


class TestCleanup:
    def test_purges_and_says_how_many(self):
        expired(3)
        IdempotencyRecordFactory(succeeded=True)
        assert run("idempotency_cleanup") == "Purged 3 records.\n"
        assert IdempotencyRecord.objects.count() == 1

    def test_thousands_separator_and_singular(self):
        expired(1)
        assert run("idempotency_cleanup") == "Purged 1 record.\n"
        assert run("idempotency_cleanup") == "Purged 0 records.\n"

    def test_dry_run_deletes_nothing(self):
        expired(2)
        assert run("idempotency_cleanup", "--dry-run") == "Would purge 2 records.\n"
        assert IdempotencyRecord.objects.count() == 2

    def test_filters(self):
        expired(2, scope="user:1:orders.create")
        expired(1, scope="user:2:orders.create")
        IdempotencyRecordFactory(failed_final=True, expires_at=timezone.now() - timedelta(1))
        assert run("idempotency_cleanup", "--scope", "user:1:*") == "Purged 2 records.\n"
        assert run("idempotency_cleanup", "--status", "FAILED_FINAL") == "Purged 1 record.\n"
        assert run("idempotency_cleanup", "--status", "succeeded,failed_final") == (
            "Purged 1 record.\n"
        )

    def test_older_than(self):
        IdempotencyRecordFactory(succeeded=True, created_at=timezone.now() - timedelta(days=8))
        IdempotencyRecordFactory(succeeded=True)
        assert run("idempotency_cleanup", "--older-than", "7d") == "Purged 1 record.\n"
        assert IdempotencyRecord.objects.count() == 1

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--older-than", "7x"], "--older-than should be a positive number with a unit"),
            (["--older-than", "0d"], "--older-than should be a positive number with a unit"),
            (["--older-than", "3w"], "--older-than should be a positive number with a unit"),
            (["--status", "PROCESSING"], "never purged"),
            (["--status", "NEEDS_REVIEW"], "never purged"),
            (["--status", "bogus"], "--status should be one of"),
            (["--batch-size", "0"], "--batch-size should be a positive integer"),
            (["--batch-size", "many"], "--batch-size should be a positive integer"),
        ],
    )
    def test_bad_arguments(self, args, message):
        expired(1)
        with pytest.raises(CommandError, match=message):
            run("idempotency_cleanup", *args)
        assert IdempotencyRecord.objects.count() == 1

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("7d", timedelta(days=7)),
            ("12h", timedelta(hours=12)),
            ("30m", timedelta(minutes=30)),
            ("45s", timedelta(seconds=45)),
            ("2D", timedelta(days=2)),
        ],
    )
    def test_ages(self, text, expected):
        assert parse_age(text) == expected


class TestRecover:
    def test_one_pass_with_a_summary(self, resolver):
        for _ in range(2):
            IdempotencyRecordFactory(expired_lease=True, operation=OPERATION)
        IdempotencyRecordFactory(expired_lease=True, operation="tests.no_resolver")
        assert run("idempotency_recover") == (
            "Recovered 3 records: 0 succeeded, 2 released for retry, 1 need review, "
            "0 unknown (asked again later).\n"
        )
        statuses = sorted(IdempotencyRecord.objects.values_list("status", flat=True))
        assert statuses == [Status.FAILED_RETRYABLE] * 2 + [Status.NEEDS_REVIEW]

    def test_dry_run_changes_nothing(self, resolver):
        record = IdempotencyRecordFactory(expired_lease=True, operation=OPERATION)
        assert run("idempotency_recover", "--dry-run") == (
            "Would recover 1 record: 0 succeeded, 1 released for retry, 0 need review, "
            "0 unknown (asked again later).\n"
        )
        record.refresh_from_db()
        assert record.status == Status.PROCESSING

    def test_bad_batch_size(self):
        with pytest.raises(CommandError, match="--batch-size should be a positive integer"):
            run("idempotency_recover", "--batch-size", "-1")


class TestChosenRecords:
    """``--id``: an operator without the admin resolves stuck records (the admin's service)."""

    def test_their_resolver_is_asked(self, resolver):
        stuck = IdempotencyRecordFactory(expired_lease=True, operation=OPERATION)
        other = IdempotencyRecordFactory(expired_lease=True, operation=OPERATION)
        assert run("idempotency_recover", "--id", str(stuck.pk)) == (
            f"Record {stuck.pk}: Status PROCESSING → FAILED_RETRYABLE. Resolver: released.\n"
            "Changed 1 record.\n"
        )
        assert status(stuck) == Status.FAILED_RETRYABLE
        assert status(other) == Status.PROCESSING

    def test_marked_by_hand(self):
        review = [IdempotencyRecordFactory(needs_review=True) for _ in range(2)]
        ids = [arg for record in review for arg in ("--id", str(record.pk))]
        out = run("idempotency_recover", *ids, "--mark", "final", verbosity=0)
        assert out == ""
        assert [status(record) for record in review] == [Status.FAILED_FINAL] * 2

    def test_marked_succeeded_with_what_the_first_attempt_made(self):
        record = IdempotencyRecordFactory(needs_review=True)
        run(
            "idempotency_recover",
            "--id",
            str(record.pk),
            "--mark",
            "succeeded",
            "--resource-id",
            "order-17",
        )
        record.refresh_from_db()
        assert (record.status, record.resource_id) == (Status.SUCCEEDED, "order-17")

    def test_marked_succeeded_with_the_answer_repeats_get(self):
        record = IdempotencyRecordFactory(needs_review=True, request_method="POST")
        out = run(
            "idempotency_recover",
            *("--id", str(record.pk), "--mark", "succeeded", "--resource-id", "17"),
            *("--status", "201", "--body", '{"id": 17}'),
        )
        assert out == (
            f"Record {record.pk}: Status NEEDS_REVIEW → SUCCEEDED. Resource id '' → '17'. "
            "Repeats get status 201, 10 bytes.\nChanged 1 record.\n"
        )
        record.refresh_from_db()
        assert (record.status, record.response_status) == (Status.SUCCEEDED, 201)
        assert bytes(record.response_body) == b'{"id": 17}'
        assert record.response_headers == [["Content-Type", "application/json"]]

    @pytest.mark.parametrize(
        ("answer", "message"),
        [
            (["--status", "404"], "Not a 2xx status: 404"),
            (["--body", "order 17 made"], "Not JSON"),
        ],
    )
    def test_a_bad_answer_changes_no_record(self, answer, message):
        # The second record is a function's: its repeats return the body's JSON.
        review = [
            IdempotencyRecordFactory(needs_review=True, request_method="POST"),
            IdempotencyRecordFactory(needs_review=True, request_method=""),
        ]
        ids = [arg for record in review for arg in ("--id", str(record.pk))]
        with pytest.raises(CommandError, match=message):
            run(
                "idempotency_recover",
                *ids,
                *("--mark", "succeeded", "--content-type", "text/plain", *answer),
            )
        assert [status(record) for record in review] == [Status.NEEDS_REVIEW] * 2

    def test_refused_and_missing_records_fail_the_command(self):
        done = IdempotencyRecordFactory(succeeded=True)
        review = IdempotencyRecordFactory(needs_review=True)
        err = io.StringIO()
        with pytest.raises(CommandError, match="2 of 3 records not changed"):
            call_command(
                "idempotency_recover",
                *("--id", str(done.pk), "--id", str(review.pk), "--id", "999999"),
                "--mark",
                "retry",
                stdout=io.StringIO(),
                stderr=err,
            )
        assert err.getvalue().splitlines() == [
            f"Refused: {done}: a SUCCEEDED record cannot become FAILED_RETRYABLE: "
            "only a PROCESSING record with an expired lease or a NEEDS_REVIEW record can be "
            "resolved, and not while another worker holds it.",
            "No record 999999 in default.",
        ]
        assert status(done) == Status.SUCCEEDED
        assert status(review) == Status.FAILED_RETRYABLE

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--mark", "final"], "--mark, --resource-id, --status, --body and --content-type"),
            (["--status", "200"], "need the records chosen with --id"),
            (["--id", "1", "--dry-run"], "--dry-run reports a recovery pass"),
            (["--id", "1", "--resource-id", "x"], "--resource-id goes with --mark succeeded"),
            (["--id", "1", "--mark", "final", "--resource-id", "x"], "--resource-id goes with"),
            (
                ["--id", "1", "--mark", "retry", "--body", "", "--status", "200"],
                "--status and --body go",
            ),
        ],
    )
    def test_options_that_do_not_go_together(self, args, message):
        with pytest.raises(CommandError, match=message):
            run("idempotency_recover", *args)


def status(record: IdempotencyRecord) -> str:
    record.refresh_from_db()
    return record.status


PROGRESS_LINE = re.compile(
    r"^(?P<verb>Purging|Recovering)\.\.\. (?P<batches>\d+) batch(?:es)?, (?P<done>[\d,]+)"
    r"(?:/(?P<total>[\d,]+) records \(\d+%\)| records?(?: \((?P<counts>[^)]*)\))?)"
    r", (?P<rate>[\d,.]+) records/s, (?P<elapsed>[\d.]+) s$"
)


def progress_lines(text: str) -> list[dict[str, str]]:
    return [match.groupdict() for line in text.splitlines() if (match := PROGRESS_LINE.match(line))]


class Ticking:
    """A clock that moves on a second each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> Ticking:
    clock = Ticking()
    monkeypatch.setattr(progress, "monotonic", clock)
    monkeypatch.setattr(_common, "monotonic", clock)
    return clock


class TestProgress:
    """Not on a terminal (cron, a container's log): a line every --progress-every seconds."""

    def test_cleanup_says_where_it_stands_after_each_batch(self):
        expired(5)
        out = run("idempotency_cleanup", "--batch-size", "2", "--progress-every", "0")
        lines = progress_lines(out)
        assert [(line["batches"], line["done"], line["total"]) for line in lines] == [
            ("1", "2", "5"),
            ("2", "4", "5"),
            ("3", "5", "5"),
        ]
        assert out.splitlines()[-1] == "Purged 5 records."
        assert len(out.splitlines()) == 4

    def test_recover_counts_the_outcomes_so_far(self, resolver):
        for _ in range(3):
            IdempotencyRecordFactory(expired_lease=True, operation=OPERATION)
        out = run("idempotency_recover", "--batch-size", "2", "--progress-every", "0")
        assert [line["counts"] for line in progress_lines(out)] == [
            "0 succeeded, 2 released, 0 needs review, 0 unknown",
            "0 succeeded, 3 released, 0 needs review, 0 unknown",
        ]
        assert out.splitlines()[-1].startswith("Recovered 3 records: 0 succeeded, 3 released")

    def test_a_line_at_most_every_so_many_seconds(self, ticking):
        expired(12)
        out = run("idempotency_cleanup", "--batch-size", "1", "--progress-every", "5")
        lines = progress_lines(out)
        assert 0 < len(lines) < 12
        for line in lines:
            done, elapsed = int(line["done"]), float(line["elapsed"])
            assert float(line["rate"]) == pytest.approx(done / elapsed, abs=0.05)
        times = [float(line["elapsed"]) for line in lines]
        assert all(later - earlier >= 5 for earlier, later in zip(times, times[1:], strict=False))

    def test_a_short_run_prints_its_summary_only(self, monkeypatch):
        monkeypatch.setattr(progress, "monotonic", lambda: 0.0)  # the 2 s never pass
        expired(5)
        assert run("idempotency_cleanup", "--batch-size", "2") == "Purged 5 records.\n"

    def test_the_summary_gives_the_time_and_the_rate(self, ticking):
        expired(5)
        out = output.run("idempotency_cleanup", "--progress-every", "1000")
        assert re.fullmatch(r"Purged 5 records \(\d+\.0 s, \d+\.\d records/s\)\.\n", out)
        assert output.run("idempotency_cleanup", "--dry-run") == "Would purge 0 records (1.0 s).\n"

    def test_quiet_with_verbosity_0(self, resolver):
        expired(5)
        IdempotencyRecordFactory(expired_lease=True, operation=OPERATION)
        for command in ("idempotency_cleanup", "idempotency_recover"):
            out = run(command, "--batch-size", "1", "--progress-every", "0", verbosity=0)
            assert out == ""
        assert not IdempotencyRecord.objects.filter(status=Status.PROCESSING).exists()
        assert IdempotencyRecord.objects.count() == 1

    def test_on_a_terminal_one_line_updated_as_it_goes(self):
        expired(5)
        terminal = run("idempotency_cleanup", "--batch-size", "2", stdout=Terminal())
        updates = terminal.split("\r")[1:]
        assert [update.split(",")[:2] for update in updates] == [
            ["Purging... 1 batch", " 2/5 records (40%)"],
            ["Purging... 2 batches", " 4/5 records (80%)"],
            ["Purging... 3 batches", " 5/5 records (100%)"],
        ]
        assert terminal.count("\n") == 2 and terminal.endswith("\nPurged 5 records.\n")

    def test_negative_interval_refused(self):
        with pytest.raises(CommandError, match="--progress-every should be 0 or more seconds"):
            run("idempotency_cleanup", "--progress-every", "-1")


class TestByHand:
    """Run as an operator would: a separate process, exit codes, no tracebacks."""

    @pytest.mark.parametrize(
        "args",
        [
            ["idempotency_cleanup", "--older-than", "soon"],
            ["idempotency_cleanup", "--status", "PROCESSING"],
            ["idempotency_recover", "--batch-size", "zero"],
            ["idempotency_cleanup", "--no-such-option"],
        ],
    )
    def test_bad_arguments_are_one_clear_line(self, args):
        result = subprocess.run(
            python("-m", "django", *args),
            env=process_env(database=False),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0
        assert "Traceback" not in result.stderr
        assert "error" in result.stderr.lower()

    @pytest.mark.server_db
    @pytest.mark.django_db(transaction=True)
    def test_against_the_database(self):
        expired(3)
        IdempotencyRecordFactory(expired_lease=True, operation="tests.no_resolver")
        env = process_env()

        def manage(*args: str) -> str:
            result = subprocess.run(
                python("-m", "django", *args), env=env, capture_output=True, text=True, timeout=60
            )
            assert result.returncode == 0, result.stderr
            return timeless(result.stdout)

        assert manage("idempotency_cleanup", "--dry-run") == "Would purge 3 records.\n"
        assert manage("idempotency_cleanup") == "Purged 3 records.\n"
        assert manage("idempotency_recover").startswith("Recovered 1 record: ")
        assert IdempotencyRecord.objects.get().status == Status.NEEDS_REVIEW
