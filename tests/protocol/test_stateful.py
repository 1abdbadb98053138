"""The record protocol against the real tables: a Hypothesis state machine.

Rules interleave, on a few keys of each mode (atomic, atomic with the record written
once, and lease): duplicates of one request from several threads at once, each on its
own connection; an attempt whose database connection the server kills in the middle
(``pg_terminate_backend``, MariaDB's ``KILL CONNECTION``) or whose work crashes after
its effect; a lease taken over while its owner still runs, and the stale owner's late
renewal or finish; lease and retention expiry, by moving ``lease_until``/``expires_at``
into the past with an ``UPDATE`` (the library reads the database's clock); recovery and
purge passes; retries, and the same key with another payload. After every step the
business rows are held against the records (see ``StatefulProtocol``'s invariants).

The business effect is an ``Order`` row whose ``sku`` names the key. A key's window
ends when its finished record's ``expires_at`` passes: from then on a request under it
is new and may have an effect of its own. The test marks the rows of windows that
ended ``paid=True`` (the field means "archived" here), so the rows with ``paid=False``
are the effects of each key's current window, which the resolver and the invariants
count.

Replay a failure: the run prints ``STATEFUL_SEED=<n>`` (and, with ``print_blob``, a
``@reproduce_failure`` blob); run the test again with that variable set::

    STATEFUL_SEED=<n> DATABASE_URL=postgres://... REQUIRE_POSTGRES=1 \\
      .venv/bin/python -m pytest tests/protocol/test_stateful.py

The seed replays the same rules and arguments; the threads' interleaving inside a step
is the scheduler's, so a race may need a few runs to show again. ``STATEFUL_EXAMPLES``
and ``STATEFUL_STEPS`` raise the bounds for a longer hunt.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.db.models.functions import Now
from django.test import override_settings
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from idempotency import (
    IdempotencyRecord,
    KeyInUse,
    KeyReused,
    LeaseLost,
    Operation,
    Outcome,
    Resolution,
    Status,
    StoredResponse,
    execute,
    purge,
    recover_expired,
)
from tests.support.factories import UserFactory
from tests.support.threads import JOIN_TIMEOUT, Call, in_thread
from tests.testapp.models import Order

# On the server databases only: the races, the killed connections and the database's
# clock are what this is about; SQLite serialises writes and has no backend to kill.
pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]

ATOMIC, LEASE = "tests.stateful.atomic", "tests.stateful.lease"
# Two keys per mode, enough for one key's steps to run beside another's, and one atomic
# key whose record is written once, at the end of its transaction (IN_FLIGHT "run").
KEYS = ("a0", "a1", "w0", "l0", "l1")
# Purge takes only what these say has expired, and the test moves that by hand.
FINISHED = (Status.SUCCEEDED, Status.FAILED_FINAL, Status.FAILED_RETRYABLE)
JSON = [("Content-Type", "application/json")]
# The business user every Order belongs to (set by the test before the machine runs).
OWNER: dict[str, int] = {}
# The "provider" of the takeover rule dedupes its calls under this lock (see effect_once).
PROVIDER = threading.Lock()
# What the steps met, printed at the end: a run that never reached a path says so.
SEEN: Counter[str] = Counter()

IDEMPOTENCY = {
    # Lease-mode duplicates of a live attempt answer 409 at once: a step never waits.
    "WAIT_SECONDS": 0,
    "LEASE_SECONDS": 30,
    # Atomic duplicates wait on the first's row lock for its outcome, never for this long.
    "LOCK_TIMEOUT": 10,
    # The documented registration, which recovery passes read.
    "RESOLVERS": {LEASE: "tests.protocol.test_stateful.resolve_from_orders"},
}


class WorkerKilled(BaseException):
    """What a killed worker's work 'raises': not an Exception, as SystemExit is not."""


def mode_of(key: str) -> str:
    return "lease" if key.startswith("l") else "atomic"


def in_flight_of(key: str) -> str | None:
    return "run" if key.startswith("w") else None


def operation_of(key: str) -> str:
    return ATOMIC if mode_of(key) == "atomic" else LEASE


