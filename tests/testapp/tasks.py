"""Idempotent Celery tasks for tests/protocol/test_celery.py.

The effect is an ``Order`` whose ``sku`` carries the key; ``seconds`` keeps the
first run busy so that a duplicate arrives while it holds the key.
"""

from __future__ import annotations

import time

from celery import shared_task
from django.contrib.auth import get_user_model

from idempotency.celery import IdempotentTask

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
