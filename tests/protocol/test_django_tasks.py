"""``idempotent_task`` under django.tasks, on django-tasks-db's backend in the test database.

In process (any database): the worker's own loop (``db_worker --batch``) run here.
Through real processes (PostgreSQL, MariaDB): ``db_worker`` processes, one SIGKILLed in
the middle of a task; concurrent requests to a view that enqueues in its transaction; a
process killed right after its commit.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from django_tasks_db.compat import TaskResultStatus
from django_tasks_db.models import DBTaskResult

from idempotency import IdempotencyRecord, Status
from idempotency.django_tasks import idempotent_task, requeue_lost_tasks
from idempotency.models import IdempotencyStep
from idempotency.steps import key_for_record
from tests.support.factories import IdempotencyRecordFactory, UserFactory
from tests.support.fake_provider import FakeProvider
from tests.support.processes import process_env, python, start, stop
from tests.testapp.background import HANG_IN_TASK, LEASE_SECONDS, charge_order, place_order
from tests.testapp.lease_views import sku_for
from tests.testapp.models import Order

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]


def run_worker_here() -> None:
    """``db_worker --batch`` in this process: every task ready, then back."""
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        call_command("db_worker", batch=True, startup_delay=False, reload=False, verbosity=0)
    finally:
        for number, handler in handlers.items():  # the worker took them for its own shutdown
            signal.signal(number, handler)


def finished(result: Any) -> Any:
    result.refresh()
    assert result.is_finished, result.status
    return result


def status_of(result: Any) -> Any:
    result.refresh()
    return result.status


def error_of(result: Any) -> str:
    return result.errors[0].exception_class_path


def run_again(lost: Any) -> Any:
    """The new run ``requeue_lost_tasks`` enqueued for the ``lost`` one, which names it."""
    assert finished(lost).status == TaskResultStatus.FAILED
    assert error_of(lost) == "idempotency.django_tasks.WorkerLost"
    found = re.search(r"run again as ([0-9a-f-]{36})", lost.errors[0].traceback)
    assert found is not None, lost.errors[0].traceback
    return DBTaskResult.objects.get(pk=UUID(found.group(1))).task_result


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as running:
        yield running


# -- in process -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_every_enqueue_of_one_intent_returns_the_first_result():
    owner = UserFactory()
    sent = [
        place_order.enqueue("o-1", owner.pk, 2),
        place_order.enqueue(ref="o-1", owner_id=owner.pk, quantity=2),
    ]
    run_worker_here()
    again = place_order.enqueue("o-1", owner.pk, quantity=2)  # after the first run finished
    run_worker_here()

    order = Order.objects.get()  # one effect
    for result in [*sent, again]:
        assert finished(result).status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == {"order": order.pk, "quantity": 2}
    record = IdempotencyRecord.objects.get()
    assert (record.scope, record.idem_key, record.status) == (
        f"user:{owner.pk}:orders",
        "o-1",
        Status.SUCCEEDED,
    )
    # The operation is the task function's dotted path.
    assert record.operation == "tests.testapp.background.place_order"


@pytest.mark.django_db(transaction=True)
def test_the_same_key_with_other_arguments_fails_with_key_reused():
    owner = UserFactory()
    first = place_order.enqueue("o-2", owner.pk, 1)
    run_worker_here()
    other = place_order.enqueue("o-2", owner.pk, 5)
    run_worker_here()
    assert finished(first).return_value["quantity"] == 1
    assert finished(other).status == TaskResultStatus.FAILED
    assert error_of(other) == "idempotency.exceptions.KeyReused"
    assert Order.objects.get().quantity == 1


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_record_waits_for_an_operator_fails_with_key_under_review():
    owner = UserFactory()
    first = place_order.enqueue("o-review", owner.pk, 1)
    run_worker_here()
    # As a lost lease no resolver could settle leaves it: an operator's to decide.
    IdempotencyRecord.objects.update(status=Status.NEEDS_REVIEW, expires_at=None)
    again = place_order.enqueue("o-review", owner.pk, 1)
    run_worker_here()
    assert finished(first).status == TaskResultStatus.SUCCESSFUL
    assert finished(again).status == TaskResultStatus.FAILED
    assert error_of(again) == "idempotency.exceptions.KeyUnderReview"
    assert Order.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_context_task_keeps_its_context_out_of_the_intent(provider):
    # Two runs have two contexts (another task result, another attempt number): one intent.
    first = charge_order.enqueue(provider=provider.url, order="c-1", amount=500)
    again = charge_order.enqueue(provider=provider.url, order="c-1", amount=500)
    run_worker_here()
    assert finished(first).return_value == {"charge": "ch_1", "attempt": 1}
    assert finished(again).return_value == first.return_value  # the first run's, replayed
    assert len(provider.calls) == 1
    record = IdempotencyRecord.objects.get()
    # The step key the provider got is the attempt's, which a resolver can derive again.
    assert provider.calls == [key_for_record(record, "charge")]


@task()
@idempotent_task(scope="prices", key=lambda sku: sku)
def price(sku: str) -> dict[str, Any]:
    return {"amount": Decimal("19.90"), "ids": (1, 2)}


@pytest.mark.django_db(transaction=True)
def test_the_first_run_returns_what_every_later_run_returns():
    # The result's JSON form on the first run too (a Decimal is a string, a tuple a list):
    # what the backend stores, and what a later run gets from the record.
    first = price.enqueue("p-1")
    run_worker_here()
    again = price.enqueue("p-1")
    run_worker_here()
    assert finished(first).return_value == {"amount": "19.90", "ids": [1, 2]}
    assert finished(again).return_value == first.return_value


@pytest.mark.django_db(transaction=True)
def test_a_view_that_raises_after_enqueuing_leaves_no_task(provider):
    client = Client(raise_request_exception=False)
    body = {"provider": provider.url, "fail": True}
    failed = client.post(
        "/background/checkout/", body, content_type="application/json", headers=_key("v-1")
    )
    assert failed.status_code == 500
    # The order, the record and the task row rolled back together: the key is free.
    assert not Order.objects.exists()
    assert not IdempotencyRecord.objects.exists()
    assert not DBTaskResult.objects.exists()

    retried = client.post(
        "/background/checkout/",
        {"provider": provider.url},
        content_type="application/json",
        headers=_key("v-1"),
    )
    assert retried.status_code == 201
    assert DBTaskResult.objects.get().id.hex == retried.json()["task"].replace("-", "")
    run_worker_here()
    assert len(provider.charges) == 1


def _key(value: str) -> dict[str, str]:
    return {"Idempotency-Key": value}


def test_the_decorator_refuses_what_would_not_protect_the_task():
    with pytest.raises(TypeError, match=r"under @task\(\), not above it"):
        idempotent_task(key=lambda ref: ref)(place_order)  # above @task(): it gets the Task
    with pytest.raises(TypeError, match=r"@idempotent_task\(key=...\) under @task\(\)"):
        idempotent_task(lambda ref: ref)  # type: ignore[arg-type]  # no parentheses
    with pytest.raises(TypeError, match="needs key="):
        idempotent_task()
    with pytest.raises(TypeError, match="takes no header"):
        idempotent_task(key=lambda ref: ref, header="X-Key")  # type: ignore[call-arg]

    @idempotent_task(key=lambda ref, **_: ref)
    def named_context(context: str, ref: str) -> None: ...

    with pytest.raises(TypeError, match=r"takes_context=True\), or name the parameter"):
        named_context("not a context", "r-1")


@pytest.mark.django_db(transaction=True)
def test_an_async_task_runs_once():
    runs: list[str] = []

    @idempotent_task(scope="async", key=lambda ref: ref)
    async def handle(ref: str) -> dict[str, str]:
        runs.append(ref)
        return {"ref": ref}

    from asgiref.sync import async_to_sync

    assert async_to_sync(handle)("a-1") == async_to_sync(handle)("a-1") == {"ref": "a-1"}
    assert runs == ["a-1"]


@pytest.mark.django_db(transaction=True)
def test_requeue_lost_tasks_puts_back_only_protected_tasks_running_too_long():
    owner = UserFactory()
    protected = place_order.enqueue("r-1", owner.pk)
    fresh = place_order.enqueue("r-2", owner.pk)
    unprotected = plain_task.enqueue()
    long_ago = timezone.now() - timedelta(minutes=10)
    for result, started in (
        (protected, long_ago),
        (fresh, timezone.now()),
        (unprotected, long_ago),
    ):
        DBTaskResult.objects.filter(pk=result.id).update(
            status=TaskResultStatus.RUNNING, started_at=started, worker_ids=["dead"]
        )

    assert requeue_lost_tasks(timedelta(minutes=5)) == 1
    statuses = dict(DBTaskResult.objects.values_list("id", "status"))
    assert [statuses[UUID(r.id)] for r in (protected, fresh, unprotected)] == [
        TaskResultStatus.FAILED,  # its worker lost: it names the run again
        TaskResultStatus.RUNNING,  # may still be running
        TaskResultStatus.RUNNING,  # not protected: a run again could repeat its effect
    ]
    again = run_again(protected)
    assert (again.args, again.kwargs) == (protected.args, protected.kwargs)
    assert again.status == TaskResultStatus.READY
    assert requeue_lost_tasks(timedelta(minutes=5)) == 0  # requeued once only
    run_worker_here()
    assert finished(again).status == TaskResultStatus.SUCCESSFUL
    assert Order.objects.get().sku == sku_for("r-1")


@task()
def plain_task() -> None:
    """Not protected: requeue_lost_tasks leaves it alone."""


@pytest.mark.django_db(transaction=True)
def test_recovery_and_purge_tasks_call_the_services():
    from idempotency.django_tasks_jobs import purge_expired_records, recover_expired_leases

    IdempotencyRecordFactory(expired=True)
    IdempotencyRecordFactory(expired_lease=True, operation="tests.no_resolver")
    recovered = recover_expired_leases.enqueue()
    purged = purge_expired_records.enqueue(batch_size=10)
    run_worker_here()
    assert finished(recovered).return_value["needs_review"] == 1
    assert finished(purged).return_value == 1


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_runs_each_pass_once_with_once(capsys):
    IdempotencyRecordFactory(expired=True)
    IdempotencyRecordFactory(expired_lease=True, operation="tests.no_resolver")
    owner = UserFactory()
    lost = place_order.enqueue("s-1", owner.pk)
    DBTaskResult.objects.filter(pk=lost.id).update(
        status=TaskResultStatus.RUNNING, started_at=timezone.now() - timedelta(hours=1)
    )
    call_command("idempotency_scheduler", once=True, requeue_lost_after=60)
    assert capsys.readouterr().out.splitlines() == [
        "Recovered 1 record; requeued 1 lost tasks.",
        "Purged 1 record.",
    ]
    assert IdempotencyRecord.objects.get().status == Status.NEEDS_REVIEW
    assert status_of(lost) == TaskResultStatus.FAILED
    assert run_again(lost).status == TaskResultStatus.READY


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_runs_until_sigterm_and_outlives_a_failed_pass(monkeypatch, capsys, caplog):
    from idempotency.management.commands import idempotency_scheduler

    calls = []

    def recover(database: str | None = None) -> list[Any]:
        calls.append(database)
        if len(calls) == 1:
            raise ConnectionError("the database restarts")  # logged; the next round runs
        if len(calls) == 3:
            signal.raise_signal(signal.SIGTERM)  # a deploy stops it during a pass
        return []

    monkeypatch.setattr(idempotency_scheduler, "recover_everywhere", recover)
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        call_command("idempotency_scheduler", recover_every=0.05)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert len(calls) == 3  # stopped after the pass under way
    assert "The recovery pass failed." in caplog.text
    out = capsys.readouterr().out.splitlines()
    assert out == ["Purged 0 records.", "Recovered 0 records.", "Recovered 0 records."]


def test_the_scheduler_refuses_a_period_that_is_not_positive():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--purge-every should be a positive number"):
        call_command("idempotency_scheduler", once=True, purge_every=0)


def test_importing_idempotency_needs_no_task_framework():
    script = (
        "import sys\n"
        "sys.modules['django.tasks'] = sys.modules['django_tasks'] = None  # as if absent\n"
        "sys.modules['django_tasks_db'] = None\n"
        "from django.conf import settings\n"
        "settings.configure(INSTALLED_APPS=['django.contrib.contenttypes',\n"
        "    'django.contrib.auth', 'idempotency'], USE_TZ=True)\n"
        "import django; django.setup()\n"
        "import idempotency, idempotency.functions, idempotency.recovery\n"
        "from django.core.management import load_command_class\n"
        "load_command_class('idempotency', 'idempotency_scheduler')\n"
        "try:\n"
        "    import idempotency.django_tasks\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    env = process_env(database=False)
    del env["DJANGO_SETTINGS_MODULE"]
    result = subprocess.run(python("-c", script), env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert 'pip install "django-idempotency[tasks]"' in result.stdout


# -- real processes: db_worker, concurrent requests, a killed process ---------------------


def with_processes(test: Callable[..., None]) -> Callable[..., None]:
    for mark in (pytest.mark.server_db, pytest.mark.django_db(transaction=True)):
        test = mark(test)
    return test


class DBWorkers:
    """``manage.py db_worker`` processes against this test's database."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def __call__(self, count: int = 1, **env: str) -> list[subprocess.Popen[bytes]]:
        """Start ``count`` workers at once; back once each polls for tasks."""
        command = python(
            "-m", "django", "db_worker", "--interval=0.05", "--no-startup-delay", "--no-reload"
        )
        started = []
        for _ in range(count):
            log = self.tmp_path / f"db-worker-{len(self.started)}.log"
            started.append(start(command, process_env(**env), log=log))
            self.started.append((started[-1], log))
        for process in started:
            self.wait_for(process, "Starting worker")
        return started

    def log(self, process: subprocess.Popen[bytes]) -> str:
        return next(log for p, log in self.started if p is process).read_text(errors="replace")

    def wait_for(self, process: subprocess.Popen[bytes], line: str) -> None:
        deadline = time.monotonic() + 60
        while line not in self.log(process):
            assert process.poll() is None, self.log(process)
            assert time.monotonic() < deadline, f"the worker never said {line!r}"
            time.sleep(0.05)

    def stop_all(self) -> None:
        for process, log in self.started:
            stop(process)
            print(log.read_text(errors="replace"))  # shown by pytest when the test failed


