"""Twins of the example's order create, one per way of protecting it.

Each twin is the example's ``OrderViewSet`` create (same serializer, same
queryset, same ``perform_create``) with one thing changed: no protection (and
no protection, in a transaction), lease mode, or an alternative package wired
as its own docs say.
"""

from __future__ import annotations

import time
import uuid
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.dispatch import Signal, receiver
from rest_framework import mixins, serializers, viewsets
from rest_framework.request import Request
from rest_framework.serializers import BaseSerializer

from example_project.shop.models import Order, Payment
from example_project.shop.serializers import OrderSerializer
from idempotency import IdempotentCreateMixin


class OrderCreate(mixins.CreateModelMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    """The example's order create with no idempotency at all."""

    serializer_class = OrderSerializer

    def get_queryset(self) -> QuerySet[Order]:
        return Order.objects.filter(owner_id=self.request.user.pk)

    def perform_create(self, serializer: BaseSerializer[Order]) -> None:
        serializer.save(owner=self.request.user)


class TransactionalOrderCreate(OrderCreate):
    """The same create in a transaction, as ATOMIC_REQUESTS or a create of several rows runs it."""

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        with transaction.atomic():
            return super().create(request, *args, **kwargs)


class ProtectedOrderCreate(IdempotentCreateMixin, OrderCreate):
    """The unprotected twin with the mixin, routed alike: the cost of protection alone.

    ``/api/orders/`` (the example's ``ModelViewSet``, under a router) costs a
    little more than the twin even without the mixin.
    """

    idempotency_operation = "bench.orders.protected"


class WrittenOnceOrderCreate(ProtectedOrderCreate):
    """The twin with the record written once (``in_flight="run"``, issue 32), beside the default.

    The create's every effect is its row, so duplicates may run it: the loser's
    row rolls back with its transaction.
    """

    idempotency_operation = "bench.orders.written-once"
    idempotency_in_flight = "run"


class LeaseOrderCreate(IdempotentCreateMixin, OrderCreate):
    """The same create in lease mode: claim, commit, work, finish (no long transaction)."""

    idempotency_operation = "bench.orders.lease"
    idempotency_mode = "lease"


class SlowLeaseOrderCreate(LeaseOrderCreate):
    """Lease mode around a 2 s job (a provider's call): duplicates arrive while it runs."""

    idempotency_operation = "bench.orders.lease-2s"
    job_seconds = 2.0

    def perform_create(self, serializer: BaseSerializer[Order]) -> None:
        time.sleep(self.job_seconds)
        super().perform_create(serializer)


class WaitingSlowLeaseOrderCreate(SlowLeaseOrderCreate):
    """The same 2 s job whose duplicates wait for its outcome instead of a 409."""

    idempotency_operation = "bench.orders.lease-2s-wait"
    idempotency_wait_seconds = 10.0


# --- a create as a real endpoint does it -------------------------------------------------

order_placed = Signal()
OPEN_ORDERS = 1_000_000  # a limit the benchmark never reaches, read on every create


class PlacedOrderSerializer(OrderSerializer):
    """The order create with what a real one validates: the SKU's form, a limit per caller."""

    amount = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        min_value=Decimal("0.01"),
        write_only=True,
        default=Decimal("9.99"),  # the benchmark's bodies carry none
    )

    class Meta(OrderSerializer.Meta):
        fields = [*OrderSerializer.Meta.fields, "amount"]

    def validate_sku(self, value: str) -> str:
        if not value.isascii() or not value.replace("-", "").isalnum():
            raise serializers.ValidationError("A SKU is letters, digits and dashes.")
        return value.lower()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        owner = self.context["request"].user
        if Order.objects.filter(owner=owner, status=Order.Status.PENDING).count() >= OPEN_ORDERS:
            raise serializers.ValidationError("Too many open orders.")  # read 1
        return attrs


@receiver(order_placed)
def _order_placed(sender: Any, order: Order, **kwargs: Any) -> None:
    # A receiver such as a notification or an audit trail would be: it reads what was written.
    Payment.objects.filter(order=order).exists()  # read 2


class PlacedOrderCreate(OrderCreate):
    """A create as a real endpoint does it, unprotected.

    Validation with a read (``PlacedOrderSerializer``), then in one transaction
    the order and its payment (two INSERTs), the order marked paid (an UPDATE)
    and a signal whose receiver reads: about what an order endpoint of a shop
    does, against the one INSERT of ``OrderCreate``.
    """

    serializer_class = PlacedOrderSerializer

    def perform_create(self, serializer: BaseSerializer[Order]) -> None:
        amount = serializer.validated_data.pop("amount")  # type: ignore[union-attr]
        with transaction.atomic():
            order = serializer.save(owner=self.request.user)
            Payment.objects.create(
                order=order, provider="bench", trade_no=uuid.uuid4().hex, amount=amount
            )
            order.mark_paid()
            order_placed.send(Order, order=order)


class ProtectedPlacedOrderCreate(IdempotentCreateMixin, PlacedOrderCreate):
    """The same create behind this app (atomic mode): its transaction nests in the claim's."""

    idempotency_operation = "bench.orders.placed"


def alternative_views() -> dict[str, Any]:
    """View functions of the alternatives that are installed, by URL slug."""
    views: dict[str, Any] = {}
    try:
        from drf_idempotencykey.mixins import DrfIdempotencyKeyMixin
    except ImportError:
        pass
    else:

        class DrfIdempotencyKeyOrderCreate(DrfIdempotencyKeyMixin, OrderCreate):
            pass

        views["drf-idempotencykey"] = DrfIdempotencyKeyOrderCreate.as_view({"post": "create"})
    try:
        from drf_idempotency import idempotent as drf_idempotent
    except ImportError:
        pass
    else:

        class DrfIdempotencyOrderCreate(OrderCreate):
            # As its docs show for viewsets. Its decorator renders the response itself,
            # before DRF has chosen a renderer: without finalizing it first, every
            # request is a 500 (AssertionError: .accepted_renderer not set on Response).
            @drf_idempotent()
            def create(self, request: Request, *args: Any, **kwargs: Any) -> Any:
                response = super().create(request, *args, **kwargs)
                return self.finalize_response(request, response, *args, **kwargs)

        views["drf-idempotency"] = DrfIdempotencyOrderCreate.as_view({"post": "create"})
    try:
        from idempotency_key.decorators import idempotency_key
    except ImportError:
        pass
    else:

        class IdempotencyKeyOrderCreate(OrderCreate):
            @idempotency_key
            def create(self, request: Request, *args: Any, **kwargs: Any) -> Any:
                return super().create(request, *args, **kwargs)

        views["django-idempotency-key"] = IdempotencyKeyOrderCreate.as_view({"post": "create"})
    return views
