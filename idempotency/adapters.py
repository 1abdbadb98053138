"""What the HTTP layer asks of the framework a request came through.

``FrameworkAdapter`` is what a framework tells the HTTP layer about its
requests (a parsed body), exceptions (which are client errors), responses
(what to store for replays) and its ``ERROR_FORMAT``. DRF's adapter is the one
in this package; the registry stays, though it has one user, because it is
the documented, stable way for another framework's adapter to plug in
(docs/api.md, "Writing an adapter"), and because it keeps ``rest_framework``
out of the HTTP layer's imports: DRF is optional, and ``idempotency.drf``
registers itself once DRF is loaded. The answers themselves are
``idempotency.response``'s; a framework may render errors its own way
(``ERROR_FORMAT = "drf"``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypeAlias

from django.core.exceptions import BadRequest, PermissionDenied
from django.http import Http404, HttpRequest
from django.http.response import HttpResponseBase

from idempotency.exceptions import (
    IdempotencyError,
)

if TYPE_CHECKING:
    from rest_framework.request import Request

    # A Django request, or DRF's wrapper of one (which keeps it in ``_request``).
    AnyRequest: TypeAlias = HttpRequest | Request
else:
    AnyRequest = HttpRequest


logger = logging.getLogger("idempotency")

UNPARSED: Any = object()


_CLIENT_ERRORS = (Http404, PermissionDenied, BadRequest)


class FrameworkAdapter:
    """What a framework tells the HTTP layer about its requests, responses and errors.

    Each method's default says "not mine". ``idempotency.drf`` registers DRF's
    adapter, loaded as soon as ``rest_framework`` is imported anywhere (only then
    can a DRF request or response exist). Stable for other frameworks' adapters.
    """

    #: The ``ERROR_FORMAT`` value this adapter renders, if any.
    error_format: str | None = None

    def parsed_body(self, request: AnyRequest) -> Any:
        """The framework's parse of the body, or ``UNPARSED`` if not its request."""
        return UNPARSED

    def is_client_error(self, exc: Exception) -> bool:
        return False

    def stored_representation(
        self, request: AnyRequest, response: HttpResponseBase
    ) -> HttpResponseBase | None:
        """Render ``response`` and return what to store for replays, or ``None``."""
        return None

    def error_response(
        self, request: AnyRequest, error: IdempotencyError
    ) -> HttpResponseBase | None:
        """``error`` rendered in the framework's own format, or ``None`` if it has none."""
        return None


_ADAPTERS: list[FrameworkAdapter] = []


def register_adapter(adapter: FrameworkAdapter) -> None:
    if all(type(known) is not type(adapter) for known in _ADAPTERS):
        _ADAPTERS.append(adapter)


def adapters() -> list[FrameworkAdapter]:
    # Each adapter registers itself when its module is imported (AppConfig.ready).
    return _ADAPTERS


def parsed_body(request: AnyRequest) -> Any:
    for adapter in adapters():
        data = adapter.parsed_body(request)
        if data is not UNPARSED:
            return data
    return UNPARSED


def is_client_error(exc: Exception) -> bool:
    return isinstance(exc, _CLIENT_ERRORS) or any(
        adapter.is_client_error(exc) for adapter in adapters()
    )


def stored_representation(request: AnyRequest, response: HttpResponseBase) -> HttpResponseBase:
    for adapter in adapters():
        stored = adapter.stored_representation(request, response)
        if stored is not None:
            return stored
    render = getattr(response, "render", None)  # a TemplateResponse
    if callable(render):
        render()
    return response


def django_request_of(request: AnyRequest) -> HttpRequest:
    return getattr(request, "_request", request)
