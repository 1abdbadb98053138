"""Recording a provider's payment: the business effect the callback must have once."""

from __future__ import annotations

from decimal import Decimal

from django.shortcuts import get_object_or_404
from rest_framework.exceptions import APIException

from example_project.shop.models import Order, Payment


class TradeMismatch(APIException):
    status_code = 422
    default_detail = "This trade was already recorded for another order or amount."
    default_code = "trade_mismatch"


def record_payment(*, provider: str, trade_no: str, order_id: int, amount: Decimal) -> Order:
    """Store the payment and mark its order paid; raises ``Http404`` for an unknown order."""
    # The row lock serialises different trades paying the same order.
    order = get_object_or_404(Order.objects.select_for_update(), pk=order_id)
    payment, created = Payment.objects.get_or_create(
        provider=provider, trade_no=trade_no, defaults={"order": order, "amount": amount}
    )
    if not created and (payment.order_id != order.pk or payment.amount != amount):
        raise TradeMismatch()
    order.mark_paid()
    return order
