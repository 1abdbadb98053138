"""Async views for tests/protocol/test_async.py, served by uvicorn and by Django's AsyncClient.

Control by headers, which are not part of the fingerprint: ``X-Sleep`` (seconds, after
the write), ``X-Status`` (the status answered after the write) and ``X-Fail`` (raise
after the write).
"""

from __future__ import annotations

import asyncio
import json

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views import View

from idempotency import idempotent

from .models import Order


async def _create_order(request: HttpRequest) -> HttpResponse:
    payload = json.loads(request.body or b"{}")
    owner = await sync_to_async(lambda: request.user.pk)()
    order = await Order.objects.acreate(
        owner_id=owner, sku=payload.get("sku", "async"), quantity=payload.get("quantity", 1)
    )
    await asyncio.sleep(float(request.headers.get("X-Sleep", 0)))
    if request.headers.get("X-Fail"):
        raise RuntimeError("business failure after the write")
    return JsonResponse({"id": order.pk}, status=int(request.headers.get("X-Status", 201)))


@idempotent(operation="tests.async_order")
async def async_order(request: HttpRequest) -> HttpResponse:
    return await _create_order(request)


@idempotent(operation="tests.async_lease_order", mode="lease", lease_seconds=30)
async def async_lease_order(request: HttpRequest) -> HttpResponse:
    return await _create_order(request)


class AsyncOrderView(View):
    async def get(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse({"orders": await Order.objects.acount()})

    @idempotent(operation="tests.async_class_order")
    async def post(self, request: HttpRequest) -> HttpResponse:
        return await _create_order(request)


# What csrf_exempt does, also on Django 4.2 (whose csrf_exempt cannot wrap async views):
# the tests authenticate with a session cookie and post JSON without a CSRF token.
for view in (async_order, async_lease_order):
    view.csrf_exempt = True  # type: ignore[attr-defined]
async_class_order = AsyncOrderView.as_view()
async_class_order.csrf_exempt = True  # type: ignore[attr-defined]

urlpatterns = [
    path("orders/", async_order),
    path("lease-orders/", async_lease_order),
    path("class-orders/", async_class_order),
]