@pytest.fixture
def db_worker(tmp_path: Path) -> Iterator[DBWorkers]:
    workers = DBWorkers(tmp_path)
    yield workers
    workers.stop_all()


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@with_processes
def test_duplicate_enqueues_through_two_workers_make_one_order(db_worker):
    owner = UserFactory()
    # The first run takes a second: the other worker's duplicate waits on the record's row
    # lock (lock_timeout=30), then answers with the first's result.
    db_worker(count=2)  # both ready, each polling every 50 ms
    sent = [place_order.enqueue("w-1", owner.pk, 3, seconds=1) for _ in range(3)]
    wait_until(lambda: all(r.refresh() or r.is_finished for r in sent), "the tasks never finished")

    order = Order.objects.get()
    assert [r.status for r in sent] == [TaskResultStatus.SUCCESSFUL] * 3
    assert [r.return_value for r in sent] == [{"order": order.pk, "quantity": 3}] * 3
    assert len({worker for r in sent for worker in r.worker_ids}) == 2  # both took part


@with_processes
def test_a_worker_killed_mid_task_runs_it_again_with_one_charge(db_worker, provider):
    result = charge_order.enqueue(provider=provider.url, order="k-1", amount=500)
    [dying] = db_worker(**{HANG_IN_TASK: "1"})
    db_worker.wait_for(dying, "charged k-1")
    dying.send_signal(signal.SIGKILL)  # no finish, no release: a lost machine
    assert dying.wait(timeout=10) == -signal.SIGKILL
    record = IdempotencyRecord.objects.get()
    assert record.status == Status.PROCESSING  # as the dead worker left it
    step = IdempotencyStep.objects.get(record=record, name="charge")  # the charge, recorded
    assert status_of(result) == TaskResultStatus.RUNNING  # in limbo: no worker will take it

    time.sleep(LEASE_SECONDS + 0.2)  # the dead run's lease ends
    assert requeue_lost_tasks(stale_after=0) == 1  # what docs/tasks.md prescribes
    run_worker_here()  # another worker takes it; the task's resolver lets it take over

    again = run_again(result)
    assert finished(again).status == TaskResultStatus.SUCCESSFUL, again.errors
    # A new task result (its first attempt) for the record's second attempt.
    assert again.return_value == {"charge": "ch_1", "attempt": 1}
    assert len(provider.charges) == 1  # one charge for the intent
    # The run again took the recorded charge and made no call; the one call the provider
    # saw carried the step's key, the same for every attempt of the intent.
    record = IdempotencyRecord.objects.get()
    assert provider.calls == [step.step_key] == [key_for_record(record, "charge")]
    assert (record.status, record.attempts) == (Status.SUCCEEDED, 2)


