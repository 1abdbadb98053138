"""Authenticates payment callbacks by the HMAC-SHA256 signature of their raw body."""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

SIGNATURE_HEADER = "X-Signature"


class PaymentProvider:
    """The caller of a correctly signed callback: authenticated, but not a user."""

    is_authenticated = True
    is_anonymous = False
    pk = None

    def __str__(self) -> str:
        return "payment provider"


def sign(body: bytes, secret: str | None = None) -> str:
    """The hex HMAC-SHA256 of ``body``, as the provider sends it in ``X-Signature``."""
    key = (secret if secret is not None else settings.PAYMENT_WEBHOOK_SECRET).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


class PaymentSignatureAuthentication(BaseAuthentication):
    """Runs before the view, so a bad signature never reaches the idempotency record."""

    def authenticate(self, request: Request) -> tuple[PaymentProvider, str] | None:
        signature = request.headers.get(SIGNATURE_HEADER)
        if not signature:
            return None
        # The signature covers the exact bytes sent. Read them from the Django
        # request before DRF parses the stream; Django keeps them for the parser.
        body = request._request.body
        if not hmac.compare_digest(sign(body).encode(), _hex_digest(signature)):
            raise AuthenticationFailed("Invalid signature.", code="invalid_signature")
        return PaymentProvider(), signature

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) to unsigned or badly signed callbacks.
        return SIGNATURE_HEADER


def _hex_digest(signature: str) -> bytes:
    # Accept the bare hex digest and the common ``sha256=<hex>`` form, in any case.
    # Bytes, because compare_digest raises on non-ASCII text (a forged header may hold any).
    value = signature.strip().lower().removeprefix("sha256=")
    return value.encode("utf-8", "replace")
