"""One operation of each kind a project declares, for check idempotency.W009.

Each is named here as its entry point names it: what ``OPERATION_RETENTION`` and
``RESOLVERS`` may say.
"""

from __future__ import annotations

from celery import shared_task
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from ninja import NinjaAPI
from rest_framework import routers, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency import IdempotentCreateMixin, IdempotentMixin, idempotent, idempotent_function
from idempotency.celery import IdempotentTask
from idempotency.django_tasks import idempotent_task
from idempotency.ninja import idempotent as ninja_idempotent

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]

MODULE = __name__


@idempotent
def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=201)


@idempotent(operation="operations.renamed")
def renamed(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=201)


@api_view(["POST"])
@idempotent
def drf_function(request: Request) -> Response:
    return Response(status=201)


class Orders(IdempotentCreateMixin, viewsets.ViewSet):
    def create(self, request: Request) -> Response:
        return Response(status=201)


class Shipments(IdempotentMixin, viewsets.ViewSet):
    """Protects an action of its own: its operation is named by the action the URL serves."""

    @action(detail=True, methods=["post"])
    def dispatch_now(self, request: Request, pk: str) -> Response:
        return self.run_idempotently(request, lambda: Response(status=201))


class Refunds(IdempotentMixin, APIView):
    def post(self, request: Request) -> Response:
        return self.run_idempotently(request, lambda: Response(status=201))


api = NinjaAPI(urls_namespace="operations-ninja")


@api.post("/transfers")
@ninja_idempotent
def transfer(request: HttpRequest) -> dict[str, int]:
    return {"id": 1}


@idempotent_function(scope="consumers", key=lambda event: event["id"])
def consume(event: dict[str, str]) -> None:
    pass


@shared_task(base=IdempotentTask, name="tests.operations.ship", idempotency_key=lambda order: order)
def ship(order: str) -> None:
    pass


@task()
@idempotent_task(key=lambda order: order)
def invoice(order: str) -> None:
    pass


router = routers.SimpleRouter()
router.register("shipments", Shipments, basename="shipment")

urlpatterns = [
    path("plain/", plain),
    path("renamed/", renamed),
    path("drf-function/", drf_function),
    path("orders/", Orders.as_view({"post": "create"})),
    path("refunds/", Refunds.as_view()),
    path("ninja/", api.urls),
    path("", include(router.urls)),
]

DECLARED = [
    f"{MODULE}.plain",
    "operations.renamed",
    f"{MODULE}.drf_function",
    f"{MODULE}.Orders.create",
    f"{MODULE}.Shipments.dispatch_now",
    f"{MODULE}.Refunds.post",
    f"{MODULE}.transfer",
    f"{MODULE}.consume",
    "tests.operations.ship",
    f"{MODULE}.invoice",
]