@with_processes
@pytest.mark.postgres  # MariaDB runs the lease-mode kill above; CI's time is kept short
def test_a_worker_killed_in_an_atomic_task_leaves_nothing_and_runs_it_once(db_worker):
    owner = UserFactory()
    result = place_order.enqueue("k-2", owner.pk)
    [dying] = db_worker(**{HANG_IN_TASK: "1"})
    db_worker.wait_for(dying, "placed k-2")  # inside its transaction: written, not committed
    dying.send_signal(signal.SIGKILL)
    assert dying.wait(timeout=10) == -signal.SIGKILL
    # The transaction died with the connection: no order, no record, the key free.
    assert not Order.objects.exists() and not IdempotencyRecord.objects.exists()
    assert status_of(result) == TaskResultStatus.RUNNING

    assert requeue_lost_tasks(stale_after=0) == 1
    run_worker_here()
    again = run_again(result)
    assert finished(again).status == TaskResultStatus.SUCCESSFUL, again.errors
    assert again.return_value == {"order": Order.objects.get().pk, "quantity": 1}


@with_processes
@pytest.mark.parametrize(
    "view", ["checkout", pytest.param("checkout-run", marks=pytest.mark.postgres)]
)
def test_concurrent_duplicate_requests_enqueue_one_task(provider, view):
    # Two requests with one key at once, each in its own thread (its own connection): the
    # duplicate waits on the row lock (checkout) or runs the view and then rolls back, its
    # enqueue with it (checkout-run, in_flight="run").
    body = {"provider": provider.url, "seconds": 1}
    answers: list[Any] = []

    def post() -> None:
        answers.append(
            Client().post(
                f"/background/{view}/", body, content_type="application/json", headers=_key("d-1")
            )
        )
        from django.db import connection

        connection.close()

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(a.status_code for a in answers) == [201, 201]
    assert sorted(a.has_header("Idempotent-Replayed") for a in answers) == [False, True]
    assert answers[0].json() == answers[1].json()
    assert Order.objects.count() == DBTaskResult.objects.count() == 1
    run_worker_here()
    assert len(provider.charges) == len(provider.calls) == 1


