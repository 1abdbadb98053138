"""``idempotency.protocol.execute`` with plain callables: the protocol without HTTP."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from functools import partial
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db import OperationalError as DjangoOperationalError
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone
from django.utils.connection import ConnectionDoesNotExist

from idempotency import signals
from idempotency.conf import retention_for
from idempotency.exceptions import (
    CrossDatabaseWrite,
    DatabaseUnavailable,
    KeyInUse,
    KeyReused,
    KeyUnderReview,
    LeaseLost,
    OutcomeUnknown,
)
from idempotency.fingerprint import digest_of, fingerprint
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Attempt, Operation
from idempotency.protocol.execute import _guarded, _refusal, execute, writes_only_to
from tests.support.factories import IdempotencyRecordFactory, UserFactory
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

HASH = fingerprint(["POST", "/orders/", '{"sku":"a"}'])
OTHER_HASH = fingerprint(["POST", "/orders/", '{"sku":"b"}'])
SCOPE = "user:1:tests.create_order"


def operation(**changes: Any) -> Operation:
    base = Operation(
        scope=SCOPE,
        key="key-1",
        request_hash=HASH,
        name="tests.create_order",
        method="POST",
        path="/orders/",
    )
    return replace(base, **changes)


def succeeded(order: Order, attempt: Attempt) -> Outcome:
    body = json.dumps({"id": order.pk, "sku": order.sku}).encode()
    headers = [("Content-Type", "application/json"), ("Location", f"/orders/{order.pk}/")]
    return Outcome(Status.SUCCEEDED, StoredResponse(201, headers, body), resource_id=str(order.pk))


@dataclass
class Business:
    """The work under test: creates one Order per run and counts its runs."""

    owner: Any
    runs: int = 0
    replays: list[IdempotencyRecord] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)

    def work(self, attempt: Attempt) -> Order:
        self.runs += 1
        self.attempts.append(attempt)
        return Order.objects.create(owner=self.owner, sku="a", quantity=1)

    def replay(self, record: IdempotencyRecord) -> str:
        self.replays.append(record)
        return "replayed"

    def run(
        self,
        op: Operation | None = None,
        *,
        work: Callable[[Attempt], Any] | None = None,
        decide: Callable[[Any, Attempt], Outcome | None] = succeeded,
    ) -> Any:
        return execute(op or operation(), work or self.work, decide=decide, replay=self.replay)


@pytest.fixture
def business() -> Business:
    return Business(owner=UserFactory())


def record(op: Operation | None = None) -> IdempotencyRecord:
    op = op or operation()
    return IdempotencyRecord.objects.get(scope=op.scope, idem_key=op.key)


def snapshot(instance: IdempotencyRecord) -> dict[str, Any]:
    instance.refresh_from_db()
    values = {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}
    values["response_body"] = bytes(values["response_body"] or b"")
    return values


def existing(trait: str, op: Operation | None = None, **fields: Any) -> IdempotencyRecord:
    op = op or operation()
    defaults = {"scope": op.scope, "idem_key": op.key, "request_hash": op.request_hash}
    defaults.update(fields)
    defaults["request_hash"] = digest_of(defaults["request_hash"])
    return IdempotencyRecordFactory(**{trait: True}, **defaults)


def db_now() -> datetime:
    return IdempotencyRecord.objects.annotate(now=Now()).values_list("now", flat=True).first()


@contextmanager
def received(signal: Any) -> Iterator[list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        calls.append(kwargs)

    signal.connect(receiver, weak=False)
    try:
        yield calls
    finally:
        signal.disconnect(receiver)


class TestFirstCall:
    def test_runs_once_and_records_success(self, business):
        order = business.run()
        assert business.runs == 1
        stored = record()
        assert stored.status == Status.SUCCEEDED
        assert stored.response_status == 201
        assert json.loads(bytes(stored.response_body)) == {"id": order.pk, "sku": "a"}
        assert stored.response_headers == [
            ["Content-Type", "application/json"],
            ["Location", f"/orders/{order.pk}/"],
        ]
        assert stored.resource_id == str(order.pk)

    def test_record_describes_the_request(self, business):
        business.run()
        stored = record()
        assert (stored.request_hash, stored.operation) == (digest_of(HASH), "tests.create_order")
        assert (stored.request_method, stored.request_path) == ("POST", "/orders/")
        assert stored.attempts == 1
        assert len(stored.owner_token) == 16
        assert stored.lease_until is None
        assert stored.completed_at is not None

    def test_work_sees_its_claim(self, business):
        business.run()
        (attempt,) = business.attempts
        assert attempt.record.pk == record().pk
        assert attempt.owner_token == record().owner_token
        assert attempt.operation == operation()

    def test_resource_id_set_by_the_work_is_kept(self, business):
        def work(attempt: Attempt) -> str:
            attempt.resource_id = "invoice-9"
            return "done"

        business.run(work=work, decide=lambda value, attempt: Outcome(Status.SUCCEEDED))
        assert record().resource_id == "invoice-9"

    def test_outcome_without_response(self, business):
        business.run(decide=lambda order, attempt: Outcome(Status.SUCCEEDED))
        stored = record()
        assert stored.response_status is None
        assert stored.response_body is None
        assert stored.response_headers == []

    def test_signals_claim_and_completion(self, business):
        with (
            received(signals.record_claimed) as claims,
            received(signals.record_completed) as completions,
        ):
            business.run()
        assert [call["reclaimed"] for call in claims] == [False]
        assert [call["status"] for call in completions] == [Status.SUCCEEDED]


class TestRepeat:
    def test_replays_without_running(self, business):
        business.run()
        assert business.run() == "replayed"
        assert business.runs == 1
        assert Order.objects.count() == 1
        (replayed,) = business.replays
        assert replayed.pk == record().pk
        assert replayed.response_status == 201

    def test_replay_changes_nothing(self, business):
        business.run()
        before = snapshot(record())
        business.run()
        assert snapshot(record()) == before

    def test_replay_signal(self, business):
        business.run()
        with received(signals.response_replayed) as replays:
            business.run()
        assert [call["record"].pk for call in replays] == [record().pk]

    def test_different_hash_is_key_reused_and_nothing_changes(self, business):
        business.run()
        before = snapshot(record())
        with received(signals.key_reused) as reuses, pytest.raises(KeyReused):
            business.run(operation(request_hash=OTHER_HASH))
        assert business.runs == 1
        assert business.replays == []
        assert Order.objects.count() == 1
        assert snapshot(record()) == before
        assert len(reuses) == 1

    def test_same_key_in_another_scope_is_independent(self, business):
        business.run()
        business.run(operation(scope="user:2:tests.create_order", request_hash=OTHER_HASH))
        assert business.runs == 2
        assert IdempotencyRecord.objects.filter(idem_key="key-1").count() == 2

    def test_other_key_runs(self, business):
        business.run()
        business.run(operation(key="key-2"))
        assert business.runs == 2


class TestUnrecordedOutcome:
    def test_none_rolls_back_business_writes_and_record(self, business):
        result = business.run(decide=lambda order, attempt: None)
        assert isinstance(result, Order)  # the caller still gets its value back
        assert Order.objects.count() == 0
        assert IdempotencyRecord.objects.count() == 0

    def test_key_is_free_again(self, business):
        business.run(decide=lambda order, attempt: None)
        business.run()
        assert business.runs == 2
        assert record().status == Status.SUCCEEDED
        assert record().attempts == 1
        assert Order.objects.count() == 1

    def test_exception_rolls_back_and_propagates(self, business):
        def failing(attempt: Attempt) -> None:
            business.work(attempt)
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            business.run(work=failing)
        assert Order.objects.count() == 0
        assert IdempotencyRecord.objects.count() == 0
        business.run()
        assert record().status == Status.SUCCEEDED

    def test_exception_in_decide_rolls_back(self, business):
        def explode(order: Order, attempt: Attempt) -> Outcome:
            raise ValueError("cannot decide")

        with pytest.raises(ValueError):
            business.run(decide=explode)
        assert Order.objects.count() == 0
        assert IdempotencyRecord.objects.count() == 0

    def test_rollback_keeps_the_callers_outer_transaction(self, business):
        with transaction.atomic():
            kept = Order.objects.create(owner=business.owner, sku="outer", quantity=1)
            business.run(decide=lambda order, attempt: None)
        assert list(Order.objects.all()) == [kept]


class TestExistingStates:
    def test_failed_retryable_is_reclaimed(self, business):
        old = existing("failed_retryable")
        with received(signals.record_claimed) as claims:
            business.run()
        assert business.runs == 1
        stored = record()
        assert stored.pk == old.pk
        assert stored.status == Status.SUCCEEDED
        assert stored.attempts == 2
        assert stored.version == old.version + 2  # re-claimed, then finished
        assert stored.owner_token != old.owner_token
        assert business.attempts[0].owner_token == stored.owner_token
        assert [call["reclaimed"] for call in claims] == [True]

    def test_unrecorded_retry_leaves_the_retryable_record_untouched(self, business):
        existing("failed_retryable")
        business.run(work=lambda attempt: record(), decide=lambda value, attempt: None)
        # The unrecorded outcome rolled the re-claim back: still retryable, untouched.
        assert record().status == Status.FAILED_RETRYABLE
        assert record().attempts == 1

    def test_failed_retryable_with_another_hash_is_reused(self, business):
        existing("failed_retryable", request_hash=OTHER_HASH)
        with pytest.raises(KeyReused):
            business.run()
        assert business.runs == 0

    def test_failed_final_is_replayed(self, business):
        final = existing("failed_final")
        assert business.run() == "replayed"
        assert business.runs == 0
        assert business.replays[0].pk == final.pk
        assert business.replays[0].response_status == 402

    def test_succeeded_from_the_factory_is_replayed(self, business):
        existing("succeeded")
        assert business.run() == "replayed"
        assert bytes(business.replays[0].response_body) == b'{"id": 7, "sku": "stored"}'

    def test_needs_review_is_under_review_not_in_use(self, business):
        review = existing("needs_review")
        before = snapshot(review)
        with (
            received(signals.key_under_review) as reviews,
            received(signals.key_in_use) as conflicts,
            pytest.raises(KeyUnderReview) as caught,
        ):
            business.run()
        assert not isinstance(caught.value, KeyInUse)
        assert not hasattr(caught.value, "retry_after")  # no wait of the client's resolves it
        assert business.runs == 0
        assert snapshot(review) == before
        assert [sent["record"].pk for sent in reviews] == [review.pk]
        assert conflicts == []

    def test_in_flight_is_in_use_with_a_short_retry_after(self, business):
        in_flight = existing("in_flight")  # lease live for 60 s
        with received(signals.key_in_use) as conflicts, pytest.raises(KeyInUse) as caught:
            business.run()
        assert caught.value.retry_after == 1  # RETRY_AFTER, not the 60 s of lease left
        assert business.runs == 0
        assert record().owner_token == in_flight.owner_token
        assert conflicts[0]["retry_after"] == caught.value.retry_after

    def test_expired_lease_is_not_rerun_but_put_under_review(self, business):
        existing("expired_lease")
        with pytest.raises(KeyUnderReview):
            business.run()
        assert business.runs == 0
        # No resolver can say what happened: an operator must (tests/protocol/test_lease.py).
        assert record().status == Status.NEEDS_REVIEW

    def test_in_use_checks_the_hash_first(self, business):
        existing("in_flight", request_hash=OTHER_HASH)
        with pytest.raises(KeyReused):
            business.run()


def provider_timeout(attempt: Attempt) -> None:
    raise RuntimeError("provider timed out")


@pytest.mark.django_db(transaction=True)
class TestLeaseMode:
    """The claim and the outcome are separate short transactions; the work runs between."""

    def lease_op(self, **changes: Any) -> Operation:
        return operation(mode="lease", lease_seconds=30, **changes)

    def test_a_duplicate_of_a_record_under_review_does_not_wait_for_it(self, business):
        existing("needs_review", self.lease_op())
        started = time.monotonic()
        with pytest.raises(KeyUnderReview):
            business.run(self.lease_op(wait_seconds=5))
        # No outcome is coming until an operator acts: answered at once, not after the wait.
        assert time.monotonic() - started < 2
        assert business.runs == 0

    def test_claim_is_committed_before_the_work_runs(self, business):
        seen: dict[str, Any] = {}

        def work(attempt: Attempt) -> Order:
            seen["in_transaction"] = connection.in_atomic_block
            seen["record"] = record()
            return business.work(attempt)

        business.run(self.lease_op(), work=work)
        assert seen["in_transaction"] is False
        assert seen["record"].status == Status.PROCESSING
        assert seen["record"].lease_until is not None
        assert record().status == Status.SUCCEEDED
        assert record().lease_until is None

    def test_lease_comes_from_the_database_clock(self, business, monkeypatch):
        seen: dict[str, Any] = {}

        def work(attempt: Attempt) -> Order:
            seen["lease_until"] = record().lease_until
            seen["db_now"] = db_now()
            return business.work(attempt)

        # If the lease were computed from the application's clock it would be in 2001.
        monkeypatch.setattr(timezone, "now", lambda: datetime(2001, 1, 1, tzinfo=dt_timezone.utc))
        business.run(self.lease_op(), work=work)
        remaining = seen["lease_until"] - seen["db_now"]
        assert timedelta(seconds=25) < remaining <= timedelta(seconds=30)

    def test_default_lease_length_is_the_setting(self, business):
        seen: dict[str, Any] = {}

        def work(attempt: Attempt) -> Order:
            seen["remaining"] = record().lease_until - db_now()
            return business.work(attempt)

        with override_settings(IDEMPOTENCY={"LEASE_SECONDS": 300}):
            business.run(operation(mode="lease"), work=work)
        assert timedelta(seconds=290) < seen["remaining"] <= timedelta(seconds=300)

    def test_stale_owner_cannot_finish(self, business):
        def overtaken(attempt: Attempt) -> Order:
            # Recovery took the record over while this worker was slow.
            IdempotencyRecord.objects.filter(pk=attempt.record.pk).update(
                owner_token=b"recovery-token", lease_until=timezone.now() + timedelta(minutes=1)
            )
            return business.work(attempt)

        with pytest.raises(LeaseLost):
            business.run(self.lease_op(), work=overtaken)
        stored = record()
        assert stored.owner_token == b"recovery-token"
        assert stored.status == Status.PROCESSING
        assert stored.response_status is None
        assert stored.completed_at is None

    def test_finished_record_cannot_be_finished_again(self, business):
        def moved_on(attempt: Attempt) -> Order:
            IdempotencyRecord.objects.filter(pk=attempt.record.pk).update(
                status=Status.FAILED_RETRYABLE
            )
            return business.work(attempt)

        with pytest.raises(LeaseLost):
            business.run(self.lease_op(), work=moved_on)
        assert record().status == Status.FAILED_RETRYABLE

    def test_renew_extends_the_lease(self, business):
        seen: dict[str, Any] = {}

        def long_work(attempt: Attempt) -> Order:
            attempt.renew(600)
            seen["remaining"] = record().lease_until - db_now()
            return business.work(attempt)

        business.run(self.lease_op(), work=long_work)
        assert timedelta(seconds=590) < seen["remaining"] <= timedelta(seconds=600)

    def test_renew_by_a_stale_owner_is_refused(self, business):
        def overtaken(attempt: Attempt) -> Order:
            IdempotencyRecord.objects.filter(pk=attempt.record.pk).update(owner_token=b"other")
            attempt.renew()
            return business.work(attempt)

        with pytest.raises(LeaseLost):
            business.run(self.lease_op(), work=overtaken)
        assert business.runs == 0

    def test_exception_leaves_failed_retryable(self, business):
        with pytest.raises(RuntimeError):
            business.run(self.lease_op(), work=provider_timeout)
        stored = record()
        assert stored.status == Status.FAILED_RETRYABLE
        assert stored.lease_until is None
        assert stored.expires_at is not None

    def test_failed_retryable_is_reclaimed_with_a_new_lease(self, business):
        with pytest.raises(RuntimeError):
            business.run(self.lease_op(), work=provider_timeout)
        first_token = record().owner_token
        seen: dict[str, Any] = {}

        def work(attempt: Attempt) -> Order:
            seen["record"] = record()
            return business.work(attempt)

        business.run(self.lease_op(), work=work)
        assert seen["record"].status == Status.PROCESSING
        assert seen["record"].lease_until is not None
        assert seen["record"].owner_token not in ("", first_token)
        assert record().attempts == 2
        assert record().status == Status.SUCCEEDED

    def test_unrecorded_outcome_deletes_the_record(self, business):
        business.run(self.lease_op(), decide=lambda order, attempt: None)
        assert IdempotencyRecord.objects.count() == 0
        # No transaction spans the work in lease mode: its writes are its own business.
        assert Order.objects.count() == 1

    def test_in_flight_duplicate_is_in_use(self, business):
        def duplicate_arrives(attempt: Attempt) -> Order:
            with pytest.raises(KeyInUse) as caught:
                business.run(self.lease_op())
            assert caught.value.retry_after == 1  # RETRY_AFTER: no durations known yet
            return business.work(attempt)

        business.run(self.lease_op(), work=duplicate_arrives)
        assert business.runs == 1
        assert record().status == Status.SUCCEEDED

    def test_repeat_is_replayed(self, business):
        business.run(self.lease_op())
        assert business.run(self.lease_op()) == "replayed"
        assert business.runs == 1


class TestRetention:
    def test_success_expires_after_the_window(self, business):
        with override_settings(IDEMPOTENCY={"RETENTION": {"SUCCEEDED": 3600}}):
            business.run()
        stored = record()
        assert stored.expires_at - stored.completed_at == pytest.approx(
            timedelta(hours=1), abs=timedelta(seconds=2)
        )

    def test_default_window_is_a_day(self, business):
        business.run()
        stored = record()
        assert stored.expires_at - stored.completed_at == pytest.approx(
            timedelta(days=1), abs=timedelta(seconds=2)
        )

    def test_final_failure_has_its_own_window(self, business):
        final = Outcome(Status.FAILED_FINAL, StoredResponse(402, [], b"{}"))
        with override_settings(IDEMPOTENCY={"RETENTION": {"FAILED_FINAL": 60}}):
            business.run(decide=lambda order, attempt: final)
        stored = record()
        assert stored.status == Status.FAILED_FINAL
        assert stored.expires_at - stored.completed_at == pytest.approx(
            timedelta(minutes=1), abs=timedelta(seconds=2)
        )

    def test_per_operation_window_none_keeps_forever(self, business):
        settings = {"OPERATION_RETENTION": {"tests.create_order": {"SUCCEEDED": None}}}
        with override_settings(IDEMPOTENCY=settings):
            business.run()
        assert record().expires_at is None

    def test_retention_for(self):
        settings = {
            "RETENTION": {"SUCCEEDED": 10},
            "OPERATION_RETENTION": {"payments": {"SUCCEEDED": 20, "FAILED_FINAL": None}},
        }
        with override_settings(IDEMPOTENCY=settings):
            assert retention_for("orders", Status.SUCCEEDED) == timedelta(seconds=10)
            assert retention_for("payments", Status.SUCCEEDED) == timedelta(seconds=20)
            assert retention_for("payments", Status.FAILED_FINAL) is None
            assert retention_for("orders", Status.FAILED_FINAL) == timedelta(days=1)
            assert retention_for("orders", Status.NEEDS_REVIEW) is None


class TestOperation:
    def test_long_scopes_stay_distinct(self, business):
        tenant = "tenant:" + "x" * 300
        first, second = operation(scope=tenant + ":a"), operation(scope=tenant + ":b")
        business.run(first)
        business.run(second)
        assert business.runs == 2
        assert len(first.scope) == len(second.scope) == 255
        assert first.scope != second.scope
        assert first.scope.startswith("tenant:xxx")

    def test_long_scope_is_stable(self, business):
        scope = "s" * 400
        business.run(operation(scope=scope))
        assert business.run(operation(scope=scope)) == "replayed"
        assert record(operation(scope=scope)).scope == operation(scope=scope).scope

    def test_scope_that_fits_is_kept(self):
        assert operation(scope="s" * 255).scope == "s" * 255

    def test_database_defaults_to_the_router(self):
        assert operation().database == "default"

    def test_explicit_database(self):
        assert operation(using="default").database == "default"
        # Its store is made with it: a database that is not configured is said at once.
        with pytest.raises(ConnectionDoesNotExist, match="other"):
            operation(using="other")

    @override_settings(IDEMPOTENCY={"DATABASE": "reports"})
    def test_database_setting(self):
        with pytest.raises(ConnectionDoesNotExist, match="reports"):
            operation()

    def test_owner_tokens_are_unguessable(self, business):
        tokens = set()
        for index in range(5):
            business.run(operation(key=f"k{index}"))
            tokens.add(record(operation(key=f"k{index}")).owner_token)
        assert len(tokens) == 5
        assert all(isinstance(token, bytes) and len(token) == 16 for token in tokens)


# --- an atomic attempt writes to one database (the write guard) ----------------------------
# A second database is set up in the tenants pass (tests/deployment/test_database_per_tenant.py
# runs a view that writes to another tenant's): here, the guard itself.


def sent_to(alias: str, sql: str) -> list[str]:
    """What reaches the database of ``alias`` through the guard of an attempt on ``default``."""
    sent: list[str] = []
    refuse = _refusal(alias, DEFAULT_DB_ALIAS)
    refuse(lambda sql, params, many, context: sent.append(sql), sql, None, False, {})
    return sent


class TestWriteGuard:
    @pytest.mark.parametrize(
        "sql",
        [
            "INSERT INTO t VALUES (1)",
            "  update t set a = 1",
            "DELETE FROM t",
            "\nMERGE INTO t USING s ON true WHEN MATCHED THEN DELETE",
            "TRUNCATE t",
            "REPLACE INTO t VALUES (1)",
            "COPY t FROM STDIN",
        ],
    )
    def test_a_write_to_another_alias_is_refused_with_the_fix(self, sql):
        with pytest.raises(CrossDatabaseWrite, match=r"'default' wrote to 'other'.*using="):
            sent_to("other", sql)

    @pytest.mark.parametrize("sql", ["SELECT 1", "  select * from updates", "WITH a AS (SELECT 1)"])
    def test_a_read_passes(self, sql):
        assert sent_to("other", sql) == [sql]

    def test_only_the_other_aliases_are_guarded(self, monkeypatch):
        guarded: list[str] = []
        monkeypatch.setattr(
            "idempotency.protocol.execute.connections",
            type(
                "Two",
                (),
                {
                    "__iter__": lambda self: iter(["default", "other"]),
                    "__getitem__": lambda self, alias: Wrapped(alias, guarded),
                    "settings": {"default": {}, "other": {}},
                },
            )(),
        )
        with override_settings(IDEMPOTENCY={"WRITE_GUARD": True}), writes_only_to("default"):
            pass
        assert guarded == ["other"]

    def test_off_when_set_off_or_with_one_database(self):
        with override_settings(IDEMPOTENCY={"WRITE_GUARD": True}):
            assert isinstance(writes_only_to(DEFAULT_DB_ALIAS), nullcontext)  # one database
        with override_settings(IDEMPOTENCY={"WRITE_GUARD": False}):
            assert not _guarded()

    def test_on_by_default_under_debug_and_in_tests_only(self, monkeypatch):
        with override_settings(IDEMPOTENCY={"WRITE_GUARD": None}, DEBUG=False):
            assert _guarded()  # Django's test environment is set up here
            monkeypatch.delattr("django.core.mail.outbox")
            assert not _guarded()
            with override_settings(DEBUG=True):
                assert _guarded()


class Wrapped:
    """A connection of ``alias`` that notes the execute wrapper the guard installs."""

    def __init__(self, alias: str, guarded: list[str]) -> None:
        self.alias, self.guarded = alias, guarded

    @contextmanager
    def execute_wrapper(self, wrapper: Any) -> Iterator[None]:
        self.guarded.append(self.alias)
        yield


def lost_connection() -> DjangoOperationalError:
    """A connection lost under a statement, as this database's driver reports it."""
    cause: Exception
    if connection.vendor == "postgresql":
        import psycopg

        cause = psycopg.OperationalError("server closed the connection unexpectedly")
    elif connection.vendor == "mysql":
        import MySQLdb

        cause = MySQLdb.OperationalError(2013, "Lost connection to server during query")
    else:
        import sqlite3

        cause = sqlite3.OperationalError("database is locked")  # SQLite's only outage
    error = DjangoOperationalError(*cause.args)
    error.__cause__ = cause
    return error


