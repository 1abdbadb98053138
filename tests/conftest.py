import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.support.processes import process_env, python, start, stop

BROKER = os.environ.get("IDEMPOTENCY_TEST_BROKER", "redis://127.0.0.1:6379/9")

# Marker -> the database vendors its tests need (a test run elsewhere would prove nothing).
NEEDS = {
    "postgres": ({"postgresql"}, "PostgreSQL: run it with DATABASE_URL=postgres://..."),
    "mariadb": ({"mysql"}, "MariaDB or MySQL: run it with DATABASE_URL=mysql://..."),
    "server_db": (
        {"postgresql", "mysql"},
        "PostgreSQL or MariaDB/MySQL: run it with DATABASE_URL=postgres://... or mysql://...",
    ),
}

REQUIRED = {
    "REQUIRE_POSTGRES": ("postgresql", "PostgreSQL"),
    "REQUIRE_MARIADB": ("mysql", "MariaDB or MySQL"),
}


# The fixtures through which a test reaches a database (pytest-django's and this suite's).
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "live_server"})


def pytest_collection_modifyitems(config, items):
    for variable, (vendor, name) in REQUIRED.items():
        if os.environ.get(variable) and connection.vendor != vendor:
            raise pytest.UsageError(f"{variable} is set but DATABASE_URL does not point at {name}.")
    if os.environ.get("DATABASE_TESTS_ONLY"):
        # A pass on a second database runs what a database can change; the rest ran on
        # SQLite already (pytest-django refuses a database to a test without its marker).
        chosen = [item for item in items if _reaches_a_database(item)]
        config.hook.pytest_deselected(items=[item for item in items if item not in chosen])
        items[:] = chosen


def _reaches_a_database(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(name) for name in ("django_db", *NEEDS, "celery")):
        return True
    return bool(DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())))


@pytest.fixture(autouse=True)
def _database_markers_need_their_database(request):
    # Fail, never skip: a skipped concurrency test hides a missing guarantee.
    for marker, (vendors, advice) in NEEDS.items():
        if request.node.get_closest_marker(marker) and connection.vendor not in vendors:
            pytest.fail(f"this test needs {advice}")


class Workers:
    """``celery worker`` processes against this test's database, each on a queue of its own.

    Called, it starts one and returns its queue; ``process(queue)`` is that worker's
    process, for a test that kills it (it runs tasks itself: ``--pool=solo``).
    """

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: dict[str, tuple[subprocess.Popen, Path]] = {}

    def __call__(self, *extra: str, **env: str) -> str:
        queue = f"idempotency-tests-{uuid.uuid4().hex[:8]}"
        log = self.tmp_path / f"worker-{len(self.started)}.log"
        command = python(
            "-m",
            "celery",
            "-A",
            "tests.support.celery_app",
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
        process = start(command, environment, log=log)
        self.started[queue] = (process, log)
        # Until it has bound its queue: a task sent before that has no route and is lost.
        deadline = time.monotonic() + 60
        while " ready." not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the worker never got ready"
            time.sleep(0.1)
        return queue

    def process(self, queue: str) -> subprocess.Popen:
        return self.started[queue][0]

    def stop_all(self) -> None:
        for process, log in self.started.values():
            stop(process)
            print(log.read_text())  # shown by pytest when the test failed


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Workers]:
    """Start ``celery worker`` against this test's database, on a queue of its own."""
    workers = Workers(tmp_path)
    yield workers
    workers.stop_all()


@pytest.fixture(autouse=True)
def _no_durations_from_other_tests(monkeypatch):
    # Retry-After uses the durations this process saw: each test starts with none.
    from idempotency.protocol import claim as waiting

    monkeypatch.setattr(waiting, "durations", waiting.Durations())


@pytest.fixture
def unmigrated() -> Iterator[None]:
    """The app installed, its migrations unapplied: ``migrate idempotency`` never ran."""
    from django.core.management import call_command

    call_command("migrate", "idempotency", "zero", verbosity=0)
    try:
        yield
    finally:
        call_command("migrate", "idempotency", verbosity=0)


@pytest.fixture
def records_table_dropped() -> Iterator[None]:
    """The app's migrations recorded as applied, its table gone (dropped by hand, or faked)."""
    from django.apps import apps

    from idempotency.models import IdempotencyRecord
    from idempotency.stores import step_cascade as steps

    # The steps' foreign key (or SQLite trigger) goes first: MariaDB refuses to drop a
    # table another one references, and it must be back with the table afterwards.
    with connection.schema_editor() as editor:
        steps.drop_cascade(apps, editor)
        editor.delete_model(IdempotencyRecord)
    try:
        yield
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(IdempotencyRecord)
            steps.add_cascade(apps, editor)
