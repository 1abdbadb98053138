import json
import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from idempotency import IdempotentCreateMixin, idempotent, mark_final

from .models import Order


class OrderSerializer(serializers.ModelSerializer):
    quantity = serializers.IntegerField(min_value=1)

    class Meta:
        model = Order
        fields = ["id", "sku", "quantity", "paid"]


class OrderViewSet(IdempotentCreateMixin, viewsets.ModelViewSet):
    serializer_class = OrderSerializer

    def get_queryset(self):
        return Order.objects.filter(owner=self.request.user)

    def perform_create(self, serializer):
        delay = float(self.request.query_params.get("sleep", 0))
        serializer.save(owner=self.request.user)
        if delay:
            time.sleep(delay)
        if self.request.query_params.get("fail"):
            raise RuntimeError("business failure after the write")

    def get_success_headers(self, data):
        return {"Location": f"/orders/{data['id']}/", "Set-Cookie": "session=secret"}


class OptionalKeyOrderViewSet(OrderViewSet):
    idempotency_required = False


@api_view(["POST"])
@idempotent()
def charge(request: Request) -> Response:
    amount = int(request.data.get("amount", 0))
    order = Order.objects.create(owner=request.user, sku="charge", quantity=max(amount, 1))
    if amount > 1000:
        return mark_final(
            Response({"error": "insufficient_funds"}, status=status.HTTP_402_PAYMENT_REQUIRED)
        )
    if amount == 0:
        return Response({"error": "amount required"}, status=status.HTTP_400_BAD_REQUEST)
    return Response({"id": order.pk, "amount": amount}, status=status.HTTP_201_CREATED)


@api_view(["POST"])
@permission_classes([AllowAny])
@idempotent(
    key=lambda request: f"{request.data.get('provider')}:{request.data.get('ref')}",
    scope=lambda request, operation: f"provider:{request.data.get('provider')}",
)
def webhook(request: Request) -> Response:
    Order.objects.filter(pk=request.data.get("order_id")).update(paid=True)
    return Response({"ok": True})


@idempotent()
def plain_view(request: HttpRequest) -> HttpResponse:
    payload = json.loads(request.body or b"{}")
    order = Order.objects.create(owner=request.user, sku=payload.get("sku", "plain"), quantity=1)
    response = JsonResponse({"id": order.pk}, status=201)
    response.set_cookie("tracking", "secret")
    return response


@api_view(["POST"])
@idempotent()
def big(request: Request) -> Response:
    Order.objects.create(owner=request.user, sku="big", quantity=1)
    return Response({"blob": "x" * int(request.data.get("size", 10))}, status=201)


@api_view(["POST"])
@idempotent()
def flaky(request: Request) -> Response:
    """Answers the status named by ``X-Test-Status`` (a header: not in the fingerprint)."""
    order = Order.objects.create(owner=request.user, sku="flaky", quantity=1)
    return Response({"id": order.pk}, status=int(request.headers.get("X-Test-Status", 201)))
