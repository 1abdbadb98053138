"""Several app servers and several Celery workers on one database, one of them killed.

Three gunicorn instances of the example project (each with its workers) serve
one PostgreSQL database; every key's duplicates go to all three at once, and
one instance is killed (SIGKILL, workers and all) while they run. Clients do
what clients do: retry the same key on another instance. One effect per key.

Then two Celery workers (one with beat) run recovery and purge at once over the
same records: the signals each worker sends, appended to a ledger, show that no
record was processed twice and that both shared the work.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from idempotency.beat import PURGE_TASK, RECOVER_TASK
from tests.support.celery_app import app
from tests.support.example_server import Server, _manage, example_project, gunicorn_instance
from tests.support.processes import database_url
from tests.support.servers import Reply

pytestmark = [pytest.mark.postgres, pytest.mark.topology, pytest.mark.celery]

INSTANCES = 3
KEYS = 24
LOST = 400  # expired leases for recovery
EXPIRED = 400  # finished records past their retention, for purge
BATCH = 10  # small batches: the two workers' passes interleave


@pytest.fixture(scope="module")
def example_database(django_db_blocker: Any) -> Any:
    with example_project(django_db_blocker) as (database, env):
        yield database, env


def order(index: int) -> dict[str, Any]:
    return {"sku": f"topology-{index}", "quantity": 1}


def until_answered(
    servers: list[Server], first: int, index: int, cut: list[int] | None = None
) -> Reply:
    """One client's request for key ``index``: sent to instance ``first``, retried elsewhere.

    A refused or cut connection (the killed instance) or a 409 (a duplicate in
    flight) is retried with the same key on the next instance.
    """
    deadline = time.monotonic() + 90
    attempt = 0
    while True:
        server = servers[(first + attempt) % len(servers)]
        attempt += 1
        try:
            reply = server.create_order(order(index), key=f"topology-{index}")
        except OSError:  # refused, reset or cut short: the killed instance
            reply = None
            if cut is not None:
                cut.append(index)
        if reply is not None and reply.status != 409:
            return reply
        assert time.monotonic() < deadline, f"key {index} never got an answer"
        time.sleep(0.2)


def test_duplicates_across_instances_one_killed_mid_load_one_effect_per_key(example_database):
    database, env = example_database
    with ExitStack() as stack:
        instances = [stack.enter_context(gunicorn_instance(env)) for _ in range(INSTANCES)]
        servers = [Server(url, database) for url, _process in instances]
        _, victim = instances[1]
        jobs = [(index, first) for index in range(KEYS) for first in range(INSTANCES)]
        cut: list[int] = []
        with ThreadPoolExecutor(max_workers=24) as pool:
            futures = [
                pool.submit(until_answered, servers, first, index, cut) for index, first in jobs
            ]
            # Mid-load: a third answered, the rest in flight or queued on every instance.
            deadline = time.monotonic() + 60
            while sum(future.done() for future in futures) < len(jobs) // 3:
                assert time.monotonic() < deadline, "the load never got going"
                time.sleep(0.01)
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(timeout=10)
            replies = [future.result(timeout=120) for future in futures]
        survivors = [servers[0], servers[2]]
        # One more retry of every key, on a surviving instance: the one order, replayed.
        again = [until_answered(survivors, index % 2, index) for index in range(KEYS)]
    assert cut, "no request met the killed instance: it was not killed mid-load"
    assert Counter(reply.status for reply in replies) == {201: len(jobs)}, [
        (reply.status, reply.body[:200]) for reply in replies if reply.status != 201
    ]
    assert all(reply.status == 201 and reply.replayed for reply in again)
    for index in range(KEYS):
        answers = {reply.body for reply in replies[index * INSTANCES : (index + 1) * INSTANCES]}
        assert answers == {again[index].body}, f"key {index} was answered differently"
        assert servers[0].orders_with_sku(f"topology-{index}") == 1, f"key {index}"


def records_code() -> str:
    return f"""
from datetime import timedelta
from django.utils import timezone
from idempotency.models import IdempotencyRecord, Status
past = timezone.now() - timedelta(minutes=5)
def record(key, **fields):
    return IdempotencyRecord(scope="topology", idem_key=key, request_hash=bytes(16),
                             owner_token=("t-" + key).encode(), **fields)
IdempotencyRecord.objects.bulk_create(
    [record(f"lost-{{i}}", operation="topology.lost", status=Status.PROCESSING, lease_until=past)
     for i in range({LOST})]
    + [record(f"old-{{i}}", operation="topology.old", status=Status.SUCCEEDED,
              completed_at=past, expires_at=past) for i in range({EXPIRED})]
)
"""


def test_recovery_and_purge_on_two_workers_at_once_never_process_a_record_twice(
    example_database: Any, worker: Callable[..., str], tmp_path: Path
) -> None:
    database, env = example_database
    ledger = tmp_path / "ledger"
    ledger.touch()
    _manage(env, "shell", "-c", records_code())
    on_example = {"DATABASE_URL": database_url(database), "IDEMPOTENCY_TEST_LEDGER": str(ledger)}
    beat_schedule = str(tmp_path / "beat-schedule")
    with_beat = ("--beat", f"--schedule={beat_schedule}")
    # The worker without beat first: started second, it could still be starting when the
    # other's beat, due a second after its start, had recovered everything.
    plain = worker(**on_example)
    queues = [worker(*with_beat, IDEMPOTENCY_TEST_BEAT_EVERY="1", **on_example), plain]
    # Both workers at once, each a recovery and a purge pass (beat adds its own).
    results = [
        app.send_task(task, args=[BATCH], queue=queue)
        for task in (RECOVER_TASK, PURGE_TASK)
        for queue in queues
    ]
    for result in results:
        result.get(timeout=120)
    server = Server("", database)
    deadline = time.monotonic() + 60
    left = (
        "SELECT count(*) FROM idempotency_idempotencyrecord "
        "WHERE scope = 'topology' AND status IN ('PROCESSING', 'SUCCEEDED')"
    )
    while server.count(left):
        assert time.monotonic() < deadline, "recovery and purge did not finish"
        time.sleep(0.5)
    lines = [line.split() for line in ledger.read_text().splitlines()]
    recovered = Counter(int(pk) for event, pk, _pid in lines if event == "recovered")
    purged = sum(int(count) for event, count, _pid in lines if event == "purged")
    assert len(recovered) == LOST and set(recovered.values()) == {1}, recovered.most_common(3)
    assert purged == EXPIRED
    # Both workers shared the recovery: neither waited for the other's pass to end.
    by_worker = Counter(pid for event, _pk, pid in lines if event == "recovered")
    assert len(by_worker) == 2, by_worker
    # Without a resolver, a lost lease needs a person, never a blind re-run.
    assert (
        server.count(
            "SELECT count(*) FROM idempotency_idempotencyrecord WHERE status = 'NEEDS_REVIEW' "
            "AND recovery_attempts = 1"
        )
        == LOST
    )
