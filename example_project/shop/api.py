"""The shop's orders as a django-ninja API at ``/ninja/``, next to the DRF one at ``/api/``.

``POST /ninja/orders`` is a sync operation and ``POST /ninja/async/orders`` an async one;
both need an ``Idempotency-Key`` header, like ``POST /api/orders/``.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth import authenticate
from django.http import HttpRequest
from ninja import NinjaAPI, Schema
from ninja.security import HttpBasicAuth, django_auth
from pydantic import Field

from example_project.shop.models import Order
from idempotency.ninja import answer_outages, idempotent


class BasicAuth(HttpBasicAuth):
    def authenticate(self, request: HttpRequest, username: str, password: str) -> object:
        return authenticate(request, username=username, password=password)


api = NinjaAPI(
    title="Shop (django-ninja)",
    version="1.0.0",
    urls_namespace="ninja",
    auth=[BasicAuth(), django_auth],
)
# A database outage in any operation (authentication included) is a 503 with Retry-After.
answer_outages(api)


class OrderIn(Schema):
    sku: str = Field(min_length=1, max_length=64)
    quantity: int = Field(ge=1, le=10_000)


class OrderOut(Schema):
    id: int
    sku: str
    quantity: int
    status: str
    created_at: datetime


@api.get("/orders", response=list[OrderOut], url_name="orders")
def list_orders(request: HttpRequest) -> object:
    return Order.objects.filter(owner_id=request.auth.pk)  # type: ignore[attr-defined]


@api.post("/orders", response={201: OrderOut})
@idempotent(operation="ninja.orders.create")
def create_order(request: HttpRequest, payload: OrderIn) -> object:
    return Order.objects.create(owner=request.auth, **payload.model_dump())


@api.post("/async/orders", response={201: OrderOut}, url_name="async-orders")
@idempotent(operation="ninja.orders.create-async")
async def create_order_async(request: HttpRequest, payload: OrderIn) -> object:
    return await Order.objects.acreate(owner=request.auth, **payload.model_dump())