GIVEN_UP = DjangoOperationalError(1213, "Deadlock found; a duplicate committed first")


@pytest.fixture
def commit_fails(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """The next COMMIT of this thread's connection fails, after ``then`` (committed or not)."""

    def arrange(error: Exception, *, committed: bool, then: Callable[[], None] = lambda: None):
        wrapper = connections[DEFAULT_DB_ALIAS]  # this thread's, not the proxy
        real_commit, real_rollback = wrapper._commit, wrapper._rollback
        failed: list[bool] = []

        def failing() -> None:
            if failed:
                return real_commit()
            failed.append(True)
            (real_commit if committed else real_rollback)()
            then()
            raise error

        monkeypatch.setattr(wrapper, "_commit", failing)

    return arrange


def elsewhere(call: Callable[[], Any]) -> None:
    """``call`` on a connection of its own (another server, as far as this one knows)."""

    def run() -> None:
        try:
            call()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)


@pytest.mark.django_db(transaction=True)
class TestWhenTheCommitFails:
    """What an attempt answers when its own transaction fails at its end (failover, Galera)."""

    def test_a_connection_lost_at_commit_is_an_unknown_outcome_retried_with_the_key(
        self, business, commit_fails
    ):
        # The commit landed; only its acknowledgement was lost (a primary killed at COMMIT).
        commit_fails(lost_connection(), committed=True)
        with received(signals.database_unavailable) as sent, pytest.raises(OutcomeUnknown) as lost:
            business.run()
        assert lost.value.code == "outcome_unknown"
        assert isinstance(lost.value, DatabaseUnavailable)  # retried as any outage is
        assert "nothing was recorded" not in lost.value.detail
        assert "same idempotency key" in lost.value.detail
        assert len(sent) == 1
        assert business.run() == "replayed"  # the retry finds what the commit wrote
        assert business.runs == 1 and Order.objects.count() == 1

    def test_a_commit_that_did_not_land_is_unknown_too_and_the_retry_runs(
        self, business, commit_fails
    ):
        commit_fails(lost_connection(), committed=False)
        with pytest.raises(OutcomeUnknown):
            business.run()
        assert IdempotencyRecord.objects.count() == 0
        business.run()
        assert business.runs == 2 and record().status == Status.SUCCEEDED

    def test_a_connection_lost_before_the_commit_is_database_unavailable(
        self, business, monkeypatch
    ):
        def broken(*args: Any, **kwargs: Any) -> bool:
            raise lost_connection()

        monkeypatch.setattr(type(operation().store), "finish", broken)
        with pytest.raises(DatabaseUnavailable) as unavailable:
            business.run()
        assert not isinstance(unavailable.value, OutcomeUnknown)
        assert unavailable.value.code == "database_unavailable"
        assert IdempotencyRecord.objects.count() == 0 and Order.objects.count() == 0

    def test_a_duplicate_that_lost_at_commit_answers_the_winners_outcome(
        self, business, commit_fails, monkeypatch
    ):
        # Galera: a duplicate on another node certified first; this COMMIT fails (1213)
        # and everything of this attempt rolled back.
        store = type(operation().store)
        monkeypatch.setattr(store, "contention", lambda self, error: "retry")
        winner = partial(existing, "succeeded", response_body=b'{"id": 7}')
        commit_fails(GIVEN_UP, committed=False, then=lambda: elsewhere(winner))
        assert business.run() == "replayed"
        assert business.runs == 1
        assert bytes(business.replays[0].response_body) == b'{"id": 7}'
        assert Order.objects.count() == 0  # the loser's order rolled back with it

    def test_a_winner_under_another_request_is_key_reused(
        self, business, commit_fails, monkeypatch
    ):
        monkeypatch.setattr(type(operation().store), "contention", lambda self, error: "retry")
        winner = partial(existing, "succeeded", request_hash=OTHER_HASH)
        commit_fails(GIVEN_UP, committed=False, then=lambda: elsewhere(winner))
        with pytest.raises(KeyReused):
            business.run()

    def test_a_conflict_without_a_winner_is_answered_as_the_error_it_is(
        self, business, commit_fails, monkeypatch
    ):
        # A deadlock with another request that is no duplicate: nothing holds the key.
        monkeypatch.setattr(type(operation().store), "contention", lambda self, error: "retry")
        commit_fails(GIVEN_UP, committed=False)
        with pytest.raises(DatabaseUnavailable) as unavailable:
            business.run()
        assert unavailable.value.code == "database_unavailable"
        assert IdempotencyRecord.objects.count() == 0

    def test_inside_the_callers_transaction_the_commit_is_not_ours(self, business, commit_fails):
        commit_fails(lost_connection(), committed=True)
        with pytest.raises(DjangoOperationalError) as raised, transaction.atomic():
            business.run()
        assert not isinstance(raised.value, DatabaseUnavailable)  # the caller's COMMIT failed

    def test_lease_mode_a_finish_lost_with_its_connection_is_unknown(self, business, monkeypatch):
        store = type(operation().store)
        real_finish = store.finish

        def finished_then_lost(self: Any, *args: Any, **kwargs: Any) -> bool:
            real_finish(self, *args, **kwargs)
            raise lost_connection()

        monkeypatch.setattr(store, "finish", finished_then_lost)
        with pytest.raises(OutcomeUnknown):
            business.run(operation(mode="lease"))
        monkeypatch.setattr(store, "finish", real_finish)
        assert business.run(operation(mode="lease")) == "replayed"
        assert business.runs == 1

    def test_lease_mode_a_claim_given_up_at_its_commit_is_claimed_again(
        self, business, monkeypatch
    ):
        from idempotency.protocol import execute as protocol

        monkeypatch.setattr(type(operation().store), "contention", lambda self, error: "retry")
        real_claim, failures = protocol.claim_committed, [GIVEN_UP]

        def given_up_once(op: Operation) -> Any:
            if failures:
                raise failures.pop()
            return real_claim(op)

        monkeypatch.setattr(protocol, "claim_committed", given_up_once)
        business.run(operation(mode="lease"))
        assert business.runs == 1 and record().status == Status.SUCCEEDED
