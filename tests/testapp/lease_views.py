"""Lease-mode views and resolvers for tests/protocol/: test_lease, test_recovery, test_tasks.

The business effect is an ``Order`` whose ``sku`` carries the idempotency key,
so a resolver can tell whether the first attempt made it.
"""

from __future__ import annotations

import json
import time

from django.urls import path
from rest_framework import generics, serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from idempotency import (
    IdempotencyRecord,
    IdempotentCreateMixin,
    Resolution,
    StoredResponse,
    idempotent,
)

from .models import Order

LEASE_OPERATION = "tests.lease_order"
CLASS_OPERATION = "tests.lease_class_order"
WAITING_OPERATION = "tests.waiting_lease_order"
STEP_OPERATION = "tests.lease_step_key"

# Each step key step_key_view handed out, in order: a failed attempt never answers with its
# key, and the test compares what the view got, not a derivation of its own.
handed_out: list[str] = []


def sku_for(key: str) -> str:
    return f"k:{key}"[:64]


def order_resolver(record: IdempotencyRecord) -> Resolution:
    """Done if the Order for the record's key exists, with the response the view gives."""
    order = Order.objects.filter(sku=sku_for(record.idem_key)).first()
    if order is None:
        return Resolution.not_done()
    body = json.dumps({"id": order.pk}).encode()
    return Resolution.done(
        order.pk, StoredResponse(201, [("Content-Type", "application/json")], body)
    )


def unknown_resolver(record: IdempotencyRecord) -> Resolution:
    return Resolution.unknown()


@api_view(["POST"])
@idempotent(operation=LEASE_OPERATION, mode="lease", lease_seconds=30, resolver=order_resolver)
def lease_order(request: Request) -> Response:
    return _order(request)


@api_view(["POST"])
@idempotent(
    operation=WAITING_OPERATION,
    mode="lease",
    lease_seconds=30,
    resolver=order_resolver,
    wait_seconds=5,
)
def waiting_lease_order(request: Request) -> Response:
    """``lease_order`` whose duplicates wait up to 5 s for its outcome."""
    return _order(request)


def _order(request: Request) -> Response:
    """Control by headers, which are not part of the fingerprint: X-Sleep, X-Fail, X-Reject."""
    time.sleep(float(request.headers.get("X-Sleep", 0)))
    if request.headers.get("X-Fail"):
        raise RuntimeError("the provider timed out")
    if request.headers.get("X-Reject"):
        return Response({"error": "rejected"}, status=400)  # not recorded: the key is free
    key = request.idempotency.operation.key  # type: ignore[attr-defined]
    order = Order.objects.create(owner=request.user, sku=sku_for(key), quantity=1)
    return Response({"id": order.pk}, status=201)


@api_view(["POST"])
@idempotent(operation=STEP_OPERATION, mode="lease", lease_seconds=30)
def step_key_view(request: Request) -> Response:
    """Takes the step key a provider call would send; X-Fail fails the attempt after that."""
    key = request.idempotency.step_key("charge")  # type: ignore[attr-defined]
    handed_out.append(key)
    if request.headers.get("X-Fail"):
        raise RuntimeError("the worker failed after the provider answered")
    return Response({"charge_key": key}, status=201)


class OrderSerializer(serializers.ModelSerializer):
    class Meta:
        model = Order
        fields = ["id", "sku", "quantity"]
        read_only_fields = ["sku", "quantity"]


class LeaseOrderCreateView(IdempotentCreateMixin, generics.CreateAPIView):
    """The mixin's resolver: a plain function on the class, registered for recovery."""

    serializer_class = OrderSerializer
    idempotency_operation = CLASS_OPERATION
    idempotency_mode = "lease"
    idempotency_resolver = order_resolver

    def perform_create(self, serializer: OrderSerializer) -> None:
        key = self.request.idempotency.operation.key  # type: ignore[attr-defined]
        serializer.save(owner=self.request.user, sku=sku_for(key), quantity=1)


urlpatterns = [
    path("orders/", lease_order),
    path("waiting-orders/", waiting_lease_order),
    path("class-orders/", LeaseOrderCreateView.as_view()),
    path("step-key/", step_key_view),
]
