"""Duplicates of a lease-mode attempt in flight: waiting for its outcome, and ``Retry-After``.

Real PostgreSQL, real threads, each request on its own connection: the first
attempt runs a 2-3 s job, a duplicate arrives during it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from idempotency.drf import IdempotentMixin
from idempotency.exceptions import KeyInUse
from idempotency.fingerprint import fingerprint
from idempotency.http import IdempotencyOptions
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Operation
from idempotency.protocol import claim as waiting
from idempotency.protocol.execute import execute
from idempotency.resolvers import Resolution
from idempotency.stores import GenericStore, store_for
from tests.support.factories import UserFactory
from tests.support.threads import JOIN_TIMEOUT, done, run_in_thread
from tests.testapp.lease_views import LEASE_OPERATION, sku_for
from tests.testapp.models import Order

WAITING_URL = "/lease/waiting-orders/"  # wait_seconds=5 on the view
URL = "/lease/orders/"  # waits only as WAIT_SECONDS says
BODY = {"sku": "report"}


@pytest.fixture
def alice() -> Any:
    return UserFactory(username="alice")


@dataclass
class Sent:
    """One request sent from its own thread (and so its own database connection)."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    error: BaseException | None = None
    seconds: float = 0.0
    queries: list[str] = field(default_factory=list)
    backend_pid: int | None = None
    connected: threading.Event = field(default_factory=threading.Event)

    @property
    def replayed(self) -> bool:
        return self.headers.get("Idempotent-Replayed") == "true"


def send(user: Any, url: str, key: str, **headers: str) -> tuple[threading.Thread, Sent]:
    sent = Sent()

    def run() -> None:
        # The test client's exception hook is process-wide: another thread's error
        # would surface here. A failing view is a 500, as a server would answer.
        client = APIClient(raise_request_exception=False)
        client.force_authenticate(user)
        connection.ensure_connection()
        sent.backend_pid = connection.connection.info.backend_pid if _postgres() else None
        sent.connected.set()

        def count(execute: Any, sql: str, *args: Any) -> Any:
            sent.queries.append(sql)
            return execute(sql, *args)

        started = time.monotonic()
        try:
            with connection.execute_wrapper(count):
                response = client.post(
                    url, BODY, format="json", HTTP_IDEMPOTENCY_KEY=key, **_meta(headers)
                )
            sent.status, sent.headers = response.status_code, dict(response.items())
            sent.body = response.json() if response.content else None
        except BaseException as exc:  # the test reads it
            sent.error = exc
        finally:
            sent.seconds = time.monotonic() - started
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, sent


def during_first(user: Any, url: str, key: str, **first_headers: str) -> tuple[Sent, Sent]:
    """The first request, then a duplicate while its record is in flight; both answered."""
    first_thread, first = send(user, url, key, **first_headers)
    until(lambda: in_flight(key))
    duplicate_thread, duplicate = send(user, url, key)
    done(duplicate_thread)
    done(first_thread)
    return first, duplicate


def _meta(headers: dict[str, str]) -> dict[str, str]:
    return {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()}


def _postgres() -> bool:
    return connection.vendor == "postgresql"


def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def in_flight(key: str) -> bool:
    return IdempotencyRecord.objects.filter(idem_key=key, status=Status.PROCESSING).exists()


def orders(key: str) -> int:
    return Order.objects.filter(sku=sku_for(key)).count()


