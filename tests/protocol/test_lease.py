"""Lease mode: duplicates during a lease, lost leases at request time, fencing, re-claims."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from idempotency import signals
from idempotency.exceptions import KeyInUse, KeyUnderReview, LeaseLost
from idempotency.fingerprint import fingerprint
from idempotency.functions import idempotent_function
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Attempt, Operation
from idempotency.protocol import claim as waiting
from idempotency.protocol.execute import execute
from idempotency.resolvers import Resolution, register, resolver_for
from tests.support.factories import UserFactory
from tests.testapp.lease_views import (
    CLASS_OPERATION,
    LEASE_OPERATION,
    order_resolver,
    sku_for,
    unknown_resolver,
)
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

URL = "/lease/orders/"
CLASS_URL = "/lease/class-orders/"
BODY = {"sku": "report"}
ORDER_RESOLVER = "tests.testapp.lease_views.order_resolver"


@pytest.fixture
def alice() -> Any:
    return UserFactory(username="alice")


@pytest.fixture
def client(alice: Any) -> APIClient:
    api = APIClient()
    api.force_authenticate(alice)
    return api


def post(client: APIClient, key: str = "key-1", body: Any = BODY, url: str = URL, **headers: str):
    return client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key, **headers)


def record(key: str = "key-1") -> IdempotencyRecord:
    return IdempotencyRecord.objects.get(idem_key=key)


def hold(key: str = "key-1", seconds: float = 30.0) -> None:
    """As if another attempt held the record with ``seconds`` of lease left (database clock).

    It runs in another process: this one has no durations of the operation to
    estimate ``Retry-After`` from (the conftest puts the real ones back).
    """
    waiting.durations = waiting.Durations()
    IdempotencyRecord.objects.filter(idem_key=key).update(
        status=Status.PROCESSING,
        owner_token=b"another-attempt",
        lease_until=Now() + timedelta(seconds=seconds),
        response_status=None,
        response_body=None,
        completed_at=None,
        expires_at=None,
    )


def orders(key: str = "key-1") -> int:
    return Order.objects.filter(sku=sku_for(key)).count()


class TestDuplicatesDuringTheLease:
    def test_first_request_runs_and_finishes_the_lease(self, client):
        response = post(client)
        assert response.status_code == 201
        stored = record()
        assert stored.status == Status.SUCCEEDED
        assert stored.lease_until is None
        assert stored.resource_id == str(response.json()["id"])
        assert orders() == 1

    def test_duplicate_gets_409_with_a_short_retry_after_not_the_whole_lease(self, client):
        post(client)
        hold(seconds=20)
        response = post(client)
        assert response.status_code == 409
        assert response.json()["code"] == "idempotency_key_in_use"
        assert response["Retry-After"] == "1"  # RETRY_AFTER: no durations known here
        assert orders() == 1

    def test_retry_after_is_never_past_the_remaining_lease(self, client):
        post(client)
        hold(seconds=20)
        with override_settings(IDEMPOTENCY={"RETRY_AFTER": 60}):
            response = post(client)
        assert response.status_code == 409
        assert 19 <= int(response["Retry-After"]) <= 20

    def test_retry_after_is_at_least_one_second(self, client):
        post(client)
        hold(seconds=0.3)
        response = post(client)
        assert response.status_code == 409
        assert response["Retry-After"] == "1"

    def test_live_lease_is_judged_by_the_database_clock(self, client, monkeypatch):
        post(client)
        hold(seconds=30)
        # The application server's clock is a day ahead: the lease must still be live.
        ahead = timezone.now() + timedelta(days=1)
        monkeypatch.setattr(timezone, "now", lambda: ahead)
        with override_settings(IDEMPOTENCY={"RETRY_AFTER": 60}):  # the lease bounds it
            response = post(client)
        assert response.status_code == 409
        assert 29 <= int(response["Retry-After"]) <= 30

    def test_expired_lease_is_judged_by_the_database_clock(self, client, monkeypatch):
        post(client)
        hold(seconds=-1)
        # The application server's clock is a day behind: the lease has still expired.
        behind = timezone.now() - timedelta(days=1)
        monkeypatch.setattr(timezone, "now", lambda: behind)
        response = post(client)
        assert response.status_code == 201
        assert response["Idempotent-Replayed"] == "true"


class TestLostLeaseAtRequestTime:
    def test_done_replays_what_the_resolver_found(self, client):
        first = post(client)
        hold(seconds=-1)  # the first attempt made the order, then its worker died
        with _received(signals.record_recovered) as recovered:
            response = post(client)
        assert response.status_code == 201
        assert response["Idempotent-Replayed"] == "true"
        assert response.json() == {"id": first.json()["id"]}
        stored = record()
        assert stored.status == Status.SUCCEEDED
        assert stored.resource_id == str(first.json()["id"])
        assert stored.recovery_attempts == 1
        assert orders() == 1
        assert [call["outcome"] for call in recovered] == ["succeeded"]

    def test_not_done_reclaims_and_runs_once(self, client):
        post(client)
        Order.objects.all().delete()  # the first attempt died before its effect
        hold(seconds=-1)
        response = post(client)
        assert response.status_code == 201
        assert not response.has_header("Idempotent-Replayed")
        stored = record()
        assert stored.status == Status.SUCCEEDED
        assert stored.attempts == 2
        assert stored.resource_id == str(response.json()["id"])
        assert orders() == 1

    def test_another_fingerprint_is_422_and_the_resolver_is_not_asked(self, client):
        post(client)
        hold(seconds=-1)
        response = post(client, body={"sku": "other"})
        assert response.status_code == 422
        assert record().status == Status.PROCESSING
        assert record().recovery_attempts == 0

    def test_mixin_resolver_is_called_with_the_record_only(self, client):
        first = post(client, url=CLASS_URL)
        assert first.status_code == 201
        hold(seconds=-1)
        response = post(client, url=CLASS_URL)
        assert response.status_code == 201
        assert response["Idempotent-Replayed"] == "true"
        assert Order.objects.count() == 1


class TestLostLeaseInCore:
    """The same rules for the plain-Python entry point, with each resolver answer."""

    @pytest.fixture
    def op(self, alice) -> Operation:
        return Operation(
            scope=f"user:{alice.pk}:tests.core_lease",
            key="core-1",
            request_hash=fingerprint(["core"]),
            name="tests.core_lease",
            mode="lease",
            lease_seconds=30,
        )

    def run(self, op: Operation, work: Callable[[Attempt], Any] | None = None) -> Any:
        return execute(
            op,
            work or (lambda attempt: "ran"),
            decide=lambda value, attempt: Outcome(Status.SUCCEEDED, StoredResponse(201)),
            replay=lambda stored: "replayed",
        )

    def lose_lease(self, op: Operation) -> None:
        IdempotencyRecord.objects.filter(idem_key=op.key).update(
            status=Status.PROCESSING, lease_until=Now() - timedelta(seconds=1)
        )

    @override_settings(IDEMPOTENCY={"RESOLVE_RETRY_SECONDS": 25})
    def test_unknown_is_409_and_the_resolver_is_not_asked_again_during_the_pause(self, op):
        asked: list[int] = []

        def counting(stored: IdempotencyRecord) -> Resolution:
            asked.append(stored.pk)
            return Resolution.unknown()

        op = replace(op, resolver=counting)
        self.run(op)
        self.lose_lease(op)
        with pytest.raises(KeyInUse) as caught:
            self.run(op)
        assert 24 <= caught.value.retry_after <= 25
        stored = record(op.key)
        assert stored.status == Status.PROCESSING
        assert stored.recovery_attempts == 1
        with pytest.raises(KeyInUse):
            self.run(op)
        assert len(asked) == 1

    @override_settings(IDEMPOTENCY={"MAX_RESOLVE_ATTEMPTS": 2})
    def test_repeated_unknown_answers_lead_to_review(self, op):
        op = replace(op, resolver=unknown_resolver)
        self.run(op)
        # Asked again once the pause ends (in use), then handed to an operator (under review).
        for expected, answer in (
            (Status.PROCESSING, KeyInUse),
            (Status.NEEDS_REVIEW, KeyUnderReview),
        ):
            self.lose_lease(op)
            with pytest.raises(answer):
                self.run(op)
            assert record(op.key).status == expected
        assert record(op.key).recovery_attempts == 2

    def test_without_a_resolver_the_record_waits_for_review(self, op):
        self.run(op)
        self.lose_lease(op)
        with pytest.raises(KeyUnderReview):
            self.run(op)
        assert record(op.key).status == Status.NEEDS_REVIEW
        with pytest.raises(KeyUnderReview):  # every retry, until an operator has settled it
            self.run(op)

    @override_settings(IDEMPOTENCY={"RELEASE_EXPIRED_WITHOUT_RESOLVER": True})
    def test_without_a_resolver_release_when_the_operator_allows_it(self, op):
        self.run(op)
        self.lose_lease(op)
        assert self.run(op) == "ran"
        assert record(op.key).attempts == 2

    def test_a_failing_resolver_counts_as_unknown(self, op):
        def broken(stored: IdempotencyRecord) -> Resolution:
            Order.objects.raw("SELECT no_such_column FROM testapp_order")[0]  # a failed query
            raise AssertionError("unreachable")

        op = replace(op, resolver=broken)
        self.run(op)
        self.lose_lease(op)
        with pytest.raises(KeyInUse):
            self.run(op)
        stored = record(op.key)
        assert stored.status == Status.PROCESSING
        assert stored.recovery_attempts == 1


class TestFailedRetryable:
    def test_failure_in_lease_mode_keeps_the_key_for_a_retry(self, client):
        client.raise_request_exception = False
        response = post(client, HTTP_X_FAIL="1")
        assert response.status_code == 500
        stored = record()
        assert stored.status == Status.FAILED_RETRYABLE
        assert stored.lease_until is None
        assert stored.expires_at is not None
        assert orders() == 0

    def test_retry_reclaims_with_a_new_owner_and_runs_once(self, client):
        client.raise_request_exception = False
        post(client, HTTP_X_FAIL="1")
        failed = record()
        response = post(client)
        assert response.status_code == 201
        stored = record()
        assert stored.status == Status.SUCCEEDED
        assert stored.attempts == 2
        assert stored.owner_token != failed.owner_token
        assert orders() == 1
        assert post(client)["Idempotent-Replayed"] == "true"

    def test_retry_with_another_body_is_refused(self, client):
        client.raise_request_exception = False
        post(client, HTTP_X_FAIL="1")
        assert post(client, body={"sku": "other"}).status_code == 422
        assert record().status == Status.FAILED_RETRYABLE


class TestResolverLookup:
    def test_a_views_resolver_is_registered_under_its_operation(self):
        assert resolver_for(LEASE_OPERATION) is order_resolver
        assert resolver_for(CLASS_OPERATION) is order_resolver

    def test_explicit_resolver_wins(self):
        assert resolver_for(LEASE_OPERATION, unknown_resolver) is unknown_resolver
        path = "tests.testapp.lease_views.unknown_resolver"
        assert resolver_for(LEASE_OPERATION, path) is unknown_resolver

    @override_settings(
        IDEMPOTENCY={
            "RESOLVERS": {"tests.only_in_settings": "tests.testapp.lease_views.order_resolver"}
        }
    )
    def test_the_setting_maps_operation_names_to_dotted_paths(self):
        assert resolver_for("tests.only_in_settings") is order_resolver
        assert resolver_for("tests.nobody_knows") is None

    def test_register(self):
        register("tests.registered", unknown_resolver)
        assert resolver_for("tests.registered") is unknown_resolver


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
class TestConcurrency:
    def test_stale_owner_cannot_overwrite_after_a_takeover(self, alice):
        """Two connections: A's lease expires mid-work, B takes over; A's writes are fenced."""
        op = Operation(
            scope=f"user:{alice.pk}:tests.fenced",
            key="fenced-1",
            request_hash=fingerprint(["fenced"]),
            name="tests.fenced",
            mode="lease",
            lease_seconds=0.5,
            resolver=lambda stored: Resolution.not_done(),
        )
        release = threading.Event()
        results: dict[str, Any] = {}

        def stale_work(attempt: Attempt) -> str:
            results["a_token"] = attempt.owner_token
            release.wait(timeout=20)
            try:
                attempt.renew()
            except LeaseLost as lost:
                results["a_renew"] = lost
            return "A"

        def first_attempt() -> None:
            try:
                results["a"] = execute(
                    op, stale_work, decide=_stored_as, replay=lambda stored: "replayed"
                )
            except LeaseLost as lost:
                results["a_finish"] = lost
            finally:
                connection.close()

        thread = threading.Thread(target=first_attempt)
        thread.start()
        try:
            _wait_for(lambda: IdempotencyRecord.objects.expired_leases().exists())
            assert execute(op, lambda attempt: "B", decide=_stored_as, replay=bytes) == "B"
        finally:
            release.set()
            thread.join(timeout=20)
        stored = record("fenced-1")
        assert isinstance(results.get("a_renew"), LeaseLost)
        assert isinstance(results.get("a_finish"), LeaseLost)
        assert "a" not in results
        assert stored.status == Status.SUCCEEDED
        assert bytes(stored.response_body) == b"B"
        assert stored.owner_token != results["a_token"]
        assert stored.attempts == 2

    def test_duplicate_while_the_first_is_working(self, client, alice):
        responses: dict[str, Any] = {}

        def first() -> None:
            api = APIClient()
            api.force_authenticate(alice)
            try:
                responses["first"] = post(api, HTTP_X_SLEEP="1.5")
            finally:
                connection.close()

        thread = threading.Thread(target=first)
        thread.start()
        try:
            _wait_for(lambda: IdempotencyRecord.objects.filter(status=Status.PROCESSING).exists())
            duplicate = post(client)
        finally:
            thread.join(timeout=20)
        assert duplicate.status_code == 409
        assert 1 <= int(duplicate["Retry-After"]) <= 30
        assert responses["first"].status_code == 201
        assert post(client)["Idempotent-Replayed"] == "true"
        assert orders() == 1

    def test_two_retries_of_a_failed_attempt_reclaim_it_once(self, client, alice):
        client.raise_request_exception = False
        post(client, HTTP_X_FAIL="1")
        start = threading.Barrier(2)
        statuses: list[int] = []

        def retry() -> None:
            api = APIClient()
            api.force_authenticate(alice)
            try:
                start.wait(timeout=10)
                statuses.append(post(api, HTTP_X_SLEEP="1").status_code)
            finally:
                connection.close()

        threads = [threading.Thread(target=retry) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
        assert sorted(statuses) in ([201, 409], [201, 201])
        assert orders() == 1
        assert record().attempts == 2


def _stored_as(value: str, attempt: Attempt) -> Outcome:
    return Outcome(Status.SUCCEEDED, StoredResponse(200, [], value.encode()))


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


class _received:
    def __init__(self, signal: Any) -> None:
        self.signal = signal
        self.calls: list[dict[str, Any]] = []

    def receiver(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)

    def __enter__(self) -> list[dict[str, Any]]:
        self.signal.connect(self.receiver, weak=False)
        return self.calls

    def __exit__(self, *exc: object) -> None:
        self.signal.disconnect(self.receiver)


class TestFunctionEntryPoint:
    def test_a_lost_lease_of_a_consumer_is_resolved_not_rerun(self):
        calls: list[Any] = []

        def resolver(stored: IdempotencyRecord) -> Resolution:
            return Resolution.done("event-1", StoredResponse(200, [], b'{"charged": 1}'))

        @idempotent_function(
            scope="consumer:billing",
            key=lambda event: event["id"],
            operation="tests.consume",
            mode="lease",
            resolver=resolver,
        )
        def consume(event: dict[str, Any]) -> dict[str, Any]:
            calls.append(event)
            return {"charged": 1, "first": True}

        assert consume({"id": "event-1"}) == {"charged": 1, "first": True}
        IdempotencyRecord.objects.filter(idem_key="event-1").update(
            status=Status.PROCESSING, lease_until=Now() - timedelta(seconds=1)
        )
        assert consume({"id": "event-1"}) == {"charged": 1}
        assert len(calls) == 1
        assert resolver_for("tests.consume") is resolver
