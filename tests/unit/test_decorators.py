"""``@idempotent`` put where it cannot protect anything: refused at import, with the fix."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import RequestFactory, override_settings
from django.views import View
from ninja import NinjaAPI
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from idempotency import idempotent
from idempotency.models import IdempotencyRecord
from idempotency.ninja import idempotent as ninja_idempotent
from tests.support.factories import UserFactory


@idempotent
def bare(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"n": IdempotencyRecord.objects.count()}, status=201)


def _post(view, key: str = "k-1"):
    request = RequestFactory().post(
        "/bare/", json.dumps({"a": 1}), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )
    request.user = UserFactory.build(pk=1, id=1)  # one caller: one scope
    return view(request)


@pytest.mark.django_db
def test_without_parentheses_it_protects_with_the_settings():
    first = _post(bare)
    again = _post(bare)
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert bare.idempotency_options.mode is None  # type: ignore[attr-defined]


def test_options_must_be_given_by_keyword():
    with pytest.raises(TypeError, match=r"by keyword.*@idempotent\(\)"):
        idempotent("orders.create")  # type: ignore[call-overload]


def test_above_api_view_names_the_order_to_use():
    @api_view(["POST"])
    def create(request: Request) -> Response:
        return Response(status=201)

    with pytest.raises(ImproperlyConfigured, match="Put @idempotent under @api_view") as refused:
        idempotent()(create)
    # The user's function, not the view Django's View.as_view makes of it.
    assert f"({__name__}.test_above_api_view_names_the_order_to_use.<locals>.create)" in str(
        refused.value
    )
    assert "as_view" not in str(refused.value)


def test_above_api_view_and_other_drf_decorators_names_the_function():
    from rest_framework.decorators import permission_classes
    from rest_framework.permissions import AllowAny

    @api_view(["PUT", "POST"])
    @permission_classes([AllowAny])
    def upsert(request: Request) -> Response:
        return Response(status=201)

    with pytest.raises(ImproperlyConfigured, match=r"<locals>\.upsert\): above it"):
        idempotent(operation="upsert")(upsert)


def test_on_a_viewset_names_the_mixin():
    from rest_framework import viewsets

    class Orders(viewsets.ViewSet):
        def create(self, request: Request) -> Response:
            return Response(status=201)

    with pytest.raises(ImproperlyConfigured, match="IdempotentCreateMixin"):
        idempotent()(Orders.as_view({"post": "create"}))


def test_on_a_class_based_view_names_the_handler_to_decorate():
    class Orders(View):
        def post(self, request: HttpRequest) -> HttpResponse:
            return HttpResponse(status=201)

    with pytest.raises(ImproperlyConfigured, match="decorate the handler.*method_decorator"):
        idempotent()(Orders.as_view())


def test_the_django_decorator_under_a_ninja_route_says_to_use_the_ninja_one():
    api = NinjaAPI(urls_namespace="wrong-decorator")

    def create(request: HttpRequest) -> dict[str, int]:
        return {"id": 1}

    with pytest.raises(ImproperlyConfigured, match=r"use idempotency\.ninja\.idempotent"):
        api.post("/orders")(idempotent()(create))


def test_the_django_decorator_above_a_ninja_route_says_to_use_the_ninja_one():
    api = NinjaAPI(urls_namespace="wrong-decorator-above")

    @api.post("/orders")
    def create(request: HttpRequest) -> dict[str, int]:
        return {"id": 1}

    with pytest.raises(ImproperlyConfigured, match=r"use idempotency\.ninja\.idempotent"):
        idempotent(create)


def test_the_ninja_decorator_works_without_parentheses_too():
    api = NinjaAPI(urls_namespace="bare-ninja")

    @api.post("/orders")
    @ninja_idempotent
    def create(request: HttpRequest) -> dict[str, int]:
        return {"id": 1}

    assert create.idempotency_options.operation is None  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_settings_are_validated_at_first_use_when_checks_are_skipped():
    with (
        override_settings(IDEMPOTENCY={"MODE": "leased"}),
        pytest.raises(ImproperlyConfigured, match=r"'MODE'\] should be one of .*idempotency\.E006"),
    ):
        _post(bare)
    assert not IdempotencyRecord.objects.exists()
    assert _post(bare).status_code == 201  # valid again once the setting is


@pytest.mark.django_db
def test_an_invalid_header_setting_is_refused_at_first_use():
    with (
        override_settings(IDEMPOTENCY={"HEADER": "Idempotency Key"}),
        pytest.raises(ImproperlyConfigured, match="idempotency.E003"),
    ):
        _post(bare)
