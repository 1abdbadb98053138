"""Views of the tenant deployments: an order written where the router says, and mistakes."""

from __future__ import annotations

import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from idempotency import idempotent
from tests.testapp.models import Order


def _order(request: HttpRequest, using: str | None = None) -> JsonResponse:
    time.sleep(float(request.headers.get("X-Pause", "0")))  # so that duplicates overlap
    order = Order.objects.db_manager(using).create(
        owner_id=request.user.pk, sku=request.headers.get("X-Sku", "sku"), quantity=1
    )
    return JsonResponse({"id": order.pk, "sku": order.sku}, status=201)


@csrf_exempt
@idempotent(operation="orders.create")
def create_order(request: HttpRequest) -> JsonResponse:
    return _order(request)


@csrf_exempt
@idempotent(operation="orders.create-leased", mode="lease", wait_seconds=5)
def create_order_leased(request: HttpRequest) -> JsonResponse:
    return _order(request)


@csrf_exempt
@idempotent(operation="orders.create-elsewhere")
def create_order_elsewhere(request: HttpRequest) -> HttpResponse:
    """Writes to tenant_b whatever the router says: a mistake in atomic mode."""
    return _order(request, using="tenant_b")


@csrf_exempt
@idempotent(operation="orders.create-in-b", using="tenant_b")
def create_order_in_b(request: HttpRequest) -> HttpResponse:
    """Writes to tenant_b and says so: its records follow."""
    return _order(request, using="tenant_b")
