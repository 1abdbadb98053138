"""Calls to other idempotent APIs: step keys and recorded steps (idempotency.steps)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from idempotency import resolvers
from idempotency.exceptions import LeaseLost
from idempotency.fingerprint import digest_of, fingerprint
from idempotency.models import IdempotencyRecord, IdempotencyStep, Status
from idempotency.protocol import Attempt, Operation
from idempotency.protocol.claim import claim_committed
from idempotency.protocol.execute import execute
from idempotency.recovery import recover_expired
from idempotency.resolvers import Resolution, register
from idempotency.retention import purge
from idempotency.steps import NotInAttempt, StepNotRecorded, current, derive, key_for_record
from tests.support import step_work, step_worker
from tests.support.factories import UserFactory
from tests.support.fake_provider import FakeProvider
from tests.support.processes import process_env, python, start, stop
from tests.testapp import lease_views

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "tests.steps"


@pytest.fixture(autouse=True)
def _forget_resolvers() -> Iterator[None]:
    yield
    for name in (NAME, step_work.OPERATION):
        resolvers._registry.pop(name, None)


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as running:
        step_work.PROVIDER["url"] = running.url
        yield running


def operation(
    key: str = "k1", scope: str = "user:1", request: str = "a", **extra: Any
) -> Operation:
    options: dict[str, Any] = {"mode": "lease", "lease_seconds": 30, **extra}
    return Operation(
        scope=scope, key=key, request_hash=fingerprint([request]), name=NAME, **options
    )


def run(op: Operation, work: Any) -> Any:
    """``work(attempt)`` under ``op``; its JSON-able result is recorded as the outcome."""
    from idempotency.functions import _record_result, _stored_result

    return execute(op, work, decide=_record_result, replay=_stored_result)


class Crash(Exception):
    """The work failed after its step: the record stays, retryable, for the same request."""


def key_then_crash(op: Operation, *names: str) -> list[str]:
    keys: list[str] = []

    def work(attempt: Attempt) -> None:
        keys.extend(attempt.step_key(name) for name in names)
        raise Crash

    with pytest.raises(Crash):
        run(op, work)
    return keys


def keys_of(op: Operation, *names: str) -> list[str]:
    return run(op, lambda attempt: [attempt.step_key(name) for name in names])  # type: ignore[no-any-return]


def lapse(op: Operation) -> None:
    """The lease of ``op``'s record ran out (its worker is presumed dead)."""
    records = IdempotencyRecord.objects.filter(scope=op.scope, idem_key=op.key)
    records.update(lease_until=timezone.now() - timedelta(seconds=5))


