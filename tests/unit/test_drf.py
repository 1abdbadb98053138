"""The DRF adapter's rough edges: content negotiation of what is stored, the browsable API
on a protected endpoint, and lease mode under ``ATOMIC_REQUESTS``."""

from __future__ import annotations

import json
import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.utils.html import escapejs
from rest_framework.test import APIClient

from idempotency.models import IdempotencyRecord
from tests.support.factories import UserFactory
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

ORDER = {"sku": "book", "quantity": 2}
HIDDEN_KEY = re.compile(rb'<input type="hidden" name="_idempotency_key" value="([0-9a-f-]{36})">')


@pytest.fixture
def client() -> APIClient:
    client = APIClient()
    client.force_authenticate(UserFactory())
    return client


def is_replay(response) -> bool:
    return response.headers.get("Idempotent-Replayed") == "true"


def create(client: APIClient, **extra):
    return client.post("/orders/", ORDER, format="json", headers={"Idempotency-Key": "k"}, **extra)


class TestStoredRepresentation:
    def test_an_html_first_request_stores_json_and_json_clients_get_json(self, client):
        first = create(client, HTTP_ACCEPT="text/html")
        assert first.status_code == 201
        assert first["Content-Type"].startswith("text/html")  # the browser got its page
        assert b"csrfmiddlewaretoken" in first.content
        record = IdempotencyRecord.objects.get()
        assert dict(record.response_headers)["Content-Type"] == "application/json"
        assert b"csrf" not in bytes(record.response_body)
        replay = create(client)
        assert is_replay(replay)
        assert replay["Content-Type"] == "application/json"
        order = Order.objects.get()
        assert replay.json() == {"id": order.pk, "sku": "book", "quantity": 2, "paid": False}
        assert replay["Location"] == f"/orders/{order.pk}/"

    def test_an_html_repeat_gets_the_stored_json_too(self, client):
        first = create(client)
        repeat = create(client, HTTP_ACCEPT="text/html")
        assert is_replay(repeat)
        assert (repeat["Content-Type"], repeat.content) == ("application/json", first.content)


class TestBrowsableApi:
    def page_key(self, client: APIClient) -> str:
        page = client.get("/drf/browsable-orders/", HTTP_ACCEPT="text/html")
        match = HIDDEN_KEY.search(page.content)
        assert match is not None, "the HTML form carries no key"
        # The raw-data form sends the same key in the header.
        name, key = escapejs("Idempotency-Key"), escapejs(match[1].decode())
        header = f'$.ajaxSetup({{headers: {{"{name}": "{key}"}}}});'
        assert header.encode() in page.content
        return match[1].decode()

    def submit(self, client: APIClient, key: str, quantity: int = 2):
        form = {"sku": "book", "quantity": quantity, "_idempotency_key": key}
        return client.post(
            "/drf/browsable-orders/", form, format="multipart", HTTP_ACCEPT="text/html"
        )

    def test_the_form_creates_once_however_often_it_is_submitted(self, client):
        key = self.page_key(client)
        first = self.submit(client, key)
        again = self.submit(client, key)
        assert first.status_code == again.status_code == 201
        assert not is_replay(first)
        assert is_replay(again)
        assert Order.objects.count() == 1
        assert IdempotencyRecord.objects.get().idem_key == key

    def test_each_page_brings_a_new_key(self, client):
        first, second = self.page_key(client), self.page_key(client)
        assert first != second
        self.submit(client, first)
        self.submit(client, second)
        assert Order.objects.count() == 2

    def test_the_key_field_is_not_part_of_the_fingerprint_and_other_fields_are(self, client):
        key = self.page_key(client)
        self.submit(client, key)
        assert self.submit(client, key, quantity=3).status_code == 422

    def test_without_the_field_or_header_the_key_is_missing(self, client):
        response = client.post("/drf/browsable-orders/", ORDER, format="multipart")
        assert response.status_code == 400
        assert json.loads(response.content)["code"] == "idempotency_key_missing"


def test_the_drf_adapter_is_registered_when_the_app_is_ready():
    # By IdempotencyConfig.ready, not by the HTTP layer importing the DRF adapter.
    from idempotency import http
    from idempotency.drf import DRFAdapter

    assert any(isinstance(adapter, DRFAdapter) for adapter in http.adapters())
    assert not hasattr(http, "IdempotencyAPIException")


class TestLeaseModeUnderAtomicRequests:
    @pytest.fixture(autouse=True)
    def atomic_requests(self, monkeypatch):
        monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)

    def test_a_lease_mode_view_in_the_request_transaction_fails_loudly(self, client):
        with pytest.raises(ImproperlyConfigured, match="non_atomic_requests"):
            client.post("/drf/lease-orders/", {}, format="json", headers={"Idempotency-Key": "k"})
        assert IdempotencyRecord.objects.count() == 0
        assert Order.objects.count() == 0

    def test_non_atomic_requests_is_the_fix(self, client):
        path = "/drf/non-atomic-lease-orders/"
        first = client.post(path, {}, format="json", headers={"Idempotency-Key": "k"})
        again = client.post(path, {}, format="json", headers={"Idempotency-Key": "k"})
        assert first.status_code == 201
        assert is_replay(again)
        assert Order.objects.count() == 1


class TestMixinOrder:
    """A DRF class ahead of the mixin would shadow it: refused when the class is made."""

    def test_the_create_mixin_after_a_viewset_is_refused(self):
        from rest_framework import viewsets

        from idempotency.drf import IdempotentCreateMixin

        with pytest.raises(ImproperlyConfigured) as refused:

            class OrderViewSet(viewsets.ModelViewSet, IdempotentCreateMixin):
                pass

        message = str(refused.value)
        assert "CreateModelMixin.create" in message
        assert "Put IdempotentCreateMixin before the DRF classes" in message
        assert "OrderViewSet" in message

    def test_a_create_view_that_subclasses_a_drf_base_is_refused_too(self):
        from rest_framework import generics, mixins

        from idempotency.drf import IdempotentCreateMixin

        class Logged(mixins.CreateModelMixin):
            def create(self, request, *args, **kwargs):
                return super().create(request, *args, **kwargs)

        # ``Logged.create`` delegates to DRF's, which never reaches the mixin.
        with pytest.raises(ImproperlyConfigured, match="CreateModelMixin.create"):

            class View(Logged, IdempotentCreateMixin, generics.GenericAPIView):
                pass

    def test_the_general_mixin_after_api_view_is_refused(self):
        from rest_framework.views import APIView

        from idempotency.drf import IdempotentMixin

        refused = r"APIView.handle_exception.*IdempotentMixin"
        with pytest.raises(ImproperlyConfigured, match=refused):

            class View(APIView, IdempotentMixin):
                pass

    def test_the_right_order_and_a_delegating_mixin_ahead_are_served(self):
        from rest_framework import viewsets

        from idempotency.drf import IdempotentCreateMixin

        class Audited:
            def create(self, request, *args, **kwargs):
                return super().create(request, *args, **kwargs)  # type: ignore[misc]

        class OrderViewSet(IdempotentCreateMixin, viewsets.ModelViewSet):
            def create(self, request, *args, **kwargs):
                return super().create(request, *args, **kwargs)

        class AuditedViewSet(Audited, IdempotentCreateMixin, viewsets.ModelViewSet):
            pass

        assert OrderViewSet.__mro__.index(IdempotentCreateMixin) < 3
        assert AuditedViewSet.create is Audited.create
