import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.processes import process_env, python, start, stop

BROKER = os.environ.get("IDEMPOTENCY_TEST_BROKER", "redis://127.0.0.1:6379/9")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("REQUIRE_POSTGRES") and connection.vendor != "postgresql":
        raise pytest.UsageError(
            "REQUIRE_POSTGRES is set but DATABASE_URL does not point at PostgreSQL."
        )


@pytest.fixture(autouse=True)
def _postgres_marker_needs_postgres(request):
    # A postgres test run against SQLite would prove nothing: fail it, never skip.
    if request.node.get_closest_marker("postgres") and connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL: run it with DATABASE_URL=postgres://...")


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
