"""A ninja API with protected operations, served by ``tests/support/ninja_urls.py``."""

from __future__ import annotations

import time

from django.contrib.auth import authenticate
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI, Router, Schema
from ninja.errors import HttpError
from ninja.responses import Status as Reply
from ninja.security import HttpBasicAuth, django_auth
from pydantic import Field

from idempotency import Status, mark_final
from idempotency.ninja import idempotent

from .models import Order


class BasicAuth(HttpBasicAuth):
    def authenticate(self, request: HttpRequest, username: str, password: str):
        return authenticate(request, username=username, password=password)


api = NinjaAPI(urls_namespace="tests-ninja", auth=[BasicAuth(), django_auth])


class OrderIn(Schema):
    sku: str = Field(max_length=64)
    quantity: int = Field(ge=1, le=10_000)


class OrderOut(Schema):
    id: int
    sku: str
    quantity: int


@api.get("/orders", response=list[OrderOut])
def list_orders(request: HttpRequest):
    return Order.objects.filter(owner=request.auth)


@api.post("/orders", response={201: OrderOut})
@idempotent()
def create_order(
    request: HttpRequest, payload: OrderIn, response: HttpResponse, sleep: float = 0, fail: str = ""
):
    """Creates an order of the caller."""
    order = Order.objects.create(owner=request.auth, sku=payload.sku, quantity=payload.quantity)
    response["Location"] = f"/ninja/orders/{order.pk}"
    response.set_cookie("session", "secret")
    if sleep:
        time.sleep(sleep)
    if fail == "404":
        raise HttpError(404, "no such thing")
    if fail == "crash":
        raise RuntimeError("business failure after the write")
    return order


def final_402(response):
    return Status.FAILED_FINAL if response.status_code == 402 else None


@api.post("/charges", response={200: dict, 402: dict})
@idempotent(key=lambda request: request.headers.get("X-Charge-Id"), outcome_policy=final_402)
def charge(request: HttpRequest, amount: int):
    order = Order.objects.create(owner=request.auth, sku="charge", quantity=max(amount, 1))
    if amount > 1000:
        return Reply(402, {"error": "insufficient_funds"})
    return {"id": order.pk, "amount": amount}


@api.post("/final", response={402: dict})
@idempotent(required=False)
def always_final(request: HttpRequest):
    Order.objects.create(owner=request.auth, sku="final", quantity=1)
    return mark_final(api.create_response(request, {"error": "declined"}, status=402))


@api.post("/lease", response={201: OrderOut})
@idempotent(mode="lease", header="X-Request-Id")
def create_in_lease_mode(request: HttpRequest, payload: OrderIn, fail: str = ""):
    order = Order.objects.create(owner=request.auth, sku=payload.sku, quantity=payload.quantity)
    if fail == "404":
        raise HttpError(404, "no such thing")
    return order


@api.post("/async/orders", response={201: OrderOut})
@idempotent(operation="orders.create-async")
async def create_order_async(request: HttpRequest, payload: OrderIn, fail: str = ""):
    order = await Order.objects.acreate(
        owner=request.auth, sku=payload.sku, quantity=payload.quantity
    )
    if fail == "404":
        raise HttpError(404, "no such thing")
    if fail == "crash":
        raise RuntimeError("business failure after the write")
    return order


@api.post("/async/lease", response={201: OrderOut})
@idempotent(mode="lease")
async def create_order_async_in_lease_mode(request: HttpRequest, payload: OrderIn, fail: str = ""):
    order = await Order.objects.acreate(
        owner=request.auth, sku=payload.sku, quantity=payload.quantity
    )
    if fail == "404":
        raise HttpError(404, "no such thing")
    return order


router = Router()


@router.put("/orders/{order_id}", response=OrderOut)
@idempotent(operation="orders.replace")
def replace_order(request: HttpRequest, order_id: int, payload: OrderIn):
    order = Order.objects.get(pk=order_id, owner=request.auth)
    order.sku, order.quantity = payload.sku, payload.quantity
    order.save()
    return order


api.add_router("/routed", router)