class TestStepKeys:
    def test_the_key_fits_stripe_and_reveals_nothing(self):
        (key,) = keys_of(operation(key="order-secret", scope="user:alice"), "charge")
        assert re.fullmatch(r"idem_[0-9a-f]{64}", key)
        assert len(key) <= 255
        assert "alice" not in key and "secret" not in key

    def test_the_derivation_is_the_documented_contract(self):
        # Pinned: a release that changed it would charge again on a retry across an upgrade.
        message = b'["idempotency-step/1","user:1","k1","charge",null]'
        expected = "idem_" + hmac.new(bytes(32), message, hashlib.sha256).hexdigest()
        assert derive("00" * 32, "user:1", "k1", "charge", None) == expected
        message = '["idempotency-step/1","s","clé","refund",2]'.encode()
        expected = "idem_" + hmac.new(bytes(32), message, hashlib.sha256).hexdigest()
        assert derive("00" * 32, "s", "clé", "refund", 2) == expected

    def test_the_same_for_a_retry_after_a_failure(self):
        op = operation()
        first = key_then_crash(op, "charge")
        assert IdempotencyRecord.objects.get().status == Status.FAILED_RETRYABLE
        assert keys_of(op, "charge") == first
        assert IdempotencyRecord.objects.get().attempts == 2

    def test_the_same_after_a_takeover_and_the_stale_owner_gets_lease_lost(self):
        op = operation()
        register(NAME, lambda record: Resolution.not_done())
        seen: dict[str, Any] = {}

        def first(attempt: Attempt) -> None:
            seen["first"] = attempt.step_key("charge")
            lapse(op)
            seen["second"] = keys_of(op, "charge")[0]  # another worker takes the record over
            with pytest.raises(LeaseLost):
                attempt.step_key("charge")
            with pytest.raises(LeaseLost):
                attempt.step("refund", lambda key: pytest.fail("a stale owner ran a step"))

        with pytest.raises(LeaseLost):
            run(op, first)  # its finish is fenced too
        assert seen["first"] == seen["second"]

    def test_the_same_after_recovery_releases_a_dead_workers_record(self):
        op = operation()
        attempt, _ = claim_committed(op)  # a worker that claimed, keyed its step and died
        assert attempt is not None
        first = attempt.step_key("charge")
        lapse(op)
        register(NAME, lambda record: Resolution.not_done())
        assert recover_expired().released == 1
        assert keys_of(op, "charge") == [first]

    def test_different_for_another_request_scope_step_or_position(self):
        def all_keys(op: Operation) -> list[str]:
            return run(  # type: ignore[no-any-return]
                op,
                lambda attempt: [
                    attempt.step_key("charge"),
                    attempt.step_key("refund"),
                    attempt.step_key("charge", 0),
                    attempt.step_key("charge", 1),
                ],
            )

        mine = all_keys(operation())
        assert len(set(mine)) == 4
        others = all_keys(operation(key="k2")) + all_keys(operation(scope="user:2"))
        assert not set(mine) & set(others)
        assert len(set(others)) == 8

    def test_a_new_request_replacing_an_expired_record_gets_new_keys(self):
        op = operation()
        (first,) = keys_of(op, "charge")
        record = IdempotencyRecord.objects.get()
        run(operation(key="other"), lambda attempt: attempt.step("charge", lambda key: 1))
        IdempotencyRecord.objects.filter(pk=record.pk).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
        (second,) = keys_of(operation(request="b"), "charge")  # replaces the expired record
        assert IdempotencyRecord.objects.get(pk=record.pk).request_hash == digest_of(
            fingerprint(["b"])
        )
        assert second != first
        assert IdempotencyStep.objects.filter(record_id=record.pk).count() == 1  # its seed only

    def test_the_same_seed_after_the_secret_key_rotates(self):
        op = operation()
        with override_settings(SECRET_KEY="before-" + "x" * 50):
            first = key_then_crash(op, "charge")
        with override_settings(SECRET_KEY="after-" + "y" * 50):
            assert keys_of(op, "charge") == first

    def test_key_for_record_gives_a_resolver_the_same_key(self):
        op = operation()
        (key,) = keys_of(op, "charge")
        record = IdempotencyRecord.objects.get()
        assert key_for_record(record, "charge") == key
        assert key_for_record(record, "charge", 3) != key
        unkeyed = IdempotencyRecord.objects.get(
            pk=run(operation(key="k9"), lambda attempt: attempt.record.pk)
        )
        assert key_for_record(unkeyed, "charge") is None  # never keyed: never sent


