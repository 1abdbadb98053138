"""The stores: one per alias, the only code that knows which database it is on.

The contract tests run every store this database has (the ORM store always,
and the vendor's own) through the same statements, so that a new store is
checked by the same tests.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, DatabaseError, OperationalError, connection, transaction
from django.test import override_settings
from django.utils import timezone

import idempotency
from idempotency import signals, stores
from idempotency.exceptions import KeyInUse
from idempotency.fingerprint import digest_of, fingerprint
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Operation
from idempotency.protocol import claim as core
from idempotency.protocol.execute import execute
from idempotency.retention import batch
from idempotency.stores import Candidate, Found, GenericStore, Store, records_database, store_for
from idempotency.stores.postgres import PostgresStore
from tests.support.factories import IdempotencyRecordFactory
from tests.support.threads import in_thread

PACKAGE = Path(idempotency.__file__).resolve().parent
HASH = digest_of(fingerprint(["POST", "/things/", "{}"]))
DONE = Outcome(Status.SUCCEEDED, StoredResponse(201, [], b"made"))
LEASE = timedelta(seconds=30)
JOIN_TIMEOUT = 20.0


class RecordsElsewhere:
    """A router that sends the records' writes to another alias."""

    def db_for_write(self, model: type, **hints: Any) -> str | None:
        return "records" if model is IdempotencyRecord else None


# Choosing the store


def test_each_vendor_gets_its_store_and_any_other_database_the_orm_store():
    assert stores._store_class("postgresql") is PostgresStore
    assert stores._store_class("sqlite") is GenericStore
    assert stores._store_class("oracle") is GenericStore
    mysql = "idempotency.stores.mysql"
    expected = import_module(mysql).MySQLStore if find_spec(mysql) else GenericStore
    assert stores._store_class("mysql") is expected


def test_the_store_is_made_once_per_alias_for_its_database():
    store = store_for(DEFAULT_DB_ALIAS)
    assert store is store_for(DEFAULT_DB_ALIAS)
    assert store.alias == DEFAULT_DB_ALIAS
    assert type(store) is stores._store_class(connection.vendor)


def test_no_module_outside_the_stores_asks_which_database_it_is_on():
    """Vendor branches, SQLSTATEs and hand-edited model state live in idempotency/stores/."""
    asking = re.compile(r"\.vendor\b|sqlstate|pgcode|\b55P03\b|_state\.\w+\s*=(?!=)")
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        if "stores" not in path.relative_to(PACKAGE).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if asking.search(line)
    ]
    assert offenders == []


def test_no_module_outside_the_stores_writes_sql():
    raw_sql = re.compile(r"\.cursor\(\)|\.execute\(|\.raw\(")
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "stores" not in path.relative_to(PACKAGE).parts and raw_sql.search(path.read_text())
    ]
    assert offenders == []


def test_the_records_database_is_the_operations_then_the_setting_then_the_routers():
    assert records_database() == DEFAULT_DB_ALIAS
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.RecordsElsewhere"]):
        assert records_database() == "records"
        with override_settings(IDEMPOTENCY={"DATABASE": "setting"}):
            assert records_database() == "setting"
            assert records_database("given") == "given"
    assert Operation("s", "k", HASH, using=DEFAULT_DB_ALIAS).database == DEFAULT_DB_ALIAS


def test_sqlite_busy_is_contention_and_other_errors_are_not():
    store = GenericStore(DEFAULT_DB_ALIAS)
    assert store.contention(OperationalError("database is locked")) == "busy"
    assert store.contention(OperationalError("no such table: x")) is None


# The contract every store keeps, on this database


def every_store() -> list[Store]:
    vendor = store_for(DEFAULT_DB_ALIAS)
    return [vendor] if type(vendor) is GenericStore else [GenericStore(DEFAULT_DB_ALIAS), vendor]


@pytest.fixture(params=range(2), ids=["orm", "vendor"])
def store(request: pytest.FixtureRequest) -> Store:
    available = every_store()
    if request.param >= len(available):
        return available[0]  # this database has the ORM store only: test it twice
    return available[request.param]


def candidate(token: bytes = b"a" * 16, key: str = "k-1") -> Candidate:
    return Candidate("user:1:things", key, "things.create", HASH, "POST", "/things/", token)


