"""The Celery tasks and the beat schedule, through a real worker on the Redis broker."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest

from idempotency.beat import IDEMPOTENCY_BEAT_SCHEDULE, PURGE_TASK, RECOVER_TASK, beat_schedule
from idempotency.models import IdempotencyRecord, Status
from tests.support.factories import IdempotencyRecordFactory, UserFactory
from tests.support.processes import process_env, python
from tests.testapp.lease_views import LEASE_OPERATION, sku_for
from tests.testapp.models import Order


def test_importing_idempotency_does_not_need_celery():
    script = (
        "import sys; sys.modules['celery'] = None\n"  # as if Celery were not installed
        "import django; django.setup()\n"
        "import idempotency, idempotency.beat, idempotency.recovery, idempotency.retention\n"
        "from idempotency import idempotent_function, purge, recover_expired\n"
        "from idempotency.functions import CallGuard\n"
        "from django.core.management import load_command_class\n"
        "load_command_class('idempotency', 'idempotency_cleanup')\n"
        "load_command_class('idempotency', 'idempotency_recover')\n"
        "for module in ('idempotency.tasks', 'idempotency.celery'):\n"
        "    try:\n"
        "        __import__(module)\n"
        "    except ImportError:\n"
        "        print(module, 'needs celery')\n"
    )
    result = subprocess.run(
        python("-c", script),
        env=process_env(database=False),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "idempotency.tasks needs celery\nidempotency.celery needs celery\n"


def test_beat_schedule_names_the_tasks():
    from tests.support.celery_app import app

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


def send(task: str, queue: str, **kwargs: Any) -> Any:
    from tests.support.celery_app import app

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