@with_processes
@pytest.mark.parametrize(
    "enqueue", ["in the transaction", pytest.param("on commit", marks=pytest.mark.postgres)]
)
def test_a_process_killed_right_after_its_commit(provider, enqueue):
    body = {"provider": provider.url, "die_after_commit": True, "on_commit": enqueue == "on commit"}
    script = (
        "import django, json, sys; django.setup()\n"
        "from django.test import Client\n"
        "Client().post('/background/checkout/', json.loads(sys.argv[1]),\n"
        "              content_type='application/json', headers={'Idempotency-Key': 'p-1'})\n"
        "print('answered')\n"
    )
    killed = subprocess.run(
        python("-c", script, json.dumps(body)), env=process_env(), capture_output=True, text=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "answered" not in killed.stdout
    # The record, the order and (enqueued in the transaction) the task all committed.
    assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED
    assert Order.objects.count() == 1

    # The client's retry of the same request: answered from the record, the view not run.
    retried = Client().post(
        "/background/checkout/", body, content_type="application/json", headers=_key("p-1")
    )
    assert retried.status_code == 201 and retried.has_header("Idempotent-Replayed")
    run_worker_here()
    if enqueue == "in the transaction":
        assert DBTaskResult.objects.get().status == TaskResultStatus.SUCCESSFUL
        assert len(provider.charges) == 1
    else:
        # Lost: the record says done, every retry is a replay, and no task will ever run.
        assert not DBTaskResult.objects.exists()
        assert provider.charges == []
