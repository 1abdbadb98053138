"""A URLconf of lease-mode views, some outside ATOMIC_REQUESTS, for the E031 check."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path
from ninja import NinjaAPI
from rest_framework import viewsets
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from idempotency import IdempotentCreateMixin, idempotent
from idempotency.ninja import idempotent as ninja_idempotent


@idempotent(mode="lease")
def plain_lease(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=201)


@transaction.non_atomic_requests
@idempotent(mode="lease")
def plain_lease_outside(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=201)


@idempotent
def plain_atomic(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=201)


@api_view(["POST"])
@idempotent(mode="lease")
def drf_lease(request: Request) -> Response:
    return Response(status=201)


class LeaseViewSet(IdempotentCreateMixin, viewsets.ViewSet):
    idempotency_mode = "lease"

    def create(self, request: Request) -> Response:
        return Response(status=201)


api = NinjaAPI(urls_namespace="check-ninja")


@api.post("/lease")
@ninja_idempotent(mode="lease")
def ninja_lease(request: HttpRequest) -> dict[str, int]:
    return {"id": 1}


urlpatterns = [
    path("plain/", plain_lease),
    path("plain-outside/", plain_lease_outside),
    path("plain-atomic/", plain_atomic),
    path("drf/", drf_lease),
    path("viewset/", LeaseViewSet.as_view({"post": "create"})),
    path("ninja/", api.urls),
]
