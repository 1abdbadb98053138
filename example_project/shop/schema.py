"""How drf-spectacular describes what it cannot infer from the shop's code."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension

from example_project.shop.authentication import SIGNATURE_HEADER


class PaymentSignatureScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "example_project.shop.authentication.PaymentSignatureAuthentication"
    name = "paymentSignature"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": SIGNATURE_HEADER,
            "description": "Hex HMAC-SHA256 of the raw body, keyed with the provider's secret.",
        }


def without_unslashed_aliases(endpoints: list[tuple[Any, ...]], **kwargs: Any) -> list[Any]:
    """The URLs without a trailing slash are aliases (for POSTs that cannot be redirected)."""
    return [endpoint for endpoint in endpoints if endpoint[0].endswith("/")]
