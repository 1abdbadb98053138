"""The Celery tasks and the beat schedule, through a real worker on the Redis broker."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotency.beat import IDEMPOTENCY_BEAT_SCHEDULE, PURGE_TASK, RECOVER_TASK, beat_schedule
from idempotency.models import IdempotencyRecord, Status
from tests.factories import IdempotencyRecordFactory, UserFactory
from tests.processes import process_env, python, start, stop
from tests.testapp.lease_views import LEASE_OPERATION, sku_for
from tests.testapp.models import Order

BROKER = "redis://127.0.0.1:6379/9"


def test_importing_idempotency_does_not_need_celery():
    script = (
        "import sys; sys.modules['celery'] = None\n"  # as if Celery were not installed
        "import django; django.setup()\n"
        "import idempotency, idempotency.beat, idempotency.recovery, idempotency.retention\n"
        "from idempotency import purge, recover_expired\n"
        "from django.core.management import load_command_class\n"
        "load_command_class('idempotency', 'idempotency_cleanup')\n"
        "load_command_class('idempotency', 'idempotency_recover')\n"
        "try:\n"
        "    import idempotency.tasks\n"
        "except ImportError:\n"
        "    print('tasks need celery')\n"
    )
    result = subprocess.run(
        python("-c", script),
        env=process_env(database=False),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "tasks need celery\n"


def test_beat_schedule_names_the_tasks():
    from tests.celery_app import app

    app.loader.import_default_modules()
    tasks = {entry["task"] for entry in IDEMPOTENCY_BEAT_SCHEDULE.values()}
    assert tasks == {RECOVER_TASK, PURGE_TASK}
    assert tasks <= set(app.tasks)
    every = {
        name: entry["schedule"].total_seconds() for name, entry in beat_schedule(5, 50).items()
    }
    assert every == {
        "idempotency-recover-expired-leases": 5,
        "idempotency-purge-expired-records": 50,
    }


@pytest.mark.django_db
def test_tasks_call_the_services():
    from idempotency.tasks import purge_expired_records, recover_expired_leases

    IdempotencyRecordFactory(expired=True)
    IdempotencyRecordFactory(expired_lease=True, operation="tests.no_resolver")
    report = recover_expired_leases.run()
    assert report["needs_review"] == 1
    assert purge_expired_records.run(batch_size=10) == 1


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start ``celery worker`` against this test's database, on a queue of its own."""
    started: list[tuple[subprocess.Popen, Path]] = []

    def launch(*extra: str, **env: str) -> str:
        queue = f"idempotency-tests-{uuid.uuid4().hex[:8]}"
        log = tmp_path / f"worker-{len(started)}.log"
        command = python(
            "-m",
            "celery",
            "-A",
            "tests.celery_app",
            "worker",
            "--pool=solo",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=INFO",
            f"--hostname={queue}@%h",
            "-Q",
            queue,
            *extra,
        )
        environment = process_env(
            IDEMPOTENCY_TEST_BROKER=BROKER, IDEMPOTENCY_TEST_QUEUE=queue, **env
        )
        started.append((start(command, environment, log=log), log))
        return queue

    yield launch
    for process, log in started:
        stop(process)
        print(log.read_text())  # shown by pytest when the test failed


def send(task: str, queue: str, **kwargs: Any) -> Any:
    from tests.celery_app import app

    return app.send_task(task, kwargs=kwargs, queue=queue).get(timeout=30)


@pytest.mark.celery
@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_tasks_through_a_real_worker(worker):
    owner = UserFactory()
    done = IdempotencyRecordFactory(expired_lease=True, operation=LEASE_OPERATION)
    order = Order.objects.create(owner=owner, sku=sku_for(done.idem_key), quantity=1)
    not_done = IdempotencyRecordFactory(expired_lease=True, operation=LEASE_OPERATION)
    old = [IdempotencyRecordFactory(expired=True) for _ in range(5)]
    kept = IdempotencyRecordFactory(succeeded=True)
    queue = worker()

    # The worker finds the view's resolver by loading the URLconf: no request ever ran there.
    report = send(RECOVER_TASK, queue, batch_size=1)
    assert (report["succeeded"], report["released"], report["examined"]) == (1, 1, 2)
    done.refresh_from_db()
    assert done.status == Status.SUCCEEDED
    assert done.resource_id == str(order.pk)
    not_done.refresh_from_db()
    assert not_done.status == Status.FAILED_RETRYABLE

    assert send(PURGE_TASK, queue, batch_size=2) == 5
    assert not IdempotencyRecord.objects.filter(pk__in=[r.pk for r in old]).exists()
    assert IdempotencyRecord.objects.filter(pk=kept.pk).exists()
    assert Order.objects.count() == 1


@pytest.mark.celery
@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_beat_runs_recovery_on_schedule(worker, tmp_path):
    owner = UserFactory()
    record = IdempotencyRecordFactory(expired_lease=True, operation=LEASE_OPERATION)
    Order.objects.create(owner=owner, sku=sku_for(record.idem_key), quantity=1)
    worker("--beat", f"--schedule={tmp_path / 'beat-schedule'}", IDEMPOTENCY_TEST_BEAT_EVERY="1")
    deadline = time.monotonic() + 30
    while IdempotencyRecord.objects.get(pk=record.pk).status == Status.PROCESSING:
        assert time.monotonic() < deadline, "beat did not run the recovery task"
        time.sleep(0.2)
    assert IdempotencyRecord.objects.get(pk=record.pk).status == Status.SUCCEEDED
