"""What a protected request is (``idempotency.request``): key and scope functions' failures."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.test import RequestFactory

from idempotency import idempotent
from idempotency.models import IdempotencyRecord
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db

runs: list[int] = []


def event_id(request: HttpRequest) -> str:
    return str(json.loads(request.body)["id"])  # KeyError on an event without one


@idempotent(key=event_id)
def receive(request: HttpRequest) -> HttpResponse:
    runs.append(1)
    return JsonResponse({"ok": True}, status=201)


def _post(view, body: dict) -> HttpResponse:
    request = RequestFactory().post("/events/", json.dumps(body), content_type="application/json")
    request.user = UserFactory.build(pk=1, id=1)
    return view(request)


@pytest.fixture(autouse=True)
def _no_runs():
    runs.clear()


def test_a_key_function_that_raises_is_a_key_invalid_problem_naming_it():
    response = _post(receive, {"amount": 5})

    assert response.status_code == 400
    body = json.loads(response.content)
    assert body["code"] == "idempotency_key_invalid"
    assert f"{__name__}.event_id, raised KeyError: 'id'" in body["detail"]
    assert runs == [] and not IdempotencyRecord.objects.exists()
    assert _post(receive, {"id": "e-1"}).status_code == 201  # and the view still serves


def test_a_client_error_a_key_function_raises_is_the_frameworks_to_answer():
    def missing(request: HttpRequest) -> str:
        raise Http404("no such event")

    view = idempotent(key=missing)(lambda request: HttpResponse(status=201))
    with pytest.raises(Http404):
        _post(view, {"id": "e-1"})
    assert not IdempotencyRecord.objects.exists()


def _scoped_view(scope_function):
    @idempotent(scope=scope_function)
    def view(request: HttpRequest) -> HttpResponse:
        return JsonResponse({"ok": True}, status=201)

    return view


def _post_with_key(view) -> HttpResponse:
    request = RequestFactory().post(
        "/scoped/",
        json.dumps({"a": 1}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k-1",
    )
    return view(request)


def test_a_scope_function_that_finds_no_caller_is_refused_not_shared():
    # Two callers without a scope must not share one named "None" (one's replay is the other's).
    def no_caller(request, operation):
        return None

    response = _post_with_key(_scoped_view(no_caller))

    assert response.status_code == 403
    assert json.loads(response.content)["code"] == "idempotency_scope_unavailable"
    assert b"no_caller" in response.content
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize("scope", ["", 42, b"user:1"])
def test_a_scope_function_that_returns_no_string_names_itself(scope):
    def odd_scope(request, operation):
        return scope

    with pytest.raises(ImproperlyConfigured, match="odd_scope"):
        _post_with_key(_scoped_view(odd_scope))
    assert not IdempotencyRecord.objects.exists()
