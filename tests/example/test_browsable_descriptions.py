"""The browsable API shows the example's view descriptions rendered from Markdown."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def example_urls():
    with override_settings(ROOT_URLCONF="example_project.urls"):
        yield


@pytest.mark.parametrize("url", ["/api/orders/", "/api/reports/"])
def test_descriptions_render_as_markdown(url: str) -> None:
    client = APIClient()
    client.force_authenticate(User.objects.create_user("alice"))

    page = client.get(url, HTTP_ACCEPT="text/html").content.decode()

    assert "<code>Idempotency-Key</code>" in page
    assert "``" not in page  # no reST literal left to show as typed