@pytest.fixture
def durations(monkeypatch: pytest.MonkeyPatch) -> Iterator[waiting.Durations]:
    fresh = waiting.Durations()
    monkeypatch.setattr(waiting, "durations", fresh)
    yield fresh


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
class TestWaitingForTheOutcome:
    def test_duplicate_waits_for_the_first_attempt_and_gets_its_response(self, alice):
        first, duplicate = during_first(alice, WAITING_URL, "wait-1", **{"X-Sleep": "2.5"})
        assert first.error is None and duplicate.error is None
        assert first.status == 201 and not first.replayed
        assert duplicate.status == 201 and duplicate.replayed
        assert duplicate.body == first.body
        assert orders("wait-1") == 1
        # It waited on a notification, not in a loop of queries.
        assert len(duplicate.queries) <= 12, duplicate.queries

    def test_waiting_comes_from_the_setting_too(self, alice):
        with override_settings(IDEMPOTENCY={"WAIT_SECONDS": 5}):
            first, duplicate = during_first(alice, URL, "wait-2", **{"X-Sleep": "2"})
        assert (first.status, duplicate.status, duplicate.replayed) == (201, 201, True)
        assert orders("wait-2") == 1

    def test_waiting_past_the_bound_gets_409_at_the_bound(self, alice):
        with override_settings(IDEMPOTENCY={"WAIT_SECONDS": 1}):
            first_thread, first = send(alice, URL, "wait-3", **{"X-Sleep": "3"})
            until(lambda: in_flight("wait-3"))
            duplicate_thread, duplicate = send(alice, URL, "wait-3")
            done(duplicate_thread)
            first_still_running = first_thread.is_alive()
            done(first_thread)
        assert duplicate.status == 409
        assert duplicate.body["code"] == "idempotency_key_in_use"
        assert 0.9 <= duplicate.seconds < 2.9, duplicate.seconds
        assert first_still_running
        assert first.status == 201
        assert orders("wait-3") == 1

    @pytest.mark.session
    def test_waiting_duplicate_holds_no_transaction_and_no_lock(self, alice):
        first_thread, first = send(alice, WAITING_URL, "wait-4", **{"X-Sleep": "3"})
        until(lambda: in_flight("wait-4"))
        duplicate_thread, duplicate = send(alice, WAITING_URL, "wait-4")
        assert duplicate.connected.wait(JOIN_TIMEOUT)
        until(lambda: waiting.waiters.count == 1)
        time.sleep(0.3)  # well inside its wait
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT state, xact_start, backend_xid FROM pg_stat_activity WHERE pid = %s",
                [duplicate.backend_pid],
            )
            state, xact_start, xid = cursor.fetchone()
            cursor.execute("SELECT count(*) FROM pg_locks WHERE pid = %s", [duplicate.backend_pid])
            (locks,) = cursor.fetchone()
        done(duplicate_thread)
        done(first_thread)
        assert (state, xact_start, xid, locks) == ("idle", None, None, 0)
        assert duplicate.status == 201 and duplicate.replayed
        assert orders("wait-4") == 1

    def test_waiting_duplicate_leaves_its_connection_listening_to_nothing(self, alice):
        first_thread, _ = send(alice, WAITING_URL, "wait-5", **{"X-Sleep": "1.5"})
        until(lambda: in_flight("wait-5"))
        channels: list[Any] = []

        def waiter() -> None:
            client = APIClient()
            client.force_authenticate(alice)
            try:
                client.post(WAITING_URL, BODY, format="json", HTTP_IDEMPOTENCY_KEY="wait-5")
                with connection.cursor() as cursor:  # the same (persistent) connection
                    cursor.execute("SELECT pg_listening_channels()")
                    channels.extend(cursor.fetchall())
            finally:
                connection.close()

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        done(thread)
        done(first_thread)
        assert channels == []

    def test_first_attempt_failing_lets_the_waiting_duplicate_run_once(self, alice):
        # X-Fail is a header: the same request, whose first attempt raises (FAILED_RETRYABLE).
        first, duplicate = during_first(
            alice, WAITING_URL, "wait-6", **{"X-Sleep": "2", "X-Fail": "1"}
        )
        assert first.status == 500
        assert duplicate.error is None
        assert duplicate.status == 201 and not duplicate.replayed
        assert duplicate.seconds < 4.5  # woken by the release, not by the end of its wait
        stored = IdempotencyRecord.objects.get(idem_key="wait-6")
        assert (stored.status, stored.attempts) == (Status.SUCCEEDED, 2)
        assert orders("wait-6") == 1

    def test_first_attempt_not_recorded_lets_the_waiting_duplicate_run_once(self, alice):
        # A 400 is not recorded: the record is deleted and the key is free again.
        first, duplicate = during_first(
            alice, WAITING_URL, "wait-7", **{"X-Sleep": "2", "X-Reject": "1"}
        )
        assert first.status == 400
        assert duplicate.status == 201 and not duplicate.replayed
        assert duplicate.seconds < 4.5
        assert IdempotencyRecord.objects.get(idem_key="wait-7").status == Status.SUCCEEDED
        assert orders("wait-7") == 1

    def test_many_waiting_duplicates_all_get_the_outcome_of_one_effect(self, alice):
        first_thread, first = send(alice, WAITING_URL, "wait-8", **{"X-Sleep": "2"})
        until(lambda: in_flight("wait-8"))
        duplicates = [send(alice, WAITING_URL, "wait-8") for _ in range(6)]
        for thread, _ in duplicates:
            done(thread)
        done(first_thread)
        assert [(d.status, d.replayed) for _, d in duplicates] == [(201, True)] * 6
        assert {str(d.body) for _, d in duplicates} == {str(first.body)}
        assert orders("wait-8") == 1

    def test_past_max_waiters_duplicates_get_409_at_once(self, alice):
        with override_settings(IDEMPOTENCY={"MAX_WAITERS": 2}):
            first_thread, first = send(alice, WAITING_URL, "wait-9", **{"X-Sleep": "3"})
            until(lambda: in_flight("wait-9"))
            waiting_ones = [send(alice, WAITING_URL, "wait-9") for _ in range(2)]
            until(lambda: waiting.waiters.count == 2)
            turned_away = [send(alice, WAITING_URL, "wait-9") for _ in range(3)]
            for thread, _ in [*turned_away, *waiting_ones]:
                done(thread)
            done(first_thread)
        assert [d.status for _, d in waiting_ones] == [201, 201]
        assert [d.status for _, d in turned_away] == [409, 409, 409]
        assert all(d.seconds < 1.5 for _, d in turned_away), [d.seconds for _, d in turned_away]
        assert orders("wait-9") == 1

    def test_finish_notifies_only_where_duplicates_may_wait(self, alice):
        def run(key: str, wait_seconds: float) -> None:
            run_once(lease_operation(alice, "notify", key, wait_seconds=wait_seconds))

        heard = _notifications(lambda: run("notify-1", 5), channel_of(alice, "notify-1"))
        assert heard == 1
        unheard = _notifications(lambda: run("notify-2", 0), channel_of(alice, "notify-2"))
        assert unheard == 0


