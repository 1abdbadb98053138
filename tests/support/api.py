"""Requests through DRF's test client to the test URLconf (``tests/support/urls.py``), and how
their answers read: what the tests of docs/http.md's rows and of the answers share."""

from __future__ import annotations

import base64
import json
from typing import Any

from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.test import APIClient, APIRequestFactory

from idempotency.http import request_hash
from idempotency.models import IdempotencyRecord
from tests.support.factories import IdempotencyRecordFactory
from tests.testapp.views import OrderViewSet

ORDER = {"sku": "book", "quantity": 2}
PROBLEM_FIELDS = {"type", "title", "status", "detail", "code"}


def authenticated(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def post(client: APIClient, path: str, data: Any = None, key: str | None = "k-1", **extra: Any):
    headers = {} if key is None else {"Idempotency-Key": key}
    extra.setdefault("format", "json")
    return client.post(path, data, headers=headers, **extra)


def post_raw(client: APIClient, path: str, body: str, content_type: str, key: str = "k-1"):
    return client.post(path, body, content_type=content_type, headers={"Idempotency-Key": key})


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def problem(response) -> dict[str, Any]:
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert set(body) == PROBLEM_FIELDS
    assert body["status"] == response.status_code
    return body


def is_replay(response) -> bool:
    return response.headers.get("Idempotent-Replayed") == "true"


def stored(key: str = "k-1") -> IdempotencyRecord:
    return IdempotencyRecord.objects.get(idem_key=key)


def state(record: IdempotencyRecord) -> dict[str, Any]:
    fresh = IdempotencyRecord.objects.get(pk=record.pk)
    values = {f.attname: getattr(fresh, f.attname) for f in fresh._meta.concrete_fields}
    values["response_body"] = bytes(values["response_body"] or b"")
    return values


def order_request(user, data: dict[str, Any]) -> tuple[Request, OrderViewSet]:
    """The DRF request and view that ``POST /orders/`` with ``data`` would get."""
    request = Request(
        APIRequestFactory().post("/orders/", data, format="json"), parsers=[JSONParser()]
    )
    request.user = user
    view = OrderViewSet(action="create", request=request, format_kwarg=None)
    return request, view


def pending_order(user, data: dict[str, Any], key: str = "k-1", **traits: Any):
    """A record for ``POST /orders/`` as another request left it, scoped and hashed by the view."""
    request, view = order_request(user, data)
    options = view.get_idempotency_options()
    return IdempotencyRecordFactory(
        scope=view.get_idempotency_scope(request, options.operation or ""),
        idem_key=key,
        operation=options.operation,
        request_hash=request_hash(request, options),
        **traits,
    )