def sku(key: str) -> str:
    return f"stateful:{key}"


def effects(key: str) -> list[Order]:
    """The key's effects in its current window (rows of ended windows are ``paid``)."""
    return list(Order.objects.filter(sku=sku(key), paid=False).order_by("pk"))


def result_of(order: Order) -> dict[str, int]:
    return {"order": order.pk, "quantity": order.quantity}


def resolve_from_orders(record: IdempotencyRecord) -> Resolution:
    """Done if the key's effect exists in its window, with the answer the work gave."""
    found = effects(record.idem_key)
    if not found:
        return Resolution.not_done()
    body = json.dumps(result_of(found[0])).encode()
    return Resolution.done(found[0].pk, StoredResponse(200, JSON, body))


def the_record(key: str) -> IdempotencyRecord | None:
    return IdempotencyRecord.objects.filter(scope=scope_of(key), idem_key=key).first()


def scope_of(key: str) -> str:
    return f"stateful:{mode_of(key)}"


def records(**where: Any) -> bool:
    return IdempotencyRecord.objects.filter(**where).exists()


def live(key: str) -> bool:
    """The key's record holds it (its window has not passed, by the database's clock)."""
    records = IdempotencyRecord.objects.filter(scope=scope_of(key), idem_key=key)
    return records.exclude(status__in=FINISHED, expires_at__lte=Now()).exists()


Hook = Callable[[str, Any], None]


def no_hook(stage: str, attempt: Any) -> None:
    pass


def call(key: str, quantity: int, hook: Hook = no_hook, *, once: bool = False) -> Any:
    """One request: ``execute`` with the key's mode; its work inserts the Order.

    ``hook(stage, attempt)`` runs at "claimed" (before the effect) and "effect" (after
    it, before the finish). ``once``: the effect goes through a provider that dedupes
    calls per window (an external API with idempotency keys of its own).
    """
    request_hash = hashlib.sha256(json.dumps({"quantity": quantity}).encode()).hexdigest()
    operation = Operation(
        scope=scope_of(key),
        key=key,
        request_hash=request_hash,
        name=operation_of(key),
        mode=mode_of(key),  # type: ignore[arg-type]
        in_flight=in_flight_of(key),  # type: ignore[arg-type]
    )

    def work(attempt: Any) -> dict[str, int]:
        hook("claimed", attempt)
        order = effect_once(key, quantity) if once else effect(key, quantity)
        hook("effect", attempt)
        return result_of(order)

    def decide(value: dict[str, int], attempt: Any) -> Outcome:
        body = json.dumps(value).encode()
        return Outcome(Status.SUCCEEDED, StoredResponse(200, JSON, body), str(value["order"]))

    def replay(record: IdempotencyRecord) -> Any:
        return json.loads(bytes(record.response_body)) if record.response_body else None

    return execute(operation, work, decide=decide, replay=replay)


def effect(key: str, quantity: int) -> Order:
    return Order.objects.create(owner_id=OWNER["id"], sku=sku(key), quantity=quantity)


def effect_once(key: str, quantity: int) -> Order:
    # The provider's own idempotency (a payment API's key): a second call in the window
    # returns the first's effect. Only the takeover rule uses it: there the stale owner
    # runs on by design, and what is tested is that its writes to the record never land.
    with PROVIDER:
        found = effects(key)
        return found[0] if found else effect(key, quantity)


