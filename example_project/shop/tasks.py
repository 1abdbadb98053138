"""A provider's payment events from a queue: each trade is recorded once.

The provider (or a bridge from its webhooks) publishes ``record_payment_event``;
a trade delivered again, re-sent with a new ``delivered_at`` or while the first
delivery still runs, is answered with the first result.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from celery import shared_task

from example_project.shop.payments import record_payment
from idempotency.celery import IdempotentTask


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
