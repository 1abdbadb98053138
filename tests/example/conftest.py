"""What the example project's tests share: its URLconf, its webhook secret, its demo user.

The servers of the HTTP tests run in processes of their own; in this process the test
client and ``reverse`` see the example project's URLs, not those of ``tests/support/urls.py``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.test import override_settings

SECRET = "tests-webhook-secret"


@pytest.fixture(autouse=True)
def example_urls() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="example_project.urls", PAYMENT_WEBHOOK_SECRET=SECRET):
        yield


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="alice-password")


def basic(username: str = "alice", password: str = "alice-password") -> str:
    """The ``Authorization`` header of HTTP Basic for the example's users."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def sign(body: bytes, secret: str = SECRET) -> str:
    """The payment callback's ``X-Signature``: HMAC-SHA256 of the raw body."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