def kill_connection_of_this_thread() -> None:
    """Have the server end this thread's connection, from another connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_backend_pid()"
            if connection.vendor == "postgresql"
            else "SELECT CONNECTION_ID()"
        )
        (pid,) = cursor.fetchone()
    side = connections.create_connection("default")
    try:
        with side.cursor() as cursor:
            if side.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            else:
                cursor.execute(f"KILL CONNECTION {int(pid)}")
    finally:
        side.close()


keys = st.sampled_from(KEYS)
lease_keys = st.sampled_from([key for key in KEYS if mode_of(key) == "lease"])
quantities = st.integers(min_value=1, max_value=3)


class StatefulProtocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # Each example starts on empty tables: the test database outlives the examples.
        IdempotencyRecord.objects.all().delete()
        Order.objects.all().delete()
        # The payload of each key's request in its current window.
        self.payload = dict.fromkeys(KEYS, 1)

    # -- requests --------------------------------------------------------------------

    @rule(key=keys, count=st.integers(min_value=2, max_value=4))
    def duplicates_at_once(self, key: str, count: int) -> None:
        """``count`` copies of the request, released together, each on its connection."""
        barrier = threading.Barrier(count, timeout=JOIN_TIMEOUT)
        quantity = self.payload[key]
        threads = [Call(lambda: call(key, quantity), barrier) for _ in range(count)]
        for thread in threads:
            thread.start()
        answers = []
        for thread in threads:
            thread.done()
            if thread.error is None:
                answers.append(thread.answer)
            else:
                # Lease mode: a duplicate of a live attempt, or of one whose lease a
                # killed worker left, is told so; nothing else may go wrong.
                assert isinstance(thread.error, KeyInUse), repr(thread.error)
                SEEN[f"duplicate in use ({mode_of(key)})"] += 1
        SEEN[f"duplicates answered ({mode_of(key)})"] += len(answers)
        self.check_answers(key, answers)

    @rule(key=keys)
    def retry(self, key: str) -> None:
        """The same request again, alone (a client retrying after a lost response)."""
        thread = in_thread(lambda: call(key, self.payload[key])).done()
        if thread.error is not None:
            assert isinstance(thread.error, KeyInUse), repr(thread.error)
        else:
            self.check_answers(key, [thread.answer])

    @rule(key=keys, other=st.integers(min_value=4, max_value=6))
    def another_payload(self, key: str, other: int) -> None:
        """Same key, another request: 422 (``KeyReused``), nothing runs, nothing changes."""
        if not live(key):
            return  # no record holds the key: it would be a new request, not a reuse
        before = snapshot(key)
        thread = in_thread(lambda: call(key, other)).done()
        assert isinstance(thread.error, KeyReused), repr(thread.error or thread.answer)
        SEEN["key reused"] += 1
        assert snapshot(key) == before

    # -- attempts that die -------------------------------------------------------------

    @rule(key=keys, stage=st.sampled_from(["claimed", "effect"]))
    def backend_terminated(self, key: str, stage: str) -> None:
        """The server ends the attempt's connection before or after its effect.

        Atomic mode: the transaction is gone, record and effect with it. Lease mode:
        after the effect (committed on its own) the finish cannot reach the database,
        so the record stays in flight until its lease runs out; before it, the effect
        fails and the key is released over a fresh connection.
        """

        def hook(at: str, attempt: Any) -> None:
            if at == stage:
                kill_connection_of_this_thread()

        thread = in_thread(lambda: call(key, self.payload[key], hook)).done()
        outcome = "answered" if thread.error is None else type(thread.error).__name__
        SEEN[f"terminated at {stage} ({mode_of(key)}): {outcome}"] += 1
        if thread.error is None:
            self.check_answers(key, [thread.answer])  # a replay: the work never ran

    @rule(key=lease_keys)
    def worker_killed_after_effect(self, key: str) -> None:
        """Lease mode's crash, on its own: the record stays in flight, its effect made."""
        self.backend_terminated(key, "effect")

    @rule(key=st.sampled_from([key for key in KEYS if mode_of(key) == "atomic"]))
    def crash_after_effect(self, key: str) -> None:
        """Atomic mode: the work dies after its insert; nothing of it may stay."""

        def hook(at: str, attempt: Any) -> None:
            if at == "effect":
                raise WorkerKilled()

        thread = in_thread(lambda: call(key, self.payload[key], hook)).done()
        if thread.error is None:
            self.check_answers(key, [thread.answer])
        else:
            assert isinstance(thread.error, (WorkerKilled, KeyInUse)), repr(thread.error)
            SEEN[f"crashed: {type(thread.error).__name__}"] += 1

    @rule(key=lease_keys, renews=st.booleans(), recovery_first=st.booleans())
    def lease_taken_over(self, key: str, renews: bool, recovery_first: bool) -> None:
        """A slow owner loses its lease to a retry; its late renewal or finish must not land.

        The first attempt pauses before its effect; its lease is moved into the past;
        (a recovery pass, or) the retry's claim asks the resolver, which finds no effect,
        and the retry takes the record over. Then the stale owner goes on: it renews
        (``LeaseLost``, and it stops), or makes its effect through the provider and
        finishes (``LeaseLost``). The new owner's outcome is the one recorded.
        """
        quantity = self.payload[key]
        first_claimed, first_go = threading.Event(), threading.Event()
        second_claimed, second_go = threading.Event(), threading.Event()
        tokens: dict[str, str] = {}

        def first(at: str, attempt: Any) -> None:
            if at == "claimed":
                first_claimed.set()
                assert first_go.wait(JOIN_TIMEOUT)
                if renews:
                    attempt.renew()

        def second(at: str, attempt: Any) -> None:
            if at == "claimed":
                tokens["second"] = attempt.owner_token
                second_claimed.set()
                assert second_go.wait(JOIN_TIMEOUT)

        stale = Call(lambda: call(key, quantity, first, once=True))
        stale.start()
        if not wait_for(first_claimed, stale):
            # It did not claim (a replay, or a key in use): an ordinary request, then.
            stale.done()
            SEEN["takeover: no claim"] += 1
            self.settle_lone(key, stale)
            return
        moved = IdempotencyRecord.objects.filter(
            scope=scope_of(key), idem_key=key, status=Status.PROCESSING
        ).update(lease_until=Now() - timedelta(seconds=1))
        assert moved == 1
        if recovery_first:
            report = recover_expired()
            assert report.released == 1, report.as_dict()
        newer = Call(lambda: call(key, quantity, second, once=True))
        newer.start()
        try:
            assert wait_for(second_claimed, newer), repr(newer.done().error)
        finally:
            first_go.set()
        stale.done()
        second_go.set()
        newer.done()
        assert isinstance(stale.error, LeaseLost), repr(stale.error or stale.answer)
        assert newer.error is None, repr(newer.error)
        self.check_answers(key, [newer.answer])
        record = the_record(key)
        assert record is not None
        assert (record.status, record.owner_token) == (Status.SUCCEEDED, tokens["second"])
        SEEN[f"takeover: stale {'renewal' if renews else 'finish'} fenced"] += 1

    def settle_lone(self, key: str, thread: Call) -> None:
        if thread.error is None:
            self.check_answers(key, [thread.answer])
        else:
            assert isinstance(thread.error, KeyInUse), repr(thread.error)

    # -- time passes, operators run the passes ----------------------------------------

    # The time and operator steps run only where they can change something: a bounded
    # run spends its steps on interleavings, not on passes over nothing.
    @precondition(lambda self: records(status=Status.PROCESSING, lease_until__gt=Now()))
    @rule()
    def leases_expire(self) -> None:
        """Every lease left by a killed attempt runs out (the clock is the same for all)."""
        IdempotencyRecord.objects.filter(status=Status.PROCESSING).update(
            lease_until=Now() - timedelta(seconds=1)
        )

    @precondition(lambda self: records())
    @rule(key=st.none() | keys, quantity=quantities)
    def retention_expires(self, key: str | None, quantity: int) -> None:
        """A record's ``expires_at`` passes (every record's, for None), whatever its state.

        The library must judge by the state: a finished record's window ends, its effect
        is archived, and the next request under the key (here with a payload drawn anew)
        is a new one. A record in flight never expires (an atomic claim gives it a
        success's expiry already, a killed lease-mode attempt may outlive it): its window,
        and its effect, go on.
        """
        for chosen in KEYS if key is None else [key]:
            record = the_record(chosen)
            if record is None:
                continue
            IdempotencyRecord.objects.filter(pk=record.pk).update(
                expires_at=Now() - timedelta(seconds=1)
            )
            if record.status in FINISHED:
                Order.objects.filter(sku=sku(chosen), paid=False).update(paid=True)
                self.payload[chosen] = quantity

    @precondition(lambda self: records(status=Status.PROCESSING, lease_until__lt=Now()))
    @rule()
    def recovery_pass(self) -> None:
        report = recover_expired()
        for outcome, count in report.outcomes().items():
            SEEN[f"recovery: {outcome}"] += count

    @precondition(lambda self: records(expires_at__lt=Now()))
    @rule()
    def purge_pass(self) -> None:
        unfinished = set(
            IdempotencyRecord.objects.exclude(status__in=FINISHED).values_list("pk", flat=True)
        )
        SEEN["purged"] += purge()
        left = set(IdempotencyRecord.objects.values_list("pk", flat=True))
        assert unfinished <= left, f"purged in flight or in review: {unfinished - left}"

    # -- what must hold after every step -----------------------------------------------

    def check_answers(self, key: str, answers: list[Any]) -> None:
        """Every answer is the outcome of the key's one effect in its window."""
        if not answers:
            return
        found = effects(key)
        assert len(found) == 1, (key, found, answers)
        assert all(answer == result_of(found[0]) for answer in answers), (answers, found)

    @invariant()
    def at_most_one_effect_per_key_and_window(self) -> None:
        for key in KEYS:
            assert len(effects(key)) <= 1, (key, effects(key), snapshot(key))

    @invariant()
    def records_agree_with_the_business_rows(self) -> None:
        for key in KEYS:
            record, found = the_record(key), effects(key)
            if record is None or not live(key):
                # No record holds the key: nothing of this window may have happened,
                # except a lease-mode effect whose record a bug purged (caught here too).
                assert found == [], (key, found, snapshot(key))
                continue
            if record.status == Status.SUCCEEDED:
                # The record's answer is its effect's, committed together (atomic) or
                # found by the work or the resolver (lease).
                assert len(found) == 1, (key, found, snapshot(key))
                assert record.resource_id == str(found[0].pk)
                assert json.loads(bytes(record.response_body)) == result_of(found[0])
            elif record.status == Status.FAILED_RETRYABLE:
                assert found == [], (key, found, snapshot(key))  # released: no effect
            else:
                # Between steps no atomic transaction is open: an atomic record is
                # committed with its effect or not at all, so never left in flight.
                assert mode_of(key) == "lease", (key, snapshot(key))
                assert record.status == Status.PROCESSING, (key, snapshot(key))