def lease_operation(user: Any, name: str, key: str, **options: Any) -> Operation:
    return Operation(
        scope=f"user:{user.pk}:tests.{name}",
        key=key,
        request_hash=fingerprint([name]),
        name=f"tests.{name}",
        mode="lease",
        **options,
    )


def run_once(operation: Operation, work: Callable[[Any], Any] = lambda attempt: "ran") -> Any:
    return execute(
        operation,
        work,
        decide=lambda value, attempt: Outcome(Status.SUCCEEDED, StoredResponse(201)),
        replay=lambda record: "replayed",
    )


def channel_of(user: Any, key: str) -> str:
    from idempotency.stores.postgres_waiting import channel

    return channel(f"user:{user.pk}:tests.notify", key)


def _notifications(action: Callable[[], None], channel: str) -> int:
    listener = connection.connection
    with connection.cursor() as cursor:
        cursor.execute(f'LISTEN "{channel}"')
    try:
        action()
        return sum(1 for _ in listener.notifies(timeout=0.5))
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'UNLISTEN "{channel}"')


@pytest.mark.django_db(transaction=True)
def test_polling_wait_on_any_database(alice, monkeypatch):
    """Where no notification exists (SQLite here; PostgreSQL too), waiting polls, bounded."""
    operation = lease_operation(alice, "poll", "poll-1", wait_seconds=5)
    effects: list[str] = []
    claimed = threading.Event()

    def work(attempt: Any) -> str:
        claimed.set()
        time.sleep(1.5)
        effects.append("ran")
        return "ran"

    def run() -> Any:
        try:
            return run_once(operation, work)
        finally:
            connection.close()

    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(run()), daemon=True)
    first.start()
    assert claimed.wait(JOIN_TIMEOUT)
    # On PostgreSQL too: the ORM store's poll instead of LISTEN/NOTIFY.
    monkeypatch.setattr(store_for("default"), "wait_for_outcome", polling(store_for("default")))
    started = time.monotonic()
    duplicate = run_in_thread(run)
    seconds = time.monotonic() - started
    done(first)
    assert results == ["ran"]
    assert duplicate == "replayed"
    assert effects == ["ran"]
    assert seconds < 4.0


