"""A tenant's purchase, protected: written in whichever schema the request's tenant has."""

from __future__ import annotations

import time

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from idempotency import idempotent
from tests.deployment.shop.models import Purchase


def _purchase(request: HttpRequest) -> JsonResponse:
    time.sleep(float(request.headers.get("X-Pause", "0")))  # so that duplicates overlap
    purchase = Purchase.objects.create(
        sku=request.headers.get("X-Sku", "sku"), buyer_id=request.user.pk
    )
    return JsonResponse({"id": purchase.pk, "sku": purchase.sku}, status=201)


@csrf_exempt
@idempotent(operation="purchases.create")
def create_purchase(request: HttpRequest) -> JsonResponse:
    return _purchase(request)


@csrf_exempt
@idempotent(operation="purchases.create-leased", mode="lease", wait_seconds=10)
def create_purchase_leased(request: HttpRequest) -> JsonResponse:
    return _purchase(request)


def same_scope(request: HttpRequest, operation: str) -> str:
    """A scope that names no tenant: the schemas alone must keep tenants apart."""
    return f"everyone:{operation}"


@csrf_exempt
@idempotent(operation="purchases.create-shared-scope", scope=same_scope)
def create_purchase_shared_scope(request: HttpRequest) -> JsonResponse:
    return _purchase(request)


@csrf_exempt
@idempotent(
    operation="purchases.create-shared-scope-leased",
    scope=same_scope,
    mode="lease",
    wait_seconds=10,
)
def create_purchase_shared_scope_leased(request: HttpRequest) -> JsonResponse:
    return _purchase(request)
