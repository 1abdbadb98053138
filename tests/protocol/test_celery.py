"""``IdempotentTask``: in process on any database, and through a real worker on Redis."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery
from django.core.exceptions import ImproperlyConfigured

from idempotency import KeyInUse, KeyReused, KeyUnderReview, resolvers, signals
from idempotency.celery import IdempotentTask
from idempotency.models import IdempotencyRecord, IdempotencyStep, Status
from idempotency.outcomes import StoredResponse
from idempotency.recovery import recover_expired
from idempotency.resolvers import Resolution
from idempotency.steps import NotInAttempt, key_for_record
from tests.support.celery_app import app
from tests.support.factories import IdempotencyRecordFactory, UserFactory
from tests.support.fake_provider import FakeProvider
from tests.testapp.lease_views import sku_for
from tests.testapp.models import Order
from tests.testapp.tasks import (
    HANG_AFTER_CHARGE,
    STEP_LEASE_SECONDS,
    capture_payment,
    charge_order,
    place_order,
    place_order_atomic,
    place_order_impatiently,
    place_order_through_an_outage,
    whose_attempt,
)


@pytest.mark.django_db
def test_a_repeated_task_returns_the_first_result():
    owner = UserFactory()
    first = place_order(ref="o-1", owner_id=owner.pk, quantity=2, sent_at="t0")
    again = place_order(ref="o-1", owner_id=owner.pk, quantity=2, sent_at="t1")
    assert first == again == {"order": Order.objects.get().pk, "quantity": 2}
    record = IdempotencyRecord.objects.get()
    assert (record.scope, record.operation, record.status) == (
        place_order.name,  # the task's name is its operation and, by default, its scope
        place_order.name,
        Status.SUCCEEDED,
    )


@pytest.mark.django_db
def test_a_bound_task_keys_on_its_arguments_not_on_itself():
    owner = UserFactory()
    first = place_order_impatiently.apply(
        kwargs={"ref": "o-2", "owner_id": owner.pk, "quantity": 1}
    )
    again = place_order_impatiently.apply(
        kwargs={"ref": "o-2", "owner_id": owner.pk, "quantity": 1}
    )
    assert (
        first.get() == again.get() == {"order": Order.objects.get().pk, "quantity": 1, "retries": 0}
    )


@pytest.mark.django_db
def test_a_reused_key_fails_without_retrying():
    owner = UserFactory()
    place_order_atomic.apply(kwargs={"ref": "o-3", "owner_id": owner.pk, "quantity": 1})
    other = place_order_atomic.apply(kwargs={"ref": "o-3", "owner_id": owner.pk, "quantity": 5})
    assert other.state == "FAILURE"
    assert isinstance(other.result, KeyReused)
    assert Order.objects.get().quantity == 1


@pytest.mark.django_db
def test_a_key_in_use_is_retried_at_most_max_retries_times():
    owner = UserFactory()
    kwargs = {"ref": "o-4", "owner_id": owner.pk, "quantity": 1}
    IdempotencyRecordFactory(
        in_flight=True,  # another worker runs it under a live lease
        scope=place_order.name,
        operation=place_order.name,
        idem_key="o-4",
        request_hash=place_order._idempotency.request_hash((), kwargs),
    )
    result = place_order.apply(kwargs=kwargs)  # eager retries run at once
    assert result.state == "FAILURE"
    assert isinstance(result.result, KeyInUse)
    assert not Order.objects.exists()


@pytest.mark.django_db
def test_a_key_under_review_fails_once_without_retrying():
    owner = UserFactory()
    kwargs = {"ref": "o-5", "owner_id": owner.pk, "quantity": 1}
    IdempotencyRecordFactory(
        needs_review=True,  # a lost lease no resolver could settle: an operator's to decide
        scope=place_order.name,
        operation=place_order.name,
        idem_key="o-5",
        request_hash=place_order._idempotency.request_hash((), kwargs),
    )
    answers: list[object] = []

    def heard(sender: object, **kwargs: object) -> None:
        answers.append(kwargs["record"])

    signals.key_under_review.connect(heard)
    try:
        result = place_order.apply(kwargs=kwargs)  # eager: a retry would run at once
    finally:
        signals.key_under_review.disconnect(heard)
    assert result.state == "FAILURE"
    assert isinstance(result.result, KeyUnderReview)
    assert len(answers) == 1  # asked once: max_retries (10) would have asked eleven times
    assert not Order.objects.exists()


@pytest.mark.django_db
def test_the_docs_example_keys_positional_and_keyword_calls_alike():
    first = capture_payment.apply(("ORD-1", "19.90")).get()
    again = capture_payment.apply(kwargs={"order_ref": "ORD-1", "amount": "19.90", "sent_at": "t"})
    assert again.get() == first == {"payment": Order.objects.get().pk}
    assert IdempotencyRecord.objects.get().idem_key == "ORD-1"


@pytest.mark.django_db
def test_a_task_key_function_returning_none_fails_naming_it():
    from idempotency import KeyInvalid

    keyless = place_order.apply(kwargs={"ref": None, "owner_id": 1, "quantity": 1})
    assert keyless.state == "FAILURE"
    assert isinstance(keyless.result, KeyInvalid)
    assert "tests.testapp.tasks.place_order" in keyless.result.detail
    assert "returned None" in keyless.result.detail
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
def test_a_task_key_function_that_raises_fails_naming_it():
    from idempotency import KeyInvalid

    runs: list[dict] = []

    def handle_event(event: dict) -> None:
        runs.append(event)

    bare = Celery("bare", set_as_current=False)
    handle = bare.task(
        base=IdempotentTask, name="tests.handle_event", idempotency_key=lambda event: event["id"]
    )(handle_event)

    keyless = handle.apply(({"amount": 1},))  # an event without an id
    assert keyless.state == "FAILURE"
    assert isinstance(keyless.result, KeyInvalid), keyless.result
    assert "of tests.handle_event" in keyless.result.detail
    assert "raised KeyError: 'id'" in keyless.result.detail
    assert runs == [] and not IdempotencyRecord.objects.exists()


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_database_outage_is_retried_and_makes_one_order():
    owner = UserFactory()
    result = place_order_through_an_outage.apply(kwargs={"ref": "o-outage", "owner_id": owner.pk})

    # The first run's write rolled back with its claim; the retry made the one order.
    assert result.state == "SUCCESS", result.result
    assert result.get() == {"order": Order.objects.get().pk, "quantity": 1, "retries": 1}
    assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED


@pytest.mark.django_db(transaction=True)  # the step's seed is committed before its key
def test_a_bound_tasks_idempotency_is_its_running_attempt():
    seen = whose_attempt.apply(kwargs={"ref": "r-1"}).get()
    record = IdempotencyRecord.objects.get()
    assert seen["is_current"] and seen["owns_the_record"]
    assert (seen["record"], seen["key"]) == (record.pk, "r-1")
    assert seen["step_key"] == key_for_record(record, "charge")
    with pytest.raises(NotInAttempt):
        whose_attempt.idempotency  # noqa: B018 - outside a run there is no attempt


def test_expected_failures_keep_the_reused_key_and_the_review():
    class Strict(IdempotentTask):
        throws = (LookupError,)

    assert Strict.throws == (LookupError, KeyReused, KeyUnderReview)
    assert IdempotentTask.throws == (KeyReused, KeyUnderReview)


def test_a_base_whose_call_would_shadow_ours_is_refused():
    from celery import Task

    class ContextTask(Task):
        # The common pattern: runs the task itself, never reaching IdempotentTask.__call__.
        def __call__(self, *args, **kwargs):
            return self.run(*args, **kwargs)

    with pytest.raises(ImproperlyConfigured) as refused:

        class Shadowed(ContextTask, IdempotentTask):
            pass

    assert "ContextTask.__call__ comes before IdempotentTask.__call__" in str(refused.value)
    assert "Put IdempotentTask first" in str(refused.value)

    class Ordered(IdempotentTask, ContextTask):  # ours wraps theirs: accepted
        pass

    assert Ordered.__call__ is IdempotentTask.__call__


def test_a_task_without_a_key_function_fails_when_the_worker_loads_it():
    def keyless() -> None: ...

    bare = Celery("bare", set_as_current=False)
    bare.task(base=IdempotentTask, name="tests.keyless")(keyless)
    with pytest.raises(ImproperlyConfigured, match="tests.keyless.*idempotency_key="):
        bare.finalize()


# -- a real worker on Redis, against the test database (PostgreSQL or MariaDB) ----------


def through_a_worker(test: Callable[..., None]) -> Callable[..., None]:
    marks = (pytest.mark.celery, pytest.mark.server_db, pytest.mark.django_db(transaction=True))
    for mark in marks:
        test = mark(test)
    return test


@pytest.fixture
def queue(worker: Callable[..., str]) -> str:
    """A worker's queue; its threads run a duplicate beside the first run."""
    return worker("--pool=threads", "--concurrency=4")


