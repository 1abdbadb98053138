"""A plain, synchronous Django view taking JSON or a form; the async ones come from
tests/testapp/async_views.py."""

import json

from django.http import HttpRequest, HttpResponse, JsonResponse

from idempotency import idempotent
from tests.testapp.models import Order


@idempotent(operation="nodrf.order")
def order(request: HttpRequest) -> HttpResponse:
    form = request.content_type == "application/x-www-form-urlencoded"
    payload = request.POST if form else json.loads(request.body or b"{}")
    created = Order.objects.create(
        owner=request.user, sku=payload.get("sku", "plain"), quantity=payload.get("quantity", 1)
    )
    return JsonResponse({"id": created.pk}, status=int(request.headers.get("X-Status", 201)))
