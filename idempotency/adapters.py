"""What the HTTP layer asks of the framework a request came through, and the answers it renders.

``FrameworkAdapter`` is what a framework tells the HTTP layer about its
requests (a parsed body), exceptions (which are client errors), responses
(what to store for replays) and its ``ERROR_FORMAT``. DRF's adapter is the one
in this package; the registry stays, though it has one user, because it is
the documented, stable way for another framework's adapter to plug in
(docs/api.md, "Writing an adapter"), and because it keeps ``rest_framework``
out of the HTTP layer's imports: DRF is optional, and ``idempotency.drf``
registers itself once DRF is loaded. Also the error and outage answers, which
a framework may render itself (``ERROR_FORMAT = "drf"``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from django.core.exceptions import BadRequest, ImproperlyConfigured, PermissionDenied
from django.db import connections, transaction
from django.http import Http404, HttpRequest
from django.http.response import HttpResponseBase

from idempotency.compat import mark_logged
from idempotency.conf import error_format, idempotency_settings
from idempotency.exceptions import (
    IdempotencyError,
)
from idempotency.problems import error_status, problem_response
from idempotency.protocol.execute import database_unavailable

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

    def error_response(self, request: AnyRequest, error: IdempotencyError) -> HttpResponseBase:
        return problem_response(error)


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


def use_error_format(request: AnyRequest, chosen: Any) -> None:
    """Render ``request``'s protocol errors as ``chosen`` (a view's ``error_format``) says.

    Kept on the request: errors are rendered where they are caught, which may be
    outside the entry point that knows the view's options. ``None``: ``ERROR_FORMAT``.
    """
    if chosen is not None:
        django_request_of(request)._idempotency_error_format = chosen  # type: ignore[attr-defined]


def error_response(request: AnyRequest, error: IdempotencyError) -> HttpResponseBase:
    name = _error_format(request)
    if callable(name):
        return _rendered(name, request, error)
    for adapter in adapters():
        if adapter.error_format == name:
            return adapter.error_response(request, error)
    return problem_response(error)  # "problem", or a format whose adapter is missing (E028)


def _error_format(request: AnyRequest) -> Any:
    chosen = getattr(django_request_of(request), "_idempotency_error_format", None)
    if chosen is None:
        return idempotency_settings.ERROR_FORMAT
    try:
        return error_format(chosen, "error_format")
    except ImproperlyConfigured:  # a view's dotted path, imported at its first error
        logger.exception("error_format %r cannot be used; answered with the problem", chosen)
        return "problem"


def _rendered(
    render: Callable[..., Any], request: AnyRequest, error: IdempotencyError
) -> HttpResponseBase:
    """The project's rendering of ``error``; the problem if the renderer fails (never a 500)."""
    try:
        response = render(request, error, error_status(error))
        if not isinstance(response, HttpResponseBase):
            raise TypeError(f"it returned {type(response).__name__}, not an HttpResponse")
    except Exception:
        name = getattr(render, "__qualname__", repr(render))
        logger.exception("ERROR_FORMAT renderer %s failed; answered with the problem", name)
        return problem_response(error)
    retry_after = getattr(error, "retry_after", None)  # KeyInUse, DatabaseUnavailable
    if retry_after is not None and not response.has_header("Retry-After"):
        response["Retry-After"] = str(retry_after)
    return response


def outage_response(request: AnyRequest, error: Exception) -> HttpResponseBase:
    """The 503 answer to a database that failed under a protected request.

    ``error`` is the database's exception (or the protocol's ``DatabaseUnavailable``),
    raised by the protocol, the view, or what the framework ran before the view
    (DRF's or ninja's authentication). Logged once, by the ``database_unavailable``
    signal. A transaction still open around the request (``ATOMIC_REQUESTS``) is
    marked for rollback: nothing of a request answered 503 may commit.
    """
    unavailable = database_unavailable(error)
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            transaction.set_rollback(True, using=connection.alias)
    response = error_response(request, unavailable)
    mark_logged(response)  # Django's ``django.request`` logger would log this 5xx again
    return response


def django_request_of(request: AnyRequest) -> HttpRequest:
    return getattr(request, "_request", request)