def _log(tmp_path: Path, *, until: str = "") -> str:
    """The worker's log; with ``until``, once that line is in (Celery logs after storing)."""
    deadline = time.monotonic() + 30
    while until not in (log := (tmp_path / "worker-0.log").read_text()):
        assert time.monotonic() < deadline, f"the worker never logged {until!r}"
        time.sleep(0.05)
    return log


def _retries(log: str, task_id: str) -> int:
    return len(re.findall(rf"\[{task_id}\] retry: Retry in \d+s: KeyInUse", log))


def _wait_for_claim(ref: str) -> None:
    deadline = time.monotonic() + 30
    while not IdempotencyRecord.objects.filter(idem_key=ref).exists():
        assert time.monotonic() < deadline, "the first run never claimed its key"
        time.sleep(0.05)


@through_a_worker
def test_a_redelivery_during_the_first_run_is_retried_then_answered(queue, tmp_path):
    owner = UserFactory()
    intent = {"ref": "o-10", "owner_id": owner.pk, "quantity": 2, "seconds": 2}
    first = app.send_task(place_order.name, kwargs={**intent, "sent_at": "t0"}, queue=queue)
    _wait_for_claim("o-10")  # lease mode: the claim commits before the work starts
    # Delivered again while the first run holds the key; only its metadata differs.
    again = app.send_task(place_order.name, kwargs={**intent, "sent_at": "t1"}, queue=queue)

    result = first.get(timeout=60)
    assert again.get(timeout=60) == result
    order = Order.objects.get()  # exactly one effect
    assert result == {"order": order.pk, "quantity": 2}
    assert order.sku == sku_for("o-10")
    log = _log(tmp_path, until=f"[{again.id}] succeeded")
    assert _retries(log, again.id) >= 1
    assert _retries(log, first.id) == 0
    assert "ERROR" not in log


