"""``idempotency_cleanup`` and ``idempotency_recover``: thin, clear, and safe to run by hand."""

from __future__ import annotations

import io
import subprocess
from datetime import timedelta
from typing import Any

import pytest
from django.core.management.base import CommandError
from django.utils import timezone

from idempotency.management._common import parse_age
from idempotency.models import IdempotencyRecord, Status
from idempotency.resolvers import Resolution, register
from tests import output
from tests.factories import IdempotencyRecordFactory
from tests.output import timeless
from tests.processes import process_env, python

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
            return result.stdout

        assert manage("idempotency_cleanup", "--dry-run") == "Would purge 3 records.\n"
        assert manage("idempotency_cleanup") == "Purged 3 records.\n"
        assert manage("idempotency_recover").startswith("Recovered 1 record: ")
        assert IdempotencyRecord.objects.get().status == Status.NEEDS_REVIEW
