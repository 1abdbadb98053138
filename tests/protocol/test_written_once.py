"""IN_FLIGHT "run": atomic mode with the record written once, at the end of the view's transaction.

On every database the sequential cases; on PostgreSQL and MariaDB, real threads on their
own connections: duplicates run their work, exactly one commits it, and every answer is
its outcome.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from idempotency.exceptions import KeyReused
from idempotency.models import IdempotencyRecord, Status
from idempotency.protocol import Operation
from idempotency.protocol import execute as core  # the module
from tests.support.factories import UserFactory
from tests.support.threads import run_in_threads
from tests.testapp.models import Order
from tests.unit.protocol.test_execute import OTHER_HASH, Business, existing, operation

RECORDS = IdempotencyRecord._meta.db_table


def once(**changes: Any) -> Operation:
    return operation(in_flight="run", **changes)


def statements_on_records(queries: CaptureQueriesContext) -> list[str]:
    """The kinds of statement on the records (after MariaDB's per-statement lock wait)."""
    statements = [BOUND.sub("", q["sql"]) for q in queries.captured_queries]
    return [sql.split()[0].upper() for sql in statements if RECORDS in sql]


BOUND = re.compile(r"^SET STATEMENT innodb_lock_wait_timeout=\d+ FOR ")


@pytest.fixture
def business(db) -> Business:
    return Business(owner=UserFactory())


class TestOneAtATime:
    pytestmark = pytest.mark.django_db

    @pytest.fixture(autouse=True)
    def never_read_first(self, settings):
        settings.IDEMPOTENCY = {"READ_FIRST": "never"}

    def test_a_first_request_inserts_its_finished_record_once(self, business):
        with CaptureQueriesContext(connection) as queries:
            order = business.run(once())
        assert statements_on_records(queries) == ["INSERT"]  # no claim, no finish UPDATE
        record = IdempotencyRecord.objects.get()
        assert record.status == Status.SUCCEEDED
        assert record.resource_id == str(order.pk)
        assert record.completed_at is not None and record.expires_at is not None
        assert business.runs == 1 and Order.objects.count() == 1

    def test_a_repeat_runs_loses_at_the_insert_and_is_answered_with_the_first(self, business):
        business.run(once())
        assert business.run(once()) == "replayed"
        assert Order.objects.count() == 1  # the repeat's order rolled back with it
        assert business.replays[0].pk == IdempotencyRecord.objects.get().pk

    def test_a_repeat_that_loses_at_the_insert_counts_as_one_replay_for_read_first(
        self, business, monkeypatch
    ):
        # READ_FIRST "auto" starts reading first once repeats are a third of the requests:
        # a repeat that ran the work and lost must count as a replay alone, not also as a
        # first request, or twice as many repeats would run the work before it starts.
        share = core.ReplayShare()
        monkeypatch.setattr(core, "replay_share", share)
        name, weight = once().name, share.WEIGHT
        business.run(once())
        assert share._shares[name] == 0.0  # one first request
        assert business.run(once()) == "replayed"
        assert business.run(once()) == "replayed"
        assert business.runs == 3  # both repeats ran the work (READ_FIRST "never") and lost
        # Two replays after a first request: W, then W + (1 - W) * W.
        assert share._shares[name] == pytest.approx(2 * weight - weight**2, rel=1e-12)

    def test_a_repeat_read_first_does_not_run_the_work(self, business, settings):
        settings.IDEMPOTENCY = {"READ_FIRST": "always"}
        business.run(once())
        assert business.run(once()) == "replayed"
        assert business.runs == 1

    def test_a_reused_key_is_refused_and_nothing_it_wrote_stays(self, business):
        business.run(once())
        with pytest.raises(KeyReused):
            business.run(once(request_hash=OTHER_HASH))
        assert Order.objects.count() == 1

    def test_an_outcome_not_recorded_leaves_no_record_and_the_key_free(self, business):
        business.run(once(), decide=lambda value, attempt: None)
        assert not IdempotencyRecord.objects.exists() and not Order.objects.exists()
        business.run(once())
        assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED

    def test_a_key_held_otherwise_is_decided_by_the_claim(self, business):
        retryable = existing("failed_retryable", once())
        business.run(once())
        record = IdempotencyRecord.objects.get()
        assert record.pk == retryable.pk and record.status == Status.SUCCEEDED
        assert Order.objects.count() == 1  # the write-once try rolled back; the claim's run stays

    def test_lease_mode_refuses_it(self):
        with pytest.raises(ValueError, match="atomic mode"):
            operation(mode="lease", in_flight="run")

    def test_set_project_wide_it_leaves_lease_mode_waiting(self, settings):
        settings.IDEMPOTENCY = {"IN_FLIGHT": "run"}
        assert operation().writes_once
        assert not operation(mode="lease").writes_once


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
class TestConcurrentDuplicates:
    THREADS = 8

    def test_duplicates_run_and_exactly_one_commits(self):
        owner = UserFactory()
        ran = threading.Barrier(self.THREADS, timeout=30)
        business = Business(owner=owner)

        def work(attempt: Any) -> Order:
            order = Order.objects.create(owner=owner, sku="a", quantity=1)
            ran.wait()  # every duplicate has written before any inserts its record
            return order

        answers = run_in_threads(
            self.THREADS,
            lambda index: business.run(once(lock_timeout=30), work=work),
        )
        assert Order.objects.count() == 1
        record = IdempotencyRecord.objects.get()
        winners = [answer for answer in answers if isinstance(answer, Order)]
        assert len(winners) == 1 and record.resource_id == str(winners[0].pk)
        assert answers.count("replayed") == self.THREADS - 1
        assert all(replayed.pk == record.pk for replayed in business.replays)

    def test_a_duplicate_waiting_on_a_first_that_rolls_back_is_the_one_recorded(self):
        owner = UserFactory()
        inserted, waiting = threading.Event(), threading.Event()
        first_thread: list[threading.Thread] = []

        def give_up_after_inserting(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
            result = execute(sql, params, many, context)
            if sql.lstrip().upper().startswith("INSERT") and RECORDS in sql:
                inserted.set()
                waiting.wait(5)  # the duplicate is blocked on this uncommitted insert
                raise RuntimeError("the first attempt dies before its commit")
            return result

        def first() -> Any:
            first_thread.append(threading.current_thread())
            with connection.execute_wrapper(give_up_after_inserting):
                return Business(owner=owner).run(once(lock_timeout=30))

        def second() -> Any:
            inserted.wait(10)
            timer = threading.Timer(0.5, waiting.set)  # its insert waits meanwhile
            timer.start()
            return Business(owner=owner).run(once(lock_timeout=30))

        answers = run_in_threads(2, lambda index: (first, second)[index](), allowing_errors=True)
        assert isinstance(answers[0], RuntimeError)
        assert isinstance(answers[1], Order)
        record = IdempotencyRecord.objects.get()
        assert record.resource_id == str(answers[1].pk)
        assert list(Order.objects.values_list("pk", flat=True)) == [answers[1].pk]


def test_the_option_is_an_operations_own():
    assert replace(operation(), in_flight="run").in_flight == "run"