def polling(store: Any) -> Callable[[str, str, float], None]:
    def wait(scope: str, key: str, seconds: float) -> None:
        GenericStore.wait_for_outcome(store, scope, key, seconds)

    return wait


class TestRetryAfter:
    def test_short_poll_interval_instead_of_the_remaining_lease(self, durations):
        assert waiting.retry_after("op", elapsed=None, lease_remaining=timedelta(seconds=50)) == 1
        with override_settings(IDEMPOTENCY={"RETRY_AFTER": 3}):
            assert waiting.retry_after("op", elapsed=None, lease_remaining=None) == 3

    def test_the_median_of_recent_durations_less_the_time_already_run(self, durations):
        for seconds in (10.0, 12.0, 30.0):
            durations.add("op", seconds)
        lease = timedelta(seconds=50)
        assert waiting.retry_after("op", elapsed=timedelta(seconds=4), lease_remaining=lease) == 8
        # Running longer than usual: poll at the short interval.
        assert waiting.retry_after("op", elapsed=timedelta(seconds=13), lease_remaining=lease) == 1

    def test_never_past_the_lease_and_at_least_one_second(self, durations):
        durations.add("op", 40.0)
        left = timedelta(seconds=6.2)
        assert waiting.retry_after("op", elapsed=timedelta(0), lease_remaining=left) == 7
        with override_settings(IDEMPOTENCY={"RETRY_AFTER": 30}):
            assert waiting.retry_after("other", elapsed=None, lease_remaining=left) == 7
            tiny = timedelta(seconds=0.2)
            assert waiting.retry_after("other", elapsed=None, lease_remaining=tiny) == 1

    def test_durations_are_bounded(self):
        bounded = waiting.Durations(operations=2, samples=3)
        for name in ("a", "b", "c"):
            for seconds in (1.0, 2.0, 3.0, 100.0):
                bounded.add(name, seconds)
        assert bounded.median("a") is None  # forgotten, least recently finished
        assert bounded.median("c") == 3.0  # of 2, 3, 100: the oldest sample dropped


@pytest.mark.django_db
class TestRetryAfterOverHttp:
    @pytest.fixture
    def client(self, alice) -> APIClient:
        api = APIClient()
        api.force_authenticate(alice)
        return api

    def hold(self, key: str, lease: float, running: float) -> None:
        """As if another attempt had run ``running`` seconds, ``lease`` seconds of lease left."""
        IdempotencyRecord.objects.filter(idem_key=key).update(
            status=Status.PROCESSING,
            owner_token=b"another-attempt",
            lease_until=Now() + timedelta(seconds=lease),
            updated_at=Now() - timedelta(seconds=running),
            response_status=None,
            response_body=None,
            completed_at=None,
        )

    def post(self, client: APIClient, key: str = "ra-1") -> Any:
        return client.post(URL, BODY, format="json", HTTP_IDEMPOTENCY_KEY=key)

    def test_duplicate_is_told_when_the_answer_is_likely_ready(self, client, durations):
        assert self.post(client).status_code == 201
        durations.add(LEASE_OPERATION, 12.0)
        durations.add(LEASE_OPERATION, 12.0)
        self.hold("ra-1", lease=20, running=2)
        response = self.post(client)
        assert response.status_code == 409
        assert 9 <= int(response["Retry-After"]) <= 10

    def test_duplicate_without_history_polls_at_retry_after(self, client, durations):
        assert self.post(client).status_code == 201
        waiting.durations = waiting.Durations()  # this process has no history of it
        self.hold("ra-1", lease=20, running=2)
        assert self.post(client)["Retry-After"] == "1"

    def test_finished_attempts_are_remembered(self, client, durations):
        response = client.post(
            URL, BODY, format="json", HTTP_IDEMPOTENCY_KEY="ra-2", HTTP_X_SLEEP="0.3"
        )
        assert response.status_code == 201
        median = durations.median(LEASE_OPERATION)
        assert median is not None and 0.3 <= median < 5


