"""What a duplicate of an attempt still in flight gets: ``IN_FLIGHT`` / ``in_flight=``.

Real threads, each request on its own connection, on PostgreSQL and MariaDB (the
``server_db`` set runs on both): by default an atomic-mode duplicate waits on the
first attempt's row lock and replays its outcome; with ``"conflict"`` it answers
409 with ``Retry-After`` at once, however long ``LOCK_TIMEOUT`` is.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIRequestFactory, force_authenticate

from idempotency import idempotent, idempotent_function
from idempotency.celery import IdempotentTask
from idempotency.exceptions import KeyInUse
from idempotency.http import IdempotencyOptions, build_operation
from idempotency.ninja import idempotent as ninja_idempotent
from tests.protocol.test_concurrency import (
    ORDER,
    THREADS,
    Answer,
    Claimed,
    create_order,
    post_order,
)
from tests.support.example_server import Server, example_project, gunicorn, orders_held
from tests.support.factories import UserFactory
from tests.support.servers import Reply
from tests.support.threads import JOIN_TIMEOUT, Call, run_in_threads
from tests.testapp.models import Order
from tests.testapp.views import OrderViewSet

# Long enough that a duplicate that waits for the lock is plainly seen to wait.
LOCK_TIMEOUT = 20.0
FIRST_RUNS = 3.0  # seconds the first request holds its key
# An answer "at once": far below FIRST_RUNS, with room for a loaded 2-core machine.
AT_ONCE = 1.5


class ConflictOrderViewSet(OrderViewSet):
    idempotency_in_flight = "conflict"


create_conflicting = ConflictOrderViewSet.as_view({"post": "create"})


@pytest.fixture
def user():
    return UserFactory()


def timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def send(user: Any, key: str, view: Any, seconds: float) -> Answer:
    request = APIRequestFactory().post(
        f"/orders/?sleep={seconds}", ORDER, format="json", headers={"Idempotency-Key": key}
    )
    force_authenticate(request, user=user)
    response = view(request)
    if hasattr(response, "render"):  # a replay is a plain HttpResponse
        response.render()
    return Answer(response.status_code, response.content, dict(response.items()))


def duplicate_of_a_running_first(
    user: Any, view: Any = create_order
) -> tuple[Answer, float, Answer]:
    """The first request claims its key and runs ``FIRST_RUNS`` s; a duplicate arrives meanwhile.

    Returns the duplicate's answer, how long it took, and the first's answer.
    """
    with Claimed() as claimed:
        first = Call(lambda: send(user, "k", view, FIRST_RUNS))
        first.start()
        assert claimed.wait(JOIN_TIMEOUT), "the first request never claimed its key"
        started = time.monotonic()
        duplicate = Call(lambda: send(user, "k", view, FIRST_RUNS))
        duplicate.start()
        answer = duplicate.result()
        seconds = time.monotonic() - started
        created = first.result()
    return answer, seconds, created


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
class TestConcurrentDuplicates:
    def test_by_default_the_duplicate_waits_for_the_lock_and_replays(self, user):
        with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": LOCK_TIMEOUT}):
            answer, seconds, created = duplicate_of_a_running_first(user)
        assert created.status == 201 and not created.replayed
        # It waited for the first to commit, then got its response: not a 409, not a 2nd run.
        assert (answer.status, answer.body, answer.replayed) == (201, created.body, True)
        assert seconds > FIRST_RUNS / 2
        assert Order.objects.count() == 1

    def test_conflict_setting_answers_409_at_once(self, user):
        settings = {"LOCK_TIMEOUT": LOCK_TIMEOUT, "IN_FLIGHT": "conflict", "RETRY_AFTER": 2}
        with override_settings(IDEMPOTENCY=settings):
            answer, seconds, created = duplicate_of_a_running_first(user)
            repeat = send(user, "k", create_order, FIRST_RUNS)
        assert answer.status == 409
        assert json.loads(answer.body)["code"] == "idempotency_key_in_use"
        assert answer.headers["Retry-After"] == "2"
        assert seconds < AT_ONCE, f"the duplicate waited {seconds:.1f} s"
        assert created.status == 201
        # Once the first committed, a repeat is a replay, not a 409.
        assert (repeat.status, repeat.body, repeat.replayed) == (201, created.body, True)
        assert Order.objects.count() == 1

    def test_conflict_per_view_answers_409_at_once(self, user):
        # The setting says wait; the view's own option says conflict.
        with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": LOCK_TIMEOUT}):
            answer, seconds, created = duplicate_of_a_running_first(user, create_conflicting)
        assert answer.status == 409
        assert "Retry-After" in answer.headers
        assert seconds < AT_ONCE, f"the duplicate waited {seconds:.1f} s"
        assert created.status == 201
        assert Order.objects.count() == 1

    def test_a_view_may_wait_when_the_setting_says_conflict(self, user):
        class WaitingOrderViewSet(OrderViewSet):
            idempotency_in_flight = "wait"

        view = WaitingOrderViewSet.as_view({"post": "create"})
        settings = {"LOCK_TIMEOUT": LOCK_TIMEOUT, "IN_FLIGHT": "conflict"}
        with override_settings(IDEMPOTENCY=settings):
            answer, _, created = duplicate_of_a_running_first(user, view)
        assert (answer.status, answer.body, answer.replayed) == (201, created.body, True)

    def test_simultaneous_duplicates_with_conflict_execute_once(self, user):
        settings = {"LOCK_TIMEOUT": LOCK_TIMEOUT, "IN_FLIGHT": "conflict"}
        with override_settings(IDEMPOTENCY=settings):
            answers = run_in_threads(
                THREADS, lambda i: timed(lambda: post_order(user, "hot", query="?sleep=2"))
            )
        statuses = Counter(answer.status for answer, _ in answers)
        assert set(statuses) <= {201, 409}, statuses
        assert statuses[409] >= 1
        assert Order.objects.count() == 1
        assert len([a for a, _ in answers if a.status == 201 and not a.replayed]) == 1
        # No 409 waited for the lock (each may still queue for a connection and the CPU).
        assert max(seconds for answer, seconds in answers if answer.status == 409) < 2 + AT_ONCE

    def test_conflict_for_a_function(self):
        started, release = threading.Event(), threading.Event()

        @idempotent_function(scope="in-flight-test", key=lambda n: f"n-{n}", in_flight="conflict")
        def slow(n: int) -> int:
            started.set()
            release.wait(JOIN_TIMEOUT)
            return n

        results: list[Any] = []

        def first() -> None:
            try:
                results.append(slow(1))
            finally:
                connection.close()

        thread = threading.Thread(target=first, daemon=True)
        with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": LOCK_TIMEOUT}):
            thread.start()
            assert started.wait(JOIN_TIMEOUT)
            outcome: list[Any] = []

            def duplicate() -> None:
                try:
                    outcome.append(timed(lambda: slow(1)))
                except KeyInUse as error:
                    outcome.append(error)
                finally:
                    connection.close()

            other = threading.Thread(target=duplicate, daemon=True)
            started_at = time.monotonic()
            other.start()
            other.join(JOIN_TIMEOUT)
            waited = time.monotonic() - started_at
            release.set()
            thread.join(JOIN_TIMEOUT)
            assert slow(1) == 1  # a replay once the first committed
        assert isinstance(outcome[0], KeyInUse), outcome
        assert waited < AT_ONCE
        assert results == [1]


@pytest.fixture(scope="module")
def conflicting_server(django_db_blocker: Any) -> Iterator[Server]:
    """The example project with ``IN_FLIGHT = "conflict"`` and a long ``LOCK_TIMEOUT``."""
    with example_project(django_db_blocker) as (database, env):
        env = {**env, "IDEMPOTENCY_IN_FLIGHT": "conflict", "IDEMPOTENCY_LOCK_TIMEOUT": "20"}
        with gunicorn(env) as url:
            yield Server(url=url, database=database)


@pytest.mark.postgres
@pytest.mark.parametrize("path", ["/api/orders/", "/ninja/orders", "/ninja/async/orders"])
def test_over_http_a_duplicate_of_an_attempt_in_flight_gets_409_at_once(conflicting_server, path):
    server, body = conflicting_server, {"sku": f"in-flight-{uuid.uuid4().hex[:8]}", "quantity": 1}
    key = str(uuid.uuid4())
    answers: dict[str, Reply] = {}
    with orders_held(server) as held:
        first = threading.Thread(
            target=lambda: answers.update(first=server.create_order(body, key, path=path)),
            daemon=True,
        )
        first.start()
        held.wait_for_a_blocked_insert()
        duplicate, seconds = timed(lambda: server.create_order(body, key, path=path))
        still_running = first.is_alive()
    first.join(JOIN_TIMEOUT)

    assert still_running
    assert duplicate.status == 409, duplicate
    assert duplicate.json()["code"] == "idempotency_key_in_use"
    assert int(duplicate.headers["retry-after"]) >= 1
    assert seconds < AT_ONCE, f"the duplicate waited {seconds:.1f} s"
    assert answers["first"].status == 201
    replay = server.create_order(body, key, path=path)
    assert (replay.status, replay.replayed) == (201, True)
    assert server.orders_with_sku(body["sku"]) == 1


def test_the_option_is_checked():
    with pytest.raises(ValueError, match="in_flight should be one of"):
        IdempotencyOptions(in_flight="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        IdempotencyOptions(in_flight="conflict", wait_seconds=5)
    with pytest.raises(ValueError, match="in_flight should be one of"):
        idempotent_function(scope="s", key=str, in_flight="no")(lambda n: n)  # type: ignore[arg-type]


def test_each_entry_point_passes_the_option_on(rf):
    @idempotent(in_flight="conflict")
    def view(request): ...

    @ninja_idempotent(in_flight="conflict")
    def operation(request): ...

    class Task(IdempotentTask):
        name = "tests.in_flight_task"
        idempotency_key = staticmethod(lambda ref: ref)
        idempotency_in_flight = "conflict"

        def run(self, ref):
            return ref

    request = rf.post("/orders/")
    request.user = UserFactory.build(pk=1)
    for options in (view.idempotency_options, operation.idempotency_options):
        assert build_operation(request, options, "k", "op").conflict_at_once
    assert Task()._idempotency.options.in_flight == "conflict"
    # Unset per view, the setting decides; set per view, the view does.
    unset = build_operation(request, IdempotencyOptions(), "k", "op")
    waits = build_operation(request, IdempotencyOptions(in_flight="wait"), "k", "op")
    assert not unset.conflict_at_once
    with override_settings(IDEMPOTENCY={"IN_FLIGHT": "conflict"}):
        assert unset.conflict_at_once and unset.wait_for == 0
        assert not waits.conflict_at_once
