"""DRF views for tests/unit/test_drf.py: the browsable API and lease mode under ATOMIC_REQUESTS."""

from __future__ import annotations

from django.db import transaction
from django.urls import path
from rest_framework.decorators import api_view
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from idempotency import idempotent
from idempotency.drf import IdempotentBrowsableAPIRenderer

from .models import Order
from .views import OrderViewSet


class BrowsableOrderViewSet(OrderViewSet):
    renderer_classes = [JSONRenderer, IdempotentBrowsableAPIRenderer]


def create_order(request: Request) -> Response:
    order = Order.objects.create(owner=request.user, sku="lease", quantity=1)
    return Response({"id": order.pk}, status=201)


# Two views of their own: non_atomic_requests marks the function it is given.
lease_order = api_view(["POST"])(idempotent(mode="lease")(create_order))
non_atomic_lease_order = transaction.non_atomic_requests(
    api_view(["POST"])(idempotent(mode="lease")(create_order))
)

router = SimpleRouter()
router.register("browsable-orders", BrowsableOrderViewSet, basename="browsable-order")

urlpatterns = [
    *router.urls,
    path("lease-orders/", lease_order),
    path("non-atomic-lease-orders/", non_atomic_lease_order),
]