@pytest.mark.django_db
class TestContract:
    def insert(self, store: Store, token: bytes = b"a" * 16) -> Found:
        with transaction.atomic():
            found = store.insert_or_lock(candidate(token))
        assert found is not None
        return found

    def test_insert_or_lock_inserts_then_hands_back_the_holder(self, store):
        first = self.insert(store)
        assert first.record.owner_token == b"a" * 16
        assert first.record.status == Status.PROCESSING
        assert first.lease_remaining is None and first.expired is False
        second = self.insert(store, token=b"b" * 16).record
        assert (second.pk, second.owner_token) == (first.record.pk, b"a" * 16)
        assert IdempotencyRecord.objects.count() == 1

    def test_what_the_store_judged_is_not_left_on_the_record(self, store):
        record = self.insert(store).record
        with transaction.atomic():
            locked = store.lock(record.pk).record
        assert not {"lease_remaining", "expired"} & set(vars(locked))
        assert not any(name.startswith("idempotency_") for name in vars(locked))

    def test_claim_inserts_with_the_lease_taken_or_reads_the_committed_holder(self, store):
        found = store.claim(candidate(), lease=LEASE, lock_timeout=1.0)
        if found is None:  # a store without a one-statement claim
            return
        claimed = found.record
        assert claimed.owner_token == b"a" * 16
        assert claimed.lease_until is not None
        assert claimed._state.db == DEFAULT_DB_ALIAS and not claimed._state.adding
        assert IdempotencyRecord.objects.get().lease_until == claimed.lease_until
        existing = store.claim(candidate(b"b" * 16), lease=None, lock_timeout=1.0)
        assert existing is not None and existing.record.pk == claimed.pk
        assert existing.record.owner_token == b"a" * 16 and existing.expired is False

    def test_the_owners_writes_are_fenced_by_its_token(self, store):
        record = self.insert(store).record
        values = {
            "status": Status.SUCCEEDED,
            "response_status": 201,
            "response_headers": [["Location", "/things/1/"]],
            "response_body": b"made",
            "resource_id": "1",
        }
        assert not store.renew(record.pk, b"b" * 16, LEASE)
        assert not store.finish(record.pk, b"b" * 16, values, None)
        assert not store.release(record.pk, b"b" * 16, None)
        assert not store.discard(record.pk, b"b" * 16)
        assert IdempotencyRecord.objects.get().version == 1  # nothing landed

        assert store.renew(record.pk, b"a" * 16, LEASE)
        assert store.finish(record.pk, b"a" * 16, values, timedelta(days=1))
        finished = IdempotencyRecord.objects.get()
        assert finished.status == Status.SUCCEEDED
        assert bytes(finished.response_body) == b"made"
        assert finished.response_headers == [["Location", "/things/1/"]]
        assert finished.lease_until is None and finished.completed_at is not None
        assert finished.expires_at > finished.completed_at
        assert finished.version == 2
        assert not store.finish(record.pk, b"a" * 16, values, None)  # once only

    def test_release_then_reclaim_then_discard(self, store):
        record = self.insert(store).record
        assert store.release(record.pk, b"a" * 16, timedelta(hours=1))
        released = IdempotencyRecord.objects.get()
        assert released.status == Status.FAILED_RETRYABLE
        assert released.expires_at is not None
        with transaction.atomic():
            store.reclaim(store.lock(record.pk).record, b"c" * 16, lease=LEASE)
        found = store_for(DEFAULT_DB_ALIAS).lock(record.pk)
        reclaimed = found.record
        assert (reclaimed.status, reclaimed.owner_token) == (Status.PROCESSING, b"c" * 16)
        assert reclaimed.attempts == 2 and reclaimed.expires_at is None
        assert found.lease_remaining is not None and found.lease_remaining > timedelta(0)
        assert store.discard(record.pk, b"c" * 16)
        assert not IdempotencyRecord.objects.exists()

    def expired(self, status: Status = Status.SUCCEEDED, **values: Any) -> IdempotencyRecord:
        return IdempotencyRecordFactory(
            scope="user:1:things",
            idem_key="k-1",
            succeeded=True,
            status=status,
            request_hash=digest_of(fingerprint(["another request"])),
            expires_at=timezone.now() - timedelta(seconds=1),
            **values,
        )

    @pytest.mark.parametrize(
        ("status", "expired"),
        [
            (Status.SUCCEEDED, True),
            (Status.FAILED_FINAL, True),
            (Status.FAILED_RETRYABLE, True),
            (Status.PROCESSING, False),
            (Status.NEEDS_REVIEW, False),
        ],
    )
    def test_only_a_finished_or_retryable_record_past_its_expiry_is_expired(
        self, store, status, expired
    ):
        record = self.expired(status)
        with transaction.atomic():
            assert store.lock(record.pk).expired is expired
            held = store.insert_or_lock(candidate(b"b" * 16))
            assert held is not None and held.expired is expired
        claimed = store.claim(candidate(b"b" * 16), lease=None, lock_timeout=1.0)
        if claimed is not None:  # the one-statement claim reads it as the lock does
            assert claimed.record.pk == record.pk and claimed.expired is expired
        IdempotencyRecord.objects.update(expires_at=timezone.now() + timedelta(hours=1))
        with transaction.atomic():
            assert store.lock(record.pk).expired is False

    def test_read_final_does_not_read_an_expired_record(self, store):
        record = self.expired()
        assert store.read_final(record.scope, record.idem_key) is None
        IdempotencyRecord.objects.update(expires_at=timezone.now() + timedelta(hours=1))
        assert store.read_final(record.scope, record.idem_key).pk == record.pk
        IdempotencyRecord.objects.update(expires_at=None)  # kept until an operator acts
        assert store.read_final(record.scope, record.idem_key).pk == record.pk

    def test_reclaim_makes_an_expired_record_the_new_requests_first_attempt(self, store):
        record = self.expired(attempts=3, recovery_attempts=2)
        with transaction.atomic():
            locked = store.lock(record.pk).record
            assert store.reclaim(locked, b"c" * 16, lease=LEASE, fresh=candidate())
        fresh = IdempotencyRecord.objects.get()
        assert (fresh.status, fresh.owner_token, fresh.request_hash) == (
            Status.PROCESSING,
            b"c" * 16,
            HASH,
        )
        assert (fresh.operation, fresh.request_path) == ("things.create", "/things/")
        assert (fresh.attempts, fresh.recovery_attempts, fresh.version) == (1, 0, 2)
        assert fresh.response_status is None and fresh.response_body is None
        assert fresh.response_headers == [] and fresh.resource_id == ""
        assert fresh.expires_at is None and fresh.completed_at is None
        assert fresh.created_at > record.created_at
        assert fresh.lease_until is not None

    def test_reclaim_as_new_is_fenced_by_the_expiry(self, store):
        # A record another claim already took over (or one still live) is not taken again.
        record = self.expired()
        IdempotencyRecord.objects.update(expires_at=timezone.now() + timedelta(hours=1))
        assert not store.reclaim(record, b"c" * 16, lease=None, fresh=candidate())
        IdempotencyRecord.objects.update(status=Status.PROCESSING, expires_at=None)
        assert not store.reclaim(record, b"c" * 16, lease=None, fresh=candidate())
        assert IdempotencyRecord.objects.get().owner_token == record.owner_token

    def test_delete_batch_deletes_the_batch_only(self, store):
        expired = IdempotencyRecordFactory.create_batch(5, succeeded=True, expired=True)
        kept = IdempotencyRecordFactory(succeeded=True)
        candidates = IdempotencyRecord.objects.purgeable().order_by("expires_at")
        with transaction.atomic():
            count, last, picked, keys = store.delete_batch(batch(candidates, 3), "expires_at")
        assert count == picked == 3 and keys == ()
        assert last is None or last == sorted(r.expires_at for r in expired)[2]
        assert IdempotencyRecord.objects.count() == 3
        assert IdempotencyRecord.objects.filter(pk=kept.pk).exists()


