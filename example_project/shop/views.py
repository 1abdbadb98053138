from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.decorators import (
    action,
    api_view,
    authentication_classes,
    permission_classes,
)
from rest_framework.exceptions import APIException, NotFound
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from example_project.shop.authentication import PaymentSignatureAuthentication
from example_project.shop.models import Order, Receipt
from example_project.shop.payments import record_payment
from example_project.shop.serializers import (
    OrderSerializer,
    PaymentCallbackSerializer,
    ReceiptSerializer,
    TradeSerializer,
)
from example_project.shop.tasks import issue_receipt
from idempotency import IdempotentCreateMixin, idempotent


class OrderViewSet(IdempotentCreateMixin, viewsets.ModelViewSet):
    """The caller's orders. `POST` needs an `Idempotency-Key` header.

    Send a new key (a UUID) for each order you mean to place, and the same key again
    when you retry it: the retry gets the first response back, with
    `Idempotent-Replayed: true`, and no second order is made.
    """

    serializer_class = OrderSerializer

    def get_queryset(self) -> QuerySet[Order]:
        return Order.objects.filter(owner_id=self.request.user.pk)

    def perform_create(self, serializer: BaseSerializer[Order]) -> None:
        serializer.save(owner=self.request.user)

    def perform_destroy(self, instance: Order) -> None:
        if instance.status == Order.Status.PAID:
            raise OrderPaid()
        instance.delete()

    @extend_schema(methods=["GET"], responses=ReceiptSerializer)
    @extend_schema(
        methods=["POST"],
        request=None,
        responses={
            202: inline_serializer(
                "ReceiptRequested",
                {"order": serializers.IntegerField(), "task_id": serializers.CharField()},
            )
        },
    )
    @action(detail=True, methods=["get", "post"])
    # Atomic whatever MODE says: the enqueue below commits with the record, or not at all.
    @idempotent(mode="atomic")
    def receipt(self, request: Request, pk: str | None = None) -> Response:
        """`POST` (with an `Idempotency-Key`) asks for the order's receipt: a task, which
        `manage.py db_worker` runs, issues it. `GET` shows it once issued.

        A retry with the same key gets the first answer back and enqueues nothing; a new
        key enqueues a task again, which finds the receipt issued: one receipt per order.
        """
        order = self.get_object()
        if request.method == "GET":
            receipt = Receipt.objects.filter(order=order).first()
            if receipt is None:
                raise NotFound("No receipt yet: POST here to ask for one; a worker issues it.")
            return Response(ReceiptSerializer(receipt).data)
        # A row of this database, in the view's transaction: a request that fails after
        # this line, or a duplicate that loses, rolls its task back with its record.
        result = issue_receipt.enqueue(order.pk)
        return Response({"order": order.pk, "task_id": str(result.id)}, status=202)


class OrderPaid(APIException):
    status_code = 409
    default_detail = "A paid order cannot be deleted."
    default_code = "order_paid"


def _trade(request: Request) -> dict[str, str]:
    # Invalid key fields answer 400 before any idempotency record is written.
    trade = TradeSerializer(data=request.data)
    trade.is_valid(raise_exception=True)
    return trade.validated_data  # type: ignore[return-value]


def trade_key(request: Request) -> str:
    trade = _trade(request)
    return f"{trade['provider']}:{trade['trade_no']}"


def provider_scope(request: Request, operation: str) -> str:
    return f"payments:{_trade(request)['provider']}"


@extend_schema(
    request=PaymentCallbackSerializer,
    responses=inline_serializer(
        "PaymentResult",
        {"order_id": serializers.IntegerField(), "status": serializers.CharField()},
    ),
)
@api_view(["POST"])
@authentication_classes([PaymentSignatureAuthentication])
@permission_classes([IsAuthenticated])
@idempotent(key=trade_key, scope=provider_scope)
def payment_callback(request: Request) -> Response:
    """A provider's notice that a trade paid an order; providers re-send until they get 2xx."""
    callback = PaymentCallbackSerializer(data=request.data)
    callback.is_valid(raise_exception=True)
    order = record_payment(**callback.validated_data)
    return Response({"order_id": order.pk, "status": order.status})
