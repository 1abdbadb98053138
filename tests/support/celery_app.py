"""The Celery app of tests/protocol/test_tasks.py: Redis broker, the idempotency tasks.

The test starts ``celery -A tests.support.celery_app worker`` with ``DATABASE_URL``
pointing at the test database and its own queue.
"""

from __future__ import annotations

import os

from celery import Celery

from idempotency.beat import beat_schedule

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

BROKER = os.environ.get("IDEMPOTENCY_TEST_BROKER", "redis://127.0.0.1:6379/9")
QUEUE = os.environ.get("IDEMPOTENCY_TEST_QUEUE", "idempotency-tests")

app = Celery(
    "tests", broker=BROKER, backend=BROKER, include=["idempotency.tasks", "tests.testapp.tasks"]
)
app.conf.update(
    task_default_queue=QUEUE,
    result_expires=600,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
if os.environ.get("IDEMPOTENCY_TEST_BEAT_EVERY"):
    every = float(os.environ["IDEMPOTENCY_TEST_BEAT_EVERY"])
    app.conf.beat_schedule = beat_schedule(recover_every=every, purge_every=every)

if os.environ.get("IDEMPOTENCY_TEST_LEDGER"):
    # tests/deployment/test_topology.py: each worker appends what it recovered and purged, one
    # line each (appends of a line are atomic), for the test to count.
    from idempotency import signals

    LEDGER = os.environ["IDEMPOTENCY_TEST_LEDGER"]

    def _write(line: str) -> None:
        with open(LEDGER, "a") as ledger:
            ledger.write(f"{line} {os.getpid()}\n")

    def _recovered(sender: object, record: object, **kwargs: object) -> None:
        _write(f"recovered {record.pk}")  # type: ignore[attr-defined]

    def _purged(sender: object, count: int = 0, **kwargs: object) -> None:
        _write(f"purged {count}")

    signals.record_recovered.connect(_recovered, weak=False)
    signals.records_purged.connect(_purged, weak=False)
