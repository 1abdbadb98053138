from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

# URL name -> what it does; the root page lists them.
ENDPOINTS = {
    "order-list": "Orders of the caller. POST needs an Idempotency-Key header.",
    "payment-callback": "Payment provider callback, signed with X-Signature.",
    "report-list": 'Reports of the caller (lease mode). POST {"seconds": 0..30} with a key.',
    "schema": "OpenAPI schema of the DRF API (drf-spectacular).",
    "ninja:orders": "Orders through django-ninja. POST needs an Idempotency-Key header.",
    "ninja:async-orders": "POST: the same, served by an async ninja operation.",
    "ninja:openapi-json": "OpenAPI schema of the ninja API.",
    "partner-orders": "A plain Django view: POST with a partner token and an Idempotency-Key.",
    "admin:index": "Django admin.",
}


@extend_schema(responses=OpenApiTypes.OBJECT)
@api_view(["GET"])
@permission_classes([AllowAny])
def api_root(request: Request) -> Response:
    return Response(
        {
            name: {"url": reverse(name, request=request), "description": description}
            for name, description in ENDPOINTS.items()
        }
    )
