"""Each signal fires once with the arguments docs/observability.md documents; the logger logs it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models.functions import Now
from django.dispatch import Signal

from idempotency import signals
from idempotency.exceptions import KeyInUse, KeyReused, KeyUnderReview
from idempotency.fingerprint import digest_of, fingerprint
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Operation
from idempotency.protocol.execute import execute
from idempotency.recovery import resolve_record
from idempotency.resolvers import Resolution
from idempotency.retention import purge
from tests.support.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db

KEY = "secret-key-4711"
HASH = fingerprint(["signals", "request"])


def resolved_done(record: IdempotencyRecord) -> Resolution:
    return Resolution.done("order-42")


class Captured(list):  # type: ignore[type-arg]
    def receive(self, sender: Any, signal: Signal, **kwargs: Any) -> None:
        self.append({"sender": sender, **kwargs})


@pytest.fixture
def capture() -> Iterator[Any]:
    connected: list[tuple[Signal, Captured]] = []

    def start(signal: Signal) -> Captured:
        captured = Captured()
        signal.connect(captured.receive, weak=False)
        connected.append((signal, captured))
        return captured

    yield start
    for signal, captured in connected:
        signal.disconnect(captured.receive)


def operation(mode: str = "atomic", request_hash: str = HASH) -> Operation:
    return Operation(
        scope="user:1:orders.create",
        key=KEY,
        request_hash=request_hash,
        name="orders.create",
        method="POST",
        path="/orders/",
        mode=mode,  # type: ignore[arg-type]
    )


def run(op: Operation, status: Status = Status.SUCCEEDED) -> str:
    return execute(
        op,
        lambda attempt: "ran",
        decide=lambda value, attempt: Outcome(status, StoredResponse(201), resource_id="7"),
        replay=lambda record: "replayed",
    )


def test_claim(capture):
    claimed = capture(signals.record_claimed)
    op = operation()
    run(op)
    (event,) = claimed
    assert event["sender"] is IdempotencyRecord
    assert event["operation"] == op and event["reclaimed"] is False
    assert isinstance(event["record"], IdempotencyRecord) and event["record"].idem_key == KEY


def test_reclaim_of_a_retryable_record(capture):
    IdempotencyRecordFactory(
        failed_retryable=True,
        scope="user:1:orders.create",
        idem_key=KEY,
        request_hash=digest_of(HASH),
    )
    claimed = capture(signals.record_claimed)
    run(operation())
    (event,) = claimed
    assert event["reclaimed"] is True


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("expired", [False, True], ids=["reclaimed", "replaced"])
def test_a_lease_mode_claim_on_the_locked_path_is_announced_once_committed(expired):
    """A reclaim or takeover locks the row in a transaction of its own: the signal follows its
    COMMIT, so a receiver never hears of a claim whose COMMIT then failed."""
    record = IdempotencyRecordFactory(
        failed_retryable=True,
        scope="user:1:orders.create",
        idem_key=KEY,
        request_hash=digest_of(HASH),
    )
    if expired:
        IdempotencyRecord.objects.filter(pk=record.pk).update(expires_at=Now() - timedelta(1))
    seen: list[tuple[bool, bool]] = []

    def committed_status(sender: Any, record: IdempotencyRecord, **kwargs: Any) -> None:
        def read() -> None:  # another thread: another connection, which sees only commits
            stored = IdempotencyRecord.objects.get(pk=record.pk)
            seen.append(
                (stored.status == Status.PROCESSING, stored.owner_token == record.owner_token)
            )
            connections.close_all()

        reader = threading.Thread(target=read)
        reader.start()
        reader.join()

    signals.record_claimed.connect(committed_status, weak=False)
    try:
        run(operation("lease"))
    finally:
        signals.record_claimed.disconnect(committed_status)
    assert seen == [(True, True)]


def test_completion(capture):
    completed = capture(signals.record_completed)
    op = operation()
    run(op)
    (event,) = completed
    assert event["operation"] == op and event["status"] == Status.SUCCEEDED
    assert event["record"].pk == IdempotencyRecord.objects.get().pk


def test_completion_of_a_failed_lease_mode_attempt(capture):
    completed = capture(signals.record_completed)

    def fail(attempt: Any) -> str:
        raise RuntimeError("worker error")

    with pytest.raises(RuntimeError):
        execute(operation("lease"), fail, decide=lambda v, a: None, replay=lambda r: "")
    (event,) = completed
    assert event["status"] == Status.FAILED_RETRYABLE
    assert IdempotencyRecord.objects.get().status == Status.FAILED_RETRYABLE


def test_replay(capture):
    run(operation())
    replayed = capture(signals.response_replayed)
    claimed = capture(signals.record_claimed)
    assert run(operation()) == "replayed"
    (event,) = replayed
    assert event["operation"] == operation() and event["record"].status == Status.SUCCEEDED
    assert not claimed


def test_in_flight_conflict(capture):
    IdempotencyRecordFactory(
        in_flight=True, scope="user:1:orders.create", idem_key=KEY, request_hash=digest_of(HASH)
    )
    in_use = capture(signals.key_in_use)
    with pytest.raises(KeyInUse):
        run(operation("lease"))
    (event,) = in_use
    assert event["operation"] == operation("lease")
    assert event["retry_after"] == 1  # RETRY_AFTER: a short poll, not the 60 s lease


def test_key_reuse(capture):
    run(operation())
    reused = capture(signals.key_reused)
    other = operation(request_hash=fingerprint(["another", "request"]))
    with pytest.raises(KeyReused):
        run(other)
    (event,) = reused
    assert event["operation"] == other and event["record"].request_hash == digest_of(HASH)


def test_recovery_outcome(capture, settings):
    settings.IDEMPOTENCY = {
        "RESOLVERS": {"tests.operation": "tests.protocol.test_signals.resolved_done"}
    }
    record = IdempotencyRecordFactory(expired_lease=True)
    recovered = capture(signals.record_recovered)
    assert resolve_record(record) == "succeeded"
    (event,) = recovered
    assert event["operation"] == "tests.operation" and event["outcome"] == "succeeded"
    assert event["record"].status == Status.SUCCEEDED and event["record"].resource_id == "order-42"


@pytest.mark.parametrize("dry_run", [False, True])
def test_purge(capture, dry_run):
    IdempotencyRecordFactory.create_batch(2, expired=True)
    IdempotencyRecordFactory(succeeded=True)  # still within its window
    purged = capture(signals.records_purged)
    assert purge(dry_run=dry_run) == 2
    (event,) = purged
    assert event["count"] == 2 and event["dry_run"] is dry_run


# -- the logger


def events(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> dict[str, Any]:
    return {
        record.event: record
        for record in caplog.records
        if record.name == "idempotency" and record.levelno >= level and hasattr(record, "event")
    }


def test_logger_logs_events_with_scope_and_operation_but_not_the_key(caplog):
    caplog.set_level(logging.INFO, logger="idempotency")
    run(operation())
    run(operation())
    with pytest.raises(KeyReused):
        run(operation(request_hash=fingerprint(["other"])))
    logged = events(caplog)
    assert set(logged) == {
        "idempotency.claimed",
        "idempotency.completed",
        "idempotency.replayed",
        "idempotency.key_reused",
    }
    claimed = logged["idempotency.claimed"]
    assert claimed.scope == "user:1:orders.create" and claimed.operation == "orders.create"
    assert logged["idempotency.completed"].status == Status.SUCCEEDED
    assert logged["idempotency.key_reused"].levelno == logging.WARNING
    assert KEY not in caplog.text


def test_logger_names_the_key_at_debug_only(caplog):
    caplog.set_level(logging.DEBUG, logger="idempotency")
    run(operation())
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and KEY in r.getMessage()]
    assert {record.event for record in debug} == {"idempotency.claimed", "idempotency.completed"}
    assert all(record.key == KEY for record in debug)


def test_logger_logs_conflicts_recovery_and_purge(caplog, settings):
    caplog.set_level(logging.INFO, logger="idempotency")
    IdempotencyRecordFactory(
        in_flight=True, scope="user:1:orders.create", idem_key=KEY, request_hash=digest_of(HASH)
    )
    with pytest.raises(KeyInUse):
        run(operation("lease"))
    resolve_record(IdempotencyRecordFactory(expired_lease=True, operation="no.resolver"))
    purge()
    logged = events(caplog)
    assert logged["idempotency.in_use"].retry_after == 1
    recovered = logged["idempotency.recovered"]
    assert recovered.outcome == "needs_review" and recovered.levelno == logging.WARNING
    assert recovered.operation == "no.resolver"
    assert logged["idempotency.purged"].count == 0


def test_logger_warns_of_a_client_waiting_on_a_review(caplog):
    caplog.set_level(logging.INFO, logger="idempotency")
    IdempotencyRecordFactory(
        needs_review=True, scope="user:1:orders.create", idem_key=KEY, request_hash=digest_of(HASH)
    )
    with pytest.raises(KeyUnderReview):
        run(operation("lease"))
    reviewed = events(caplog)["idempotency.under_review"]
    assert reviewed.levelno == logging.WARNING
    assert reviewed.scope == "user:1:orders.create"
    assert "idempotency.in_use" not in events(caplog)
