"""Views that only the schema tests serve (``tests/support/spectacular_urls.py``); never called."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency import idempotent

from .views import OrderViewSet


class Empty(serializers.Serializer):
    pass


class KeyFromBodyOrderViewSet(OrderViewSet):
    def get_idempotency_key(self, request: Request) -> str | None:
        return str(request.data.get("ref"))


class PayableOrderViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = OrderViewSet.serializer_class

    @extend_schema(
        request=Empty,
        responses=Empty,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                {"type": "string", "maxLength": 255},
                OpenApiParameter.HEADER,
                required=True,
                description="One per payment intent.",
            )
        ],
    )
    @action(detail=True, methods=["post"])
    @idempotent()
    def pay(self, request: Request, pk: str) -> Response:
        return Response({})


class RefundView(APIView):
    @extend_schema(responses=Empty)
    def get(self, request: Request) -> Response:
        return Response({})

    @extend_schema(request=Empty, responses={201: Empty})
    @idempotent(header="X-Request-Id", required=False)
    def post(self, request: Request) -> Response:
        return Response({}, status=201)


@extend_schema(request=Empty, responses=Empty)
@api_view(["GET", "POST"])
@idempotent()
def transfer(request: Request) -> Response:
    return Response({})
