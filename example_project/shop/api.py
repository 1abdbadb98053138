"""The shop's orders as a django-ninja API at ``/ninja/``, next to the DRF one at ``/api/``.

``POST /ninja/orders`` is a sync operation and ``POST /ninja/async/orders`` an async one;
both need an ``Idempotency-Key`` header, like ``POST /api/orders/``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from django.contrib.auth import authenticate
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import HttpError
from ninja.parser import Parser
from ninja.security import HttpBasicAuth, django_auth
from pydantic import AfterValidator, Field

from example_project.shop.models import Order
from idempotency.ninja import answer_outages, idempotent


class BasicAuth(HttpBasicAuth):
    def authenticate(self, request: HttpRequest, username: str, password: str) -> object:
        return authenticate(request, username=username, password=password)


class MediaTypeUnsupported(Exception):
    """A body that is not declared as JSON: answered 415, as DRF's parsers do."""


class JSONParser(Parser):
    def parse_body(self, request: HttpRequest) -> Any:
        media_type = request.content_type or ""
        if media_type != "application/json" and not media_type.endswith("+json"):
            raise MediaTypeUnsupported(media_type)
        return super().parse_body(request)


api = NinjaAPI(
    title="Shop (django-ninja)",
    version="1.0.0",
    urls_namespace="ninja",
    auth=[BasicAuth(), django_auth],
    parser=JSONParser(),
)
# A database outage in any operation (authentication included) is a 503 with Retry-After.
answer_outages(api)


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # Ninja reports every parser error as 400 "Cannot parse request body"; the cause says more.
    if isinstance(exc.__cause__, MediaTypeUnsupported):
        detail = (
            f'Unsupported media type "{exc.__cause__}" in request: '
            "send the body as JSON, with Content-Type: application/json."
        )
        return api.create_response(request, {"detail": detail}, status=415)
    return api.create_response(request, {"detail": str(exc)}, status=exc.status_code)


def no_null_characters(value: str) -> str:
    # PostgreSQL text cannot hold NUL: refused here (422), as DRF's CharField does (400).
    if "\x00" in value:
        raise ValueError("Null characters are not allowed.")
    return value


Text = Annotated[str, AfterValidator(no_null_characters)]


class OrderIn(Schema):
    sku: Text = Field(min_length=1, max_length=64)
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