def test_wait_seconds_option_of_each_adapter():
    assert IdempotencyOptions(wait_seconds=3).wait_seconds == 3

    class View(IdempotentMixin):
        idempotency_operation = "tests.waiting_view"
        idempotency_wait_seconds = 4.0

    assert View().get_idempotency_options().wait_seconds == 4.0
    with pytest.raises(ValueError, match="wait_seconds"):
        IdempotencyOptions(wait_seconds=-1)


@pytest.mark.django_db(transaction=True)
class TestWhenNotToWait:
    """Waiting is for a live attempt, outside any transaction: otherwise 409 at once."""

    def operation(self, user: Any, **options: Any) -> Operation:
        return lease_operation(user, "no_wait", "no-wait", wait_seconds=5, **options)

    def hold(self, lease: float) -> None:
        IdempotencyRecord.objects.filter(idem_key="no-wait").update(
            status=Status.PROCESSING,
            owner_token=b"another-attempt",
            lease_until=Now() + timedelta(seconds=lease),
        )

    def test_inside_a_transaction(self, alice):
        operation = self.operation(alice)
        run_once(operation)
        self.hold(lease=30)
        started = time.monotonic()
        with transaction.atomic(), pytest.raises(KeyInUse):
            run_once(operation)
        assert time.monotonic() - started < 1.0
        assert waiting.waiters.count == 0

    def test_after_a_lost_lease_whose_outcome_is_unknown(self, alice):
        operation = self.operation(alice, resolver=lambda record: Resolution.unknown())
        run_once(operation)
        self.hold(lease=-1)
        started = time.monotonic()
        with pytest.raises(KeyInUse):
            run_once(operation)
        assert time.monotonic() - started < 1.0


@pytest.mark.django_db(transaction=True)
class TestStoresWait:
    """``wait_for_outcome`` of each store: at once, at the bound, or when told (or polled)."""

    @pytest.fixture(params=["orm", "vendor"])
    def store(self, request: pytest.FixtureRequest) -> Any:
        vendor = store_for("default")
        return GenericStore("default") if request.param == "orm" else vendor

    def in_flight(self, lease: float = 30) -> IdempotencyRecord:
        return IdempotencyRecord.objects.create(
            scope="user:1:tests.store_wait",
            idem_key="store-wait",
            request_hash=bytes(16),
            owner_token=b"a" * 16,
            lease_until=timezone.now() + timedelta(seconds=lease),
        )

    def timed(self, store: Any, seconds: float) -> float:
        started = time.monotonic()
        store.wait_for_outcome("user:1:tests.store_wait", "store-wait", seconds)
        return time.monotonic() - started

    def test_nothing_in_flight_returns_at_once(self, store):
        assert self.timed(store, 5) < 0.5

    def test_an_expired_lease_is_not_in_flight(self, store):
        self.in_flight(lease=-1)
        assert self.timed(store, 5) < 0.5

    def test_a_live_attempt_is_waited_for_up_to_the_bound(self, store):
        self.in_flight()
        assert 0.7 <= self.timed(store, 0.8) < 2.5

    def test_a_finish_ends_the_wait(self, store):
        record = self.in_flight()

        def finish() -> None:
            time.sleep(0.5)
            IdempotencyRecord.objects.filter(pk=record.pk).update(status=Status.SUCCEEDED)
            store_for("default").notify_waiters(record.scope, record.idem_key)
            connection.close()

        finisher = threading.Thread(target=finish, daemon=True)
        finisher.start()
        waited = self.timed(store, 8)
        done(finisher)
        assert 0.4 <= waited < 3.0