@through_a_worker
def test_a_duplicate_waiting_on_the_row_lock_is_retried_then_answered(queue, tmp_path):
    owner = UserFactory()
    intent = {"ref": "o-11", "owner_id": owner.pk, "quantity": 3, "seconds": 3}
    # Atomic mode: the first run's claim is not visible until it commits, so the
    # duplicate waits on the row lock (LOCK_TIMEOUT) and is then retried.
    sent = [app.send_task(place_order_atomic.name, kwargs=intent, queue=queue) for _ in range(2)]

    results = [result.get(timeout=60) for result in sent]
    order = Order.objects.get()
    assert results == [{"order": order.pk, "quantity": 3}] * 2
    assert IdempotencyRecord.objects.get().scope == f"user:{owner.pk}:orders"
    for result in sent:
        log = _log(tmp_path, until=f"[{result.id}] succeeded")
    assert sorted(_retries(log, result.id) > 0 for result in sent) == [False, True]
    assert "ERROR" not in log


@through_a_worker
def test_a_reused_key_fails_once_with_a_warning(queue, tmp_path):
    owner = UserFactory()
    intent = {"ref": "o-12", "owner_id": owner.pk, "seconds": 0}
    first = app.send_task(place_order.name, kwargs={**intent, "quantity": 1}, queue=queue)
    assert first.get(timeout=60)["quantity"] == 1
    other = app.send_task(place_order.name, kwargs={**intent, "quantity": 9}, queue=queue)

    with pytest.raises(KeyReused):
        other.get(timeout=60)
    assert Order.objects.get().quantity == 1
    log = _log(tmp_path, until=f"[{other.id}] raised expected: KeyReused")
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, log
    assert "key_reused" in warnings[0]
    assert _retries(log, other.id) == 0
    assert "ERROR" not in log
    assert "Traceback" not in log


@through_a_worker
def test_retries_stop_at_max_retries(queue, tmp_path):
    owner = UserFactory()
    intent = {"ref": "o-13", "owner_id": owner.pk, "quantity": 1, "seconds": 5}
    sent = [
        app.send_task(place_order_impatiently.name, kwargs=intent, queue=queue) for _ in range(2)
    ]

    for result in sent:
        result.get(timeout=60, propagate=False)
    states = sorted(result.state for result in sent)
    assert states == ["FAILURE", "SUCCESS"]
    failed = next(result for result in sent if result.state == "FAILURE")
    assert isinstance(failed.result, KeyInUse)
    log = _log(tmp_path, until=f"[{failed.id}] raised unexpected: KeyInUse")
    assert _retries(log, failed.id) == 1  # max_retries=1
    assert Order.objects.count() == 1


@through_a_worker
def test_the_docs_example_called_with_delay_runs_once(queue, monkeypatch):
    # docs/celery.md: capture_payment.delay("ORD-1", "19.90"), here routed to this worker.
    monkeypatch.setitem(app.conf, "task_routes", {capture_payment.name: {"queue": queue}})
    # Celery reads its routes once: make it read them again, and forget them afterwards.
    monkeypatch.setattr(app.amqp, "_rtable", None)
    monkeypatch.setitem(app.amqp.__dict__, "router", app.amqp.Router())
    first = capture_payment.delay("ORD-1", "19.90")
    assert first.get(timeout=60) == {"payment": Order.objects.get().pk}
    again = capture_payment.delay(order_ref="ORD-1", amount="19.90", sent_at="09:05")
    assert again.get(timeout=60) == first.get()
    assert Order.objects.count() == 1
    assert IdempotencyRecord.objects.get().idem_key == "ORD-1"