class TestAViewsStepKey:
    """``request.idempotency.step_key`` of a protected lease-mode view, through DRF's client."""

    URL = "/lease/step-key/"

    @pytest.fixture
    def client(self) -> Iterator[APIClient]:
        lease_views.handed_out.clear()
        api = APIClient()
        api.force_authenticate(UserFactory())
        # A failed attempt answers 500 here, as in production, instead of raising in the test.
        api.raise_request_exception = False
        yield api
        lease_views.handed_out.clear()

    def post(self, client: APIClient, key: str, body: Any, **headers: str) -> Any:
        return client.post(self.URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key, **headers)

    def test_the_same_on_the_retry_after_a_failed_attempt(self, client):
        failed = self.post(client, "order-1", {"amount": 500}, HTTP_X_FAIL="1")
        assert failed.status_code == 500
        assert IdempotencyRecord.objects.get().status == Status.FAILED_RETRYABLE
        retried = self.post(client, "order-1", {"amount": 500})
        assert retried.status_code == 201
        (first, second) = lease_views.handed_out
        assert retried.json() == {"charge_key": first} and second == first
        assert IdempotencyRecord.objects.get().attempts == 2
        replayed = self.post(client, "order-1", {"amount": 500})  # done: not run again
        assert replayed.json() == {"charge_key": first}
        assert len(lease_views.handed_out) == 2

    def test_different_for_another_request(self, client):
        first = self.post(client, "order-1", {"amount": 500}).json()["charge_key"]
        other = self.post(client, "order-2", {"amount": 500}).json()["charge_key"]
        assert re.fullmatch(r"idem_[0-9a-f]{64}", other)
        assert other != first
        someone_else = APIClient()  # the same client key under another user's scope
        someone_else.force_authenticate(UserFactory())
        theirs = self.post(someone_else, "order-1", {"amount": 500}).json()["charge_key"]
        assert theirs not in (first, other)


class TestRecordedSteps:
    def test_a_recorded_step_is_not_run_again_by_a_later_attempt(self):
        op = operation()
        calls: list[str] = []

        def charge(key: str) -> dict[str, Any]:
            calls.append(key)
            return {"id": "ch_1", "amount": 500}

        def work(attempt: Attempt) -> Any:
            result = attempt.step("charge", charge)
            if len(calls) == 1 and IdempotencyRecord.objects.get().attempts == 1:
                raise Crash
            return result

        with pytest.raises(Crash):
            run(op, work)
        assert run(op, work) == {"id": "ch_1", "amount": 500}
        assert len(calls) == 1
        step = IdempotencyStep.objects.exclude(step_key="").get()
        assert (step.name, step.position, step.step_key) == ("charge", None, calls[0])
        assert json.loads(step.result) == {"id": "ch_1", "amount": 500}

    def test_record_false_runs_again_with_the_same_key(self):
        op = operation()
        calls: list[str] = []

        def work(attempt: Attempt) -> None:
            attempt.step("charge", calls.append, record=False)
            if len(calls) == 1:
                raise Crash

        with pytest.raises(Crash):
            run(op, work)
        run(op, work)
        assert len(calls) == 2 and calls[0] == calls[1]

    def test_positions_record_each_repeated_step(self):
        results = run(
            operation(),
            lambda a: [a.step("refund", lambda key, i=i: i * 10, position=i) for i in range(3)],
        )
        assert results == [0, 10, 20]
        assert IdempotencyStep.objects.exclude(step_key="").count() == 3

    def test_a_result_that_is_not_json_is_refused_with_the_fix(self):
        with pytest.raises(StepNotRecorded, match="record=False"):
            run(operation(), lambda a: a.step("charge", lambda key: object()))

    def test_a_result_over_the_size_limit_is_refused_with_the_fix(self):
        with (
            override_settings(IDEMPOTENCY={"MAX_RESPONSE_BYTES": 100}),
            pytest.raises(StepNotRecorded, match="MAX_RESPONSE_BYTES"),
        ):
            run(operation(), lambda a: a.step("charge", lambda key: "x" * 200))

    def test_steps_are_deleted_with_their_record(self):
        op = operation()
        run(op, lambda a: a.step("charge", lambda key: {"id": "ch_1"}))
        assert IdempotencyStep.objects.count() == 2
        IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(days=1))
        assert purge() == 1
        assert IdempotencyStep.objects.count() == 0

    def test_the_admin_lists_the_steps(self, admin_client):
        run(operation(), lambda a: a.step("charge", lambda key: {"id": "ch_42"}))
        record = IdempotencyRecord.objects.get()
        page = admin_client.get(f"/admin/idempotency/idempotencyrecord/{record.pk}/change/")
        assert page.status_code == 200
        text = page.content.decode()
        assert "ch_42" in text and "Steps recorded" in text


