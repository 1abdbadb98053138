"""The shop's background work, under both task frameworks the library protects.

``record_payment_event`` (Celery): a provider's payment events from a queue. The
provider (or a bridge from its webhooks) publishes it; a trade delivered again,
re-sent with a new ``delivered_at`` or while the first delivery still runs, is
answered with the first result.

``issue_receipt`` (Django's tasks, run by ``manage.py db_worker``): an order's
receipt, enqueued by ``POST /api/orders/{id}/receipt/``. However often it is asked
for, with one key or several, the order gets one receipt.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from celery import shared_task

from example_project.shop.models import Order, Receipt
from example_project.shop.payments import record_payment
from idempotency.celery import IdempotentTask
from idempotency.django_tasks import idempotent_task

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]


@shared_task(
    base=IdempotentTask,
    idempotency_scope=lambda event: f"payment-events:{event['provider']}",
    idempotency_key=lambda event: f"{event['provider']}:{event['trade_no']}",
    idempotency_exclude=["delivered_at"],  # changes with every delivery; not the intent
    acks_late=True,  # a crashed worker's event is delivered again, not lost
    max_retries=20,
)
def record_payment_event(event: dict[str, Any]) -> dict[str, Any]:
    order = record_payment(
        provider=event["provider"],
        trade_no=event["trade_no"],
        order_id=event["order_id"],
        amount=Decimal(str(event["amount"])),
    )
    return {"order_id": order.pk, "status": order.status}


# Keyed by the order, not by the request: each POST with a new key enqueues a task of its
# own, and every run after the first returns the first run's result. Atomic mode (the
# default): the receipt and the record commit together, so a run that fails or whose
# worker dies leaves neither, and the run again issues the receipt once.
@task()
@idempotent_task(key=lambda order_id: str(order_id), scope="receipts")
def issue_receipt(order_id: int) -> dict[str, Any]:
    order = Order.objects.get(pk=order_id)  # deleted since: the run fails, nothing recorded
    receipt, _ = Receipt.objects.get_or_create(order=order)
    return {"order": order.pk, "receipt": receipt.pk, "issued_at": receipt.issued_at}