# -- steps: the worker SIGKILLed after the provider answered -------------------------------


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as running:
        yield running


@pytest.fixture
def task_resolver() -> Iterator[None]:
    # A test that names another resolver for charge_order in this process puts the task's
    # own back afterwards (the workers have their own, from the task).
    before = resolvers._registry.get(charge_order.name)
    yield
    if before is not None:
        resolvers.register(charge_order.name, before)


def _charge(queue: str, provider: FakeProvider, order: str, *, recorded: bool) -> Any:
    return app.send_task(
        charge_order.name,
        kwargs={"provider": provider.url, "order": order, "amount": 500, "recorded": recorded},
        queue=queue,
    )


def _kill_after_charge(
    worker: Any, tmp_path: Path, provider: FakeProvider, order: str, *, recorded: bool
) -> None:
    """Run ``charge_order`` on a worker SIGKILLed once the charge is in hand (and recorded)."""
    queue = worker(**{HANG_AFTER_CHARGE: "1"})
    _charge(queue, provider, order, recorded=recorded)
    deadline = time.monotonic() + 30
    log = tmp_path / "worker-0.log"
    while f"charged {order}" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.05)
    process = worker.process(queue)
    process.send_signal(signal.SIGKILL)  # no finish, no release, no ack: a lost machine
    assert process.wait(timeout=10) == -signal.SIGKILL
    assert len(provider.charges) == len(provider.calls) == 1
    record = IdempotencyRecord.objects.get(idem_key=order)
    assert record.status == Status.PROCESSING  # as the killed worker left it
    assert IdempotencyStep.objects.filter(record=record, name="charge").exists() == recorded


def _the_lease_ends() -> None:
    time.sleep(STEP_LEASE_SECONDS + 0.2)


@through_a_worker
@pytest.mark.parametrize("recorded", [False, True], ids=["keyed", "recorded"])
@pytest.mark.parametrize("released_by", ["recovery", "the lease's end"])
def test_a_worker_killed_after_the_charge_charges_once(
    worker, tmp_path, provider, recorded, released_by
):
    _kill_after_charge(worker, tmp_path, provider, "order-1", recorded=recorded)
    _the_lease_ends()
    if released_by == "recovery":
        # The task's resolver (effects_carry_step_keys): the record is released for a retry.
        assert recover_expired().released == 1
        assert IdempotencyRecord.objects.get().status == Status.FAILED_RETRYABLE
    # Otherwise the retry itself finds the lease run out, asks the same resolver in the
    # fresh worker, and takes the record over.

    retried = _charge(worker(), provider, "order-1", recorded=recorded)
    assert retried.get(timeout=60) == "ch_1"
    assert len(provider.charges) == 1  # one charge for the request
    if recorded:
        assert len(provider.calls) == 1  # the retry took the recorded charge, no call
    else:
        assert len(provider.calls) == 2  # called again, with the same key: answered, not charged
        assert provider.calls[0] == provider.calls[1]
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.attempts) == (Status.SUCCEEDED, 2)

    another = _charge(worker(), provider, "order-2", recorded=recorded)  # another request
    assert another.get(timeout=60) == "ch_2"
    assert len(provider.charges) == 2 and provider.calls[-1] != provider.calls[0]


@through_a_worker
def test_a_resolver_asking_the_provider_by_the_step_key_settles_the_killed_run(
    worker, tmp_path, provider, task_resolver
):
    _kill_after_charge(worker, tmp_path, provider, "order-3", recorded=False)

    def ask_the_provider(record: IdempotencyRecord) -> Resolution:
        key = key_for_record(record, "charge")
        if key is None:
            return Resolution.not_done()  # never keyed: nothing was sent
        found = httpx.get(f"{provider.url}/charges", params={"idempotency_key": key})
        if found.status_code == 404:
            return Resolution.not_done()
        charge_id = found.json()["id"]
        body = f'"{charge_id}"'.encode()  # the task's result, as JSON
        return Resolution.done(charge_id, StoredResponse(200, [], body))

    resolvers.register(charge_order.name, ask_the_provider)
    _the_lease_ends()
    assert recover_expired().succeeded == 1
    assert IdempotencyRecord.objects.get().resource_id == "ch_1"

    again = _charge(worker(), provider, "order-3", recorded=False)
    assert again.get(timeout=60) == "ch_1"  # the recorded result: the task did not run
    assert len(provider.charges) == len(provider.calls) == 1