# What a database error means (PostgreSQL, real errors between real connections)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_lock_wait_past_its_bound_is_busy_and_the_setting_comes_back():
    record = IdempotencyRecordFactory()
    store = store_for(DEFAULT_DB_ALIAS)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            IdempotencyRecord.objects.select_for_update().get(pk=record.pk)
            locked.set()
            release.wait(JOIN_TIMEOUT)

    holder = in_thread(hold)
    try:
        assert locked.wait(JOIN_TIMEOUT)
        with transaction.atomic():
            with store.bounded_lock_wait(5.0):
                assert lock_timeout() == "5s"
            assert lock_timeout() == "0"
            with (
                pytest.raises(DatabaseError) as raised,
                transaction.atomic(),
                store.bounded_lock_wait(0.1),
            ):
                IdempotencyRecord.objects.select_for_update().get(pk=record.pk)
            assert store.contention(raised.value) == "busy"
            assert lock_timeout() == "0"  # the savepoint's rollback put it back
    finally:
        release.set()
        holder.join(JOIN_TIMEOUT)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_deadlock_is_retry():
    first, second = IdempotencyRecordFactory(), IdempotencyRecordFactory()
    both_locked = threading.Barrier(2, timeout=JOIN_TIMEOUT)
    errors: list[DatabaseError] = []

    def lock(mine: IdempotencyRecord, theirs: IdempotencyRecord) -> None:
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.select_for_update().get(pk=mine.pk)
                both_locked.wait()
                IdempotencyRecord.objects.select_for_update().get(pk=theirs.pk)
        except DatabaseError as exc:
            errors.append(exc)

    threads = [in_thread(lambda: lock(first, second)), in_thread(lambda: lock(second, first))]
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    assert len(errors) == 1  # PostgreSQL chose one victim; the other went on
    assert store_for(DEFAULT_DB_ALIAS).contention(errors[0]) == "retry"


