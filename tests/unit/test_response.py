"""Rendering the protocol's errors (``idempotency.adapters``): ``ERROR_FORMAT`` and a view's
``error_format`` as a renderer of the project's own error shape, on each adapter."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import RequestFactory, override_settings
from django.urls import path
from ninja import NinjaAPI
from rest_framework.test import APIRequestFactory, force_authenticate

from idempotency import IdempotencyError, idempotent, idempotent_function
from idempotency.exceptions import KeyInUse
from idempotency.models import IdempotencyRecord
from idempotency.ninja import idempotent as ninja_idempotent
from idempotency.response import error_response, use_error_format
from tests.support.factories import UserFactory
from tests.testapp.views import OrderViewSet

pytestmark = pytest.mark.django_db


def stripe_error(request: Any, error: IdempotencyError, status: int) -> HttpResponse:
    kind = "idempotency_error" if status in (409, 422) else "invalid_request_error"
    body = {"error": {"type": kind, "code": error.code, "message": error.detail}}
    return JsonResponse(body, status=status)


def broken(request: Any, error: IdempotencyError, status: int) -> Any:
    return {"not": "a response"}


def _created(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=201)


def _post(view, key: str | None = None, body: bytes = b"{}") -> HttpResponse:
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    request = RequestFactory().post("/x/", body, content_type="application/json", **headers)
    request.user = UserFactory.build(pk=1, id=1)
    return view(request)


def _stripe(response: HttpResponse, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    error: dict[str, Any] = json.loads(response.content)["error"]
    assert error["code"] == code
    return error


@override_settings(IDEMPOTENCY={"ERROR_FORMAT": f"{__name__}.stripe_error"})
def test_the_setting_names_a_renderer_every_view_uses():
    error = _stripe(_post(idempotent()(_created)), 400, "idempotency_key_missing")
    assert error["type"] == "invalid_request_error" and error["message"]


def test_a_view_renders_its_own_errors_and_the_others_keep_the_problem():
    view = idempotent(error_format=stripe_error)(_created)
    _stripe(_post(view, body=b'{"a": "\xed\xa0\x80"}', key="k"), 400, "idempotency_request_invalid")
    assert _post(view, key="k").status_code == 201
    error = _stripe(_post(view, key="k", body=b'{"a": 2}'), 422, "idempotency_key_reused")
    assert error["type"] == "idempotency_error"
    plain = _post(idempotent()(_created))
    assert plain["Content-Type"] == "application/problem+json"


def test_retry_after_is_kept_on_a_rendered_409():
    request = RequestFactory().post("/x/")
    use_error_format(request, stripe_error)
    response = error_response(request, KeyInUse(retry_after=3))
    assert (response.status_code, response["Retry-After"]) == (409, "3")
    assert json.loads(response.content)["error"]["type"] == "idempotency_error"


def test_a_renderer_that_fails_is_answered_with_the_problem():
    response = _post(idempotent(error_format=broken)(_created))
    assert response.status_code == 400
    assert json.loads(response.content)["code"] == "idempotency_key_missing"
    assert not IdempotencyRecord.objects.exists()


def test_a_drf_view_sets_it_as_a_class_attribute():
    class StripeOrders(OrderViewSet):
        idempotency_error_format = staticmethod(stripe_error)

    request = APIRequestFactory().post("/orders/", {"sku": "a", "quantity": 1}, format="json")
    force_authenticate(request, UserFactory())
    response = StripeOrders.as_view({"post": "create"})(request)
    _stripe(response, 400, "idempotency_key_missing")


ninja_api = NinjaAPI(urls_namespace="tests-error-format")


@ninja_api.post("/x")
@ninja_idempotent(error_format=stripe_error, scope=lambda request, operation: "s")
def ninja_create(request):
    return {"ok": True}


urlpatterns = [path("ninja/", ninja_api.urls)]


@override_settings(ROOT_URLCONF=__name__)
def test_a_ninja_operation_renders_its_unreadable_body_too(client):
    def send(raw: bytes, **headers: str) -> Any:
        return client.post("/ninja/x", raw, content_type="application/json", headers=headers)

    unreadable = send(b'{"a": "\xed\xa0\x80"}', **{"Idempotency-Key": "k"})
    assert unreadable.status_code == 400
    assert unreadable.json()["error"]["code"] == "idempotency_request_invalid"
    assert send(b"{}").json()["error"]["code"] == "idempotency_key_missing"
    assert send(b"{}", **{"Idempotency-Key": "k"}).status_code == 200


def test_an_error_format_is_refused_where_nothing_is_rendered():
    with pytest.raises(ValueError, match="error_format should be"):
        idempotent(error_format="json")
    with pytest.raises(TypeError, match="takes no error_format"):
        idempotent_function(scope="s", key=lambda: "k", error_format=stripe_error)