class TestRefusals:
    @pytest.mark.parametrize("name", ["", None, 3, b"charge"])
    def test_a_step_name_that_is_not_a_non_empty_string(self, name):
        with pytest.raises(TypeError, match="non-empty string"):
            run(operation(), lambda a: a.step_key(name))

    @pytest.mark.parametrize("position", [-1, True, "1", 1.0])
    def test_a_position_that_is_not_an_index(self, position):
        with pytest.raises(TypeError, match="position"):
            run(operation(), lambda a: a.step_key("charge", position))

    def test_outside_an_attempt(self):
        with pytest.raises(NotInAttempt, match="mode='lease'"):
            current()

    def test_in_atomic_mode(self):
        with pytest.raises(NotInAttempt, match="lease"):
            run(operation(mode="atomic"), lambda a: a.step_key("charge"))

    def test_the_first_key_inside_a_transaction(self):
        def work(attempt: Attempt) -> str:
            with transaction.atomic():
                return attempt.step_key("charge")

        with pytest.raises(NotInAttempt, match="before the transaction"):
            run(operation(), work)

    def test_current_is_the_attempt_of_an_idempotent_function(self, provider):
        assert step_work.pay("order-1", 500, recorded=True) == "ch_1"
        assert step_work.pay("order-1", 500, recorded=True) == "ch_1"  # replayed
        assert len(provider.calls) == 1


@pytest.mark.server_db
class TestKilledWorker:
    """The worker is SIGKILLed after the provider answered and before the record is finished."""

    def kill_after_charge(self, provider: FakeProvider, order: str, *, recorded: bool) -> None:
        mode = "recorded" if recorded else "keyed"
        command = python("-m", "tests.support.step_worker", provider.url, order, "500", mode)
        process = start(command, process_env())
        try:
            assert process.stdout is not None
            line = process.stdout.readline().decode()
            assert line.strip() == "charged", line + process.communicate(timeout=10)[0].decode()
            process.kill()  # SIGKILL: no finish, no release
            process.wait(timeout=10)
        finally:
            stop(process)
        assert len(provider.charges) == 1
        assert IdempotencyRecord.objects.get(idem_key=order).status == Status.PROCESSING

    def test_recovery_releases_and_the_retry_charges_once(self, provider):
        self.kill_after_charge(provider, "order-a", recorded=False)
        register(step_work.OPERATION, "idempotency.steps.effects_carry_step_keys")
        time.sleep(step_work.LEASE_SECONDS + 0.2)
        assert recover_expired().released == 1
        assert step_work.pay("order-a", 500, recorded=False) == "ch_1"
        assert len(provider.charges) == 1  # the provider answered the retry from its key
        assert len(provider.calls) == 2 and provider.calls[0] == provider.calls[1]

    def test_with_a_recorded_step_the_retry_does_not_call_the_provider(self, provider):
        self.kill_after_charge(provider, "order-b", recorded=True)
        register(step_work.OPERATION, "idempotency.steps.effects_carry_step_keys")
        time.sleep(step_work.LEASE_SECONDS + 0.2)  # the lease ends: the retry takes it over
        assert step_work.pay("order-b", 500, recorded=True) == "ch_1"
        assert len(provider.charges) == 1
        assert len(provider.calls) == 1

    def test_a_resolver_asks_the_provider_by_the_steps_key(self, provider):
        self.kill_after_charge(provider, "order-c", recorded=False)

        def ask_provider(record: IdempotencyRecord) -> Resolution:
            key = key_for_record(record, "charge")
            if key is None:
                return Resolution.not_done()
            found = httpx.get(f"{provider.url}/charges", params={"idempotency_key": key})
            if found.status_code == 404:
                return Resolution.not_done()
            return Resolution.done(found.json()["id"])

        register(step_work.OPERATION, ask_provider)
        time.sleep(step_work.LEASE_SECONDS + 0.2)
        assert recover_expired().succeeded == 1
        assert IdempotencyRecord.objects.get(idem_key="order-c").resource_id == "ch_1"
        assert len(provider.calls) == 1


assert step_worker.main  # the module the killed process runs