def lock_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        return str(cursor.fetchone()[0])


# What the protocol does with it: a claim the database gave up is claimed again


class GivingUpStore(PostgresStore):
    """PostgreSQL's store, whose claim PostgreSQL fails as a deadlock's victim ``times`` times."""

    times = 0

    def claim(self, candidate: Candidate, **options: Any) -> IdempotencyRecord | None:
        if GivingUpStore.times:
            GivingUpStore.times -= 1
            with self.connection.cursor() as cursor:
                cursor.execute(
                    "DO $$ BEGIN RAISE EXCEPTION 'chosen as the victim' "
                    "USING ERRCODE = 'deadlock_detected'; END $$"
                )
        return super().claim(candidate, **options)


@pytest.fixture
def giving_up(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[GivingUpStore]]:
    monkeypatch.setitem(stores.VENDOR_STORES, "postgresql", f"{__name__}.GivingUpStore")
    store_for.cache_clear()
    yield GivingUpStore
    GivingUpStore.times = 0
    store_for.cache_clear()


def run(operation: Operation, ran: list[str]) -> str:
    return execute(
        operation,
        lambda attempt: ran.append("ran") or "ran",
        decide=lambda value, attempt: DONE,
        replay=lambda record: "replayed",
    )


def operation(**changes: Any) -> Operation:
    # Made in the test, after ``giving_up``: an operation keeps the store of its database.
    return replace(Operation("user:1:things", "k-1", HASH, name="things.create"), **changes)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_a_claim_given_up_is_claimed_again_in_a_new_transaction(giving_up, mode):
    giving_up.times = core.CLAIM_RETRIES
    ran: list[str] = []
    assert run(operation(mode=mode), ran) == "ran"
    assert ran == ["ran"]
    assert giving_up.times == 0
    assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_claim_given_up_too_often_is_a_409(giving_up):
    giving_up.times = core.CLAIM_RETRIES + 1
    heard: list[float] = []

    def listen(sender: Any, retry_after: float, **kwargs: Any) -> None:
        heard.append(retry_after)

    signals.key_in_use.connect(listen)
    try:
        with pytest.raises(KeyInUse):
            run(operation(), [])
    finally:
        signals.key_in_use.disconnect(listen)
    assert len(heard) == 1
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_inside_the_callers_transaction_a_claim_given_up_is_a_409_at_once(giving_up):
    giving_up.times = 1
    ran: list[str] = []
    with transaction.atomic():
        with pytest.raises(KeyInUse):
            run(operation(), ran)
        assert giving_up.times == 0  # not tried again: the transaction is the caller's
        assert run(operation(), ran) == "ran"  # the caller's transaction is still usable
    assert ran == ["ran"]
