"""Views whose database connection dies under them, for tests/protocol/test_outage.py.

``X-Break: auth`` kills the connection in authentication (DRF's or ninja's, which
run before the protected code), ``X-Break: before`` before the view's write and
``X-Break: after`` after it; ``X-Break: timeout-after`` runs a statement past its
timeout after the write (the connection survives that one). The connection is
killed by the database server itself (``pg_terminate_backend`` / ``KILL CONNECTION``):
the failing statement is real.
"""

from __future__ import annotations

import json

from asgiref.sync import sync_to_async
from django.contrib.auth import authenticate
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from ninja import NinjaAPI
from ninja.responses import Status as Reply
from ninja.security import HttpBasicAuth
from rest_framework import viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from idempotency import IdempotentCreateMixin, idempotent
from idempotency.ninja import answer_outages
from idempotency.ninja import idempotent as ninja_idempotent

from .models import Order
from .views import OrderSerializer


def kill_own_connection() -> None:
    """The database server ends this connection; the statement that asked fails."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        else:
            cursor.execute("KILL CONNECTION CONNECTION_ID()")


def time_out() -> None:
    """A statement that runs past its timeout: the database cancels it (the connection lives)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL statement_timeout = 50")
            cursor.execute("SELECT pg_sleep(2)")
        else:
            cursor.execute("SET STATEMENT max_statement_time = 0.05 FOR SELECT SLEEP(2)")


def _break_at(request: HttpRequest | Request, point: str) -> None:
    if request.headers.get("X-Break") == point:
        kill_own_connection()
    elif request.headers.get("X-Break") == f"timeout-{point}":
        time_out()


class BreakingAuthentication(SessionAuthentication):
    def authenticate(self, request: Request):  # type: ignore[no-untyped-def]
        _break_at(request, "auth")
        return super().authenticate(request)

    def enforce_csrf(self, request: Request) -> None:
        return None


class OrderViewSet(IdempotentCreateMixin, viewsets.ModelViewSet):
    serializer_class = OrderSerializer
    authentication_classes = [BreakingAuthentication]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return Order.objects.filter(owner=self.request.user)

    def perform_create(self, serializer):  # type: ignore[no-untyped-def]
        _break_at(self.request, "before")
        serializer.save(owner=self.request.user)
        _break_at(self.request, "after")


class LeaseOrderViewSet(OrderViewSet):
    idempotency_mode = "lease"
    idempotency_lease_seconds = 30


def _create(request: HttpRequest | Request, sku: str) -> Order:
    _break_at(request, "before")
    order = Order.objects.create(owner=request.user, sku=sku, quantity=1)
    _break_at(request, "after")
    return order


@api_view(["POST"])
@idempotent(operation="outage.charge")
def charge(request: Request) -> Response:
    return Response({"id": _create(request, "outage-charge").pk}, status=201)


@idempotent(operation="outage.plain")
def plain(request: HttpRequest) -> HttpResponse:
    sku = json.loads(request.body or b"{}").get("sku", "outage-plain")
    return JsonResponse({"id": _create(request, sku).pk}, status=201)


@idempotent(operation="outage.async")
async def async_plain(request: HttpRequest) -> HttpResponse:
    sku = json.loads(request.body or b"{}").get("sku", "outage-async")
    order = await sync_to_async(_create)(request, sku)
    return JsonResponse({"id": order.pk}, status=201)


class BreakingBasicAuth(HttpBasicAuth):
    def authenticate(self, request: HttpRequest, username: str, password: str):  # type: ignore[no-untyped-def]
        _break_at(request, "auth")
        return authenticate(request, username=username, password=password)


ninja_api = NinjaAPI(urls_namespace="outage-ninja", auth=[BreakingBasicAuth()])


def _ninja_create(request: HttpRequest, sku: str) -> dict[str, int]:
    request.user = request.auth  # type: ignore[attr-defined]
    return {"id": _create(request, sku).pk}


@ninja_api.post("/orders", response={201: dict})
@ninja_idempotent(operation="outage.ninja")
def ninja_order(request: HttpRequest) -> Reply:
    return Reply(201, _ninja_create(request, "outage-ninja"))


@ninja_api.post("/async/orders", response={201: dict})
@ninja_idempotent(operation="outage.ninja-async")
async def ninja_async_order(request: HttpRequest) -> Reply:
    return Reply(201, await sync_to_async(_ninja_create)(request, "outage-ninja-async"))


# Answers outages in any of its operations, protected or not (``answer_outages``).
handled_api = NinjaAPI(urls_namespace="outage-ninja-handled", auth=[BreakingBasicAuth()])
answer_outages(handled_api)


@handled_api.get("/orders", response=list[dict])
def ninja_list(request: HttpRequest) -> list[dict[str, int]]:
    return [{"id": order.pk} for order in Order.objects.filter(owner=request.auth)]


router = SimpleRouter()
router.register("orders", OrderViewSet, basename="outage-order")
router.register("lease-orders", LeaseOrderViewSet, basename="outage-lease-order")

urlpatterns = [
    *router.urls,
    path("charge/", charge),
    path("plain/", plain),
    path("async/", async_plain),
    path("ninja/", ninja_api.urls),
    path("ninja-handled/", handled_api.urls),
]
