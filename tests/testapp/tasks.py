"""Idempotent Celery tasks for tests/protocol/test_celery.py.

The effect is an ``Order`` whose ``sku`` carries the key; ``seconds`` keeps the
first run busy so that a duplicate arrives while it holds the key. ``charge_order``
charges a payment provider (tests.support.fake_provider) through a step instead.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
from celery import shared_task
from celery.utils.log import get_task_logger
from django.contrib.auth import get_user_model

from idempotency import IdempotencyRecord
from idempotency.celery import IdempotentTask
from idempotency.steps import current

from .lease_views import sku_for
from .models import Order
from .outage_views import kill_own_connection

LEASE_SECONDS = 5


def _place(ref: str, owner_id: int, quantity: int, seconds: float) -> dict[str, int]:
    time.sleep(seconds)
    order = Order.objects.create(owner_id=owner_id, sku=sku_for(ref), quantity=quantity)
    return {"order": order.pk, "quantity": quantity}


@shared_task(
    base=IdempotentTask,
    idempotency_key=lambda ref, **_: ref,
    idempotency_exclude=["sent_at"],  # delivery metadata: not part of the intent
    idempotency_mode="lease",
    idempotency_lease_seconds=LEASE_SECONDS,
    max_retries=10,
)
def place_order(
    ref: str, owner_id: int, quantity: int, seconds: float = 0, sent_at: str = ""
) -> dict[str, int]:
    return _place(ref, owner_id, quantity, seconds)


@shared_task(
    base=IdempotentTask,
    idempotency_key=lambda ref, **_: ref,
    idempotency_scope=lambda ref, owner_id, **_: f"user:{owner_id}:orders",
    max_retries=10,
)
def place_order_atomic(
    ref: str, owner_id: int, quantity: int, seconds: float = 0
) -> dict[str, int]:
    return _place(ref, owner_id, quantity, seconds)


@shared_task(
    bind=True,
    base=IdempotentTask,
    idempotency_key=lambda ref, **_: ref,
    idempotency_lock_timeout=0.5,
    max_retries=1,
)
def place_order_impatiently(
    self: IdempotentTask, ref: str, owner_id: int, quantity: int, seconds: float = 0
) -> dict[str, int]:
    return {**_place(ref, owner_id, quantity, seconds), "retries": self.request.retries}


# The example of docs/celery.md, as written there: its key function takes the first
# argument by name, however the task is called.
@shared_task(
    base=IdempotentTask,
    idempotency_key=lambda order_ref, **_: order_ref,
    idempotency_exclude=["sent_at"],  # delivery metadata, not part of the intent
    acks_late=True,
    max_retries=20,
)
def capture_payment(order_ref, amount, sent_at=None):  # type: ignore[no-untyped-def]
    owner, _ = get_user_model().objects.get_or_create(username="payments")
    payment = Order.objects.create(owner=owner, sku=sku_for(order_ref), quantity=1)
    return {"payment": payment.pk}


@shared_task(
    bind=True,
    base=IdempotentTask,
    idempotency_key=lambda ref, **_: ref,
    max_retries=3,
)
def place_order_through_an_outage(self: IdempotentTask, ref: str, owner_id: int) -> dict[str, int]:
    """Its first run's connection is killed by the database after the write."""
    placed = _place(ref, owner_id, 1, 0)
    if self.request.retries == 0:
        kill_own_connection()
    return {**placed, "retries": self.request.retries}


# -- steps: a task that charges a provider through its attempt's step key -----------------

logger = get_task_logger(__name__)

STEP_LEASE_SECONDS = 1.0
# Set in a worker's environment: its run of charge_order logs "charged" once the charge is
# in hand (and recorded, for a recorded step), then hangs there until the test kills it.
HANG_AFTER_CHARGE = "IDEMPOTENCY_TEST_HANG_AFTER_CHARGE"


@shared_task(
    bind=True,
    base=IdempotentTask,
    idempotency_key=lambda order, **_: order,
    idempotency_mode="lease",
    idempotency_lease_seconds=STEP_LEASE_SECONDS,
    # Its one external effect carries the step's key: a lost run is released for a retry,
    # which the provider answers with the first charge (a recorded step is not even sent).
    idempotency_resolver="idempotency.steps.effects_carry_step_keys",
    max_retries=10,
)
def charge_order(
    self: IdempotentTask, provider: str, order: str, amount: int, recorded: bool = False
) -> str:
    def charge(key: str) -> dict[str, Any]:
        answer = httpx.post(
            f"{provider}/charges",
            json={"amount": amount, "currency": "eur"},
            headers={"Idempotency-Key": key},
        )
        answer.raise_for_status()
        return dict(answer.json())

    attempt = self.idempotency
    # Recorded, a later attempt gets the charge back without calling the provider; keyed
    # only, it calls again with the same key and the provider answers the first charge.
    charged = attempt.step("charge", charge) if recorded else charge(attempt.step_key("charge"))
    if os.environ.get(HANG_AFTER_CHARGE):
        logger.info("charged %s", order)
        time.sleep(60)  # SIGKILLed here: the provider answered, the record is not finished
    return str(charged["id"])


@shared_task(
    bind=True,
    base=IdempotentTask,
    idempotency_key=lambda ref, **_: ref,
    idempotency_mode="lease",
)
def whose_attempt(self: IdempotentTask, ref: str) -> dict[str, Any]:
    """What ``self.idempotency`` is while the task runs, for the test to compare."""
    attempt = self.idempotency
    return {
        "is_current": attempt is current(),
        "record": attempt.record.pk,
        "key": attempt.operation.key,
        "owns_the_record": attempt.owner_token
        == IdempotencyRecord.objects.get(pk=attempt.record.pk).owner_token,
        "step_key": attempt.step_key("charge"),
    }