def snapshot(key: str) -> tuple[Any, ...] | None:
    values = (
        IdempotencyRecord.objects.filter(scope=scope_of(key), idem_key=key)
        .values_list(
            "pk",
            "status",
            "owner_token",
            "request_hash",
            "version",
            "attempts",
            "lease_until",
            "expires_at",
            "response_body",
        )
        .first()
    )
    if values is None:
        return None
    *head, body = values
    return (*head, bytes(body) if body is not None else None)


def wait_for(event: threading.Event, thread: Call) -> bool:
    """Until ``event`` is set (True), or ``thread`` ended without setting it (False)."""
    while not event.wait(0.01):
        if not thread.is_alive():
            return event.is_set()
    return True


def test_the_protocol_holds_under_interleavings():
    OWNER["id"] = UserFactory(username="stateful").pk
    chosen = int(os.environ.get("STATEFUL_SEED") or random.randrange(2**32))
    # A class per run: ``seed`` marks the class it decorates.
    machine = seed(chosen)(type("Run", (StatefulProtocol,), {}))
    bounds = settings(
        max_examples=int(os.environ.get("STATEFUL_EXAMPLES", 30)),
        stateful_step_count=int(os.environ.get("STATEFUL_STEPS", 20)),
        deadline=None,
        database=None,  # a seed alone replays a run; nothing is kept between runs
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    try:
        with override_settings(IDEMPOTENCY=IDEMPOTENCY):
            run_state_machine_as_test(machine, settings=bounds)
    except BaseException:
        print(f"\nReplay this run with STATEFUL_SEED={chosen} (see the module's docstring).")
        raise
    print(f"STATEFUL_SEED={chosen}: held; steps met: {dict(sorted(SEEN.items()))}")
