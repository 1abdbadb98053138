"""The Django REST framework adapter: everything DRF-specific lives here.

``IdempotentCreateMixin`` and the hooks it shares with other views; DRF's side
of the HTTP layer (``request.data``, ``APIException``, renderers, the project's
exception handler), registered with ``idempotency.http`` on import; and a
browsable API that can create on protected endpoints.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.http.response import HttpResponseBase
from django.utils.html import format_html
from rest_framework.exceptions import APIException, ErrorDetail
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from idempotency.compat import mark_logged
from idempotency.conf import idempotency_settings
from idempotency.exceptions import IdempotencyError
from idempotency.http import (
    KEY_FORM_FIELD,
    SAFE_METHODS,
    FrameworkAdapter,
    error_status,
    fields_hash,
    header_key,
    outage_response,
    problem_response,
    protect,
    register_adapter,
)
from idempotency.models import Status
from idempotency.operations import declare
from idempotency.options import (
    APPLIES,
    ATTRIBUTE_PREFIX,
    IdempotencyOptions,
    options_from_attributes,
)
from idempotency.resolvers import register
from idempotency.stores.errors import is_outage


def _operation_name(view: type, action: str) -> str:
    return f"{view.__module__}.{view.__qualname__}.{action}"


def refuse_shadowing(view: type) -> None:
    """Refuse, when the class is made, a DRF class ahead of the mixin in ``view``'s MRO.

    ``class V(viewsets.ModelViewSet, IdempotentCreateMixin)`` resolves ``create`` to
    DRF's ``CreateModelMixin.create``, which never calls ``super()``: the view would
    serve unprotected, silently. DRF's classes are the ones refused: a project's own
    mixin ahead of ours may delegate with ``super()``, which keeps the protection.
    """
    mro = view.__mro__
    mixin = next(k for k in mro if k.__module__ == __name__ and "_idempotency_methods" in vars(k))
    methods: tuple[str, ...] = vars(mixin)["_idempotency_methods"]
    for name in methods:
        ours = next(k for k in mro if k.__module__ == __name__ and name in vars(k))
        ahead = [k for k in mro[: mro.index(ours)] if name in vars(k)]
        drf = [k for k in ahead if k.__module__.startswith("rest_framework.")]
        if drf:
            raise ImproperlyConfigured(
                f"{view.__module__}.{view.__qualname__}: DRF's {drf[0].__qualname__}.{name} "
                f"comes before {ours.__qualname__}.{name} among its bases, so DRF's runs and "
                f"the mixin's never does (for create: no protection at all). Put "
                f"{mixin.__qualname__} before the DRF classes: "
                f"class {view.__name__}({mixin.__qualname__}, <the DRF classes>)."
            )


def _keep_view_description(view: type) -> None:
    """Keep the mixins' docstrings out of ``view``'s API description.

    Schema generators (drf-spectacular) describe an operation by the first
    docstring in the view's MRO short of DRF's own classes: a view without one
    would be described by ours. It gets the docstring it would have had without
    the mixins, or a blank one (an empty string would be passed over).
    """
    if view.__doc__ is not None:
        return
    inherited = (
        base.__doc__
        for base in view.__mro__[1:]
        if base.__doc__ and not base.__module__.startswith((__name__, "rest_framework."))
    )
    view.__doc__ = next(inherited, " ")


# Each overridable hook, by the option it stands for.
_HOOKS = {
    "key": "get_idempotency_key",
    "scope": "get_idempotency_scope",
    "fingerprint": "get_idempotency_fingerprint",
    "outcome_policy": "get_idempotency_outcome",
}
_OPERATIONS_PER_VIEW = 64


class IdempotentMixin:
    """Hooks and options for DRF views; call ``run_idempotently`` around an unsafe handler.

    Each ``get_idempotency_*`` hook can be overridden on a view; each
    ``idempotency_<option>`` class attribute left at ``None`` falls back to the
    ``IDEMPOTENCY`` setting (docs/drf.md).
    """

    # The options (idempotency.options) that APPLIES gives the mixin, as class
    # attributes ``idempotency_<option>``: set below, validated per subclass.
    # Operation names ``idempotency_resolver`` is registered under for recovery.
    idempotency_resolved_actions: tuple[str, ...] = ()
    _idempotency_options: IdempotencyOptions = IdempotencyOptions()
    # The methods whose DRF versions would shadow ours if a DRF class came first.
    _idempotency_methods: tuple[str, ...] = ("handle_exception",)
    # The options whose hook the class overrides; the others are read by the HTTP
    # layer itself, so that it never calls up into the view for a default.
    _idempotency_hooks: tuple[str, ...] = ()
    # The options of each operation name, when no hook is overridden: made once.
    _idempotency_by_operation: dict[str, IdempotencyOptions] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        refuse_shadowing(cls)
        _keep_view_description(cls)
        options = options_from_attributes("IdempotentMixin", cls)
        cls._idempotency_hooks = tuple(
            option
            for option, method in _HOOKS.items()
            if getattr(cls, method) is not getattr(IdempotentMixin, method)
        )
        if "fingerprint" not in cls._idempotency_hooks:
            # What get_idempotency_fingerprint gives, as the material of the request's
            # hash (hashed once more), as it always was: records made before stay
            # replayable. A partial, so that the HTTP layer never calls up into the view.
            hook = partial(fields_hash, fields=options.fields, exclude=options.exclude)
            options = replace(options, fingerprint=hook)
        cls._idempotency_options = options
        cls._idempotency_by_operation = {}
        operation = cls._idempotency_options.operation
        names = (
            [operation]
            if operation
            else [_operation_name(cls, action) for action in cls.idempotency_resolved_actions]
        )
        if cls.__module__ != __name__:  # a project's view, not IdempotentCreateMixin itself
            for name in names:
                declare(name)
        resolver = cls._idempotency_options.resolver
        if resolver is None:
            return
        # Recovery runs where no request ever reached this view: register it by name now.
        for name in names:
            register(name, resolver)

    @classmethod
    def as_view(cls, *args: Any, **kwargs: Any) -> Any:
        # Which actions a general mixin's view protects, its URL says (a viewset's
        # {method: action}, an APIView's handlers): the unsafe ones' operations are declared.
        view = super().as_view(*args, **kwargs)  # type: ignore[misc]
        if cls._idempotency_options.operation or cls.idempotency_resolved_actions:
            return view  # declared when the class was made
        methods: list[str] = getattr(cls, "http_method_names", [])
        actions: Mapping[str, str] = getattr(view, "actions", None) or {
            method: method for method in methods if hasattr(cls, method)
        }
        for method, action in actions.items():
            if method.upper() not in SAFE_METHODS:
                declare(_operation_name(cls, action))
        return view

    def get_idempotency_key(self, request: Request) -> str | None:
        options = self._idempotency_options
        return header_key(request, options.header, options.required)

    def get_idempotency_scope(self, request: Request, operation: str) -> str:
        return str(idempotency_settings.SCOPE_FUNCTION(request, operation))

    def get_idempotency_fingerprint(self, request: Request) -> str:
        options = self._idempotency_options
        return fields_hash(request, options.fields, options.exclude)

    def get_idempotency_outcome(self, response: HttpResponseBase) -> Status | None:
        policy: Callable[[HttpResponseBase], Status | None] = idempotency_settings.OUTCOME_POLICY
        return policy(response)

    def get_idempotency_operation(self) -> str:
        if self._idempotency_options.operation:
            return self._idempotency_options.operation
        action = getattr(self, "action", None) or self.request.method.lower()  # type: ignore[attr-defined]
        return _operation_name(type(self), action)

    def get_idempotency_options(self) -> IdempotencyOptions:
        operation = self.get_idempotency_operation()
        if not self._idempotency_hooks:
            known = self._idempotency_by_operation
            options = known.get(operation)
            if options is None:
                if len(known) >= _OPERATIONS_PER_VIEW:  # names made up per request
                    known.clear()
                options = known[operation] = replace(self._idempotency_options, operation=operation)
            return options
        hooks: dict[str, Any] = {
            option: getattr(self, _HOOKS[option]) for option in self._idempotency_hooks
        }
        if "key" in hooks:
            hooks["required"] = False  # the view's key hook says whether a key is needed
        return replace(self._idempotency_options, operation=operation, **hooks)

    def run_idempotently(
        self, request: Request, handler: Callable[[], HttpResponseBase]
    ) -> HttpResponseBase:
        options = self.get_idempotency_options()
        return protect(request, handler, options, options.operation or "")

    # DRF authenticates inside the view, before the protected handler: a database
    # outage there is answered as one in the handler is (503, Retry-After).
    def handle_exception(self, exc: Exception) -> HttpResponseBase:
        response = _outage_answer(getattr(self, "request", None), exc)
        if response is None:
            response = super().handle_exception(exc)  # type: ignore[misc]
        return response


for _name in APPLIES["IdempotentMixin"]:
    # ``View.idempotency_mode`` and the like read the option's default, as before.
    setattr(IdempotentMixin, ATTRIBUTE_PREFIX + _name, getattr(IdempotencyOptions(), _name))


class IdempotentCreateMixin(IdempotentMixin):
    """Protects ``create`` of a DRF generic view or viewset; put it before the DRF mixins.

    ``class OrderViewSet(IdempotentCreateMixin, viewsets.ModelViewSet)``: a POST
    with an ``Idempotency-Key`` creates once, and every repeat gets the first
    response with ``Idempotent-Replayed: true`` (docs/drf.md).
    """

    idempotency_resolved_actions = ("create", "post")
    _idempotency_methods = ("create", "handle_exception")

    # ``Any``, not ``HttpResponseBase``: DRF's stubs type ``CreateModelMixin.create`` as
    # returning ``Response``, and a narrower type here would make mypy reject every
    # user's ``class V(IdempotentCreateMixin, ModelViewSet)``. Replays are ``HttpResponse``.
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        return self.run_idempotently(
            request,
            lambda: super(IdempotentCreateMixin, self).create(request, *args, **kwargs),  # type: ignore[misc]
        )


# --- DRF's side of the HTTP layer --------------------------------------------------------


class IdempotencyErrorDetail(dict[str, ErrorDetail]):
    """``{"detail": ..., "code": ...}``, which also reads as DRF's ``ErrorDetail`` does.

    DRF's handler puts a dict detail in the body as it is, so the stable code is
    there; a project's handler that reads the code the documented way
    (``exc.detail.code``, ``str(exc.detail)`` for the message) gets the same.
    """

    def __init__(self, error: IdempotencyError) -> None:
        super().__init__(
            detail=ErrorDetail(error.detail, error.code), code=ErrorDetail(error.code, error.code)
        )
        self.code = error.code

    def __str__(self) -> str:
        return str(self["detail"])


class IdempotencyAPIException(APIException):
    """A protocol error as a DRF exception, for projects that render errors themselves.

    Its detail (``IdempotencyErrorDetail``) is ``{"detail": ..., "code": ...}``: DRF's
    exception handler (and any project handler built on it) puts both in the body,
    so the stable code survives ``ERROR_FORMAT = "drf"``. A handler that reads the
    code as DRF's exceptions give it gets it too: ``exc.get_codes()``,
    ``exc.detail.code``, ``exc.get_full_details()["code"]``, ``exc.default_code``.
    """

    def __init__(self, error: IdempotencyError) -> None:
        self.status_code = error_status(error)
        super().__init__(code=error.code)
        # Set after DRF's __init__, which would copy a dict detail into a plain dict.
        self.detail: IdempotencyErrorDetail = IdempotencyErrorDetail(error)  # type: ignore[assignment]
        self.default_code = error.code
        retry_after = getattr(error, "retry_after", None)  # KeyInUse, DatabaseUnavailable
        if retry_after is not None:
            self.wait = retry_after  # DRF's handler turns it into Retry-After

    # What an exception with one message answers (DRF's own, e.g. ``NotAuthenticated``),
    # not the dict of codes DRF gives for a dict detail.
    def get_codes(self) -> str:  # type: ignore[override]
        return self.detail.code

    def get_full_details(self) -> dict[str, str]:  # type: ignore[override]
        return {"message": str(self.detail), "code": self.detail.code}


class DRFAdapter(FrameworkAdapter):
    error_format = "drf"

    def parsed_body(self, request: Any) -> Any:
        if isinstance(request, Request):
            # DRF may already have consumed the stream (CSRF checks read it): use its parse.
            return request.data
        return super().parsed_body(request)

    def is_client_error(self, exc: Exception) -> bool:
        return isinstance(exc, APIException) and exc.status_code < 500

    def stored_representation(
        self, request: Any, response: HttpResponseBase
    ) -> HttpResponseBase | None:
        if not isinstance(response, Response):
            return None
        if not getattr(response, "accepted_renderer", None):
            view = (getattr(request, "parser_context", None) or {}).get("view")
            if view is not None:
                view.finalize_response(request, response)
        response.render()  # the first caller gets what it negotiated
        if not _is_html(response.accepted_renderer):
            return response
        # An HTML page (the browsable API's, with its CSRF token) is for the browser that
        # asked; every repeat, whatever it accepts, gets the API's own representation.
        context: Mapping[str, Any] = getattr(response, "renderer_context", None) or {}
        renderer = _api_renderer(context.get("view"))
        body = renderer.render(response.data, renderer.media_type, {**context})
        media_type, charset = renderer.media_type, renderer.charset
        content_type = f"{media_type}; charset={charset}" if charset else media_type
        stored = HttpResponse(body, status=response.status_code, content_type=content_type)
        for name, value in response.items():
            if name.lower() != "content-type":
                stored[name] = value
        return stored

    def error_response(self, request: Any, error: IdempotencyError) -> HttpResponseBase:
        exception = IdempotencyAPIException(error)
        if isinstance(request, Request):
            raise exception  # the view's handle_exception and the project's handler take it
        handler: Callable[..., Response | None] = api_settings.EXCEPTION_HANDLER  # type: ignore[assignment]
        response = handler(exception, {"request": request, "view": None, "args": (), "kwargs": {}})
        if response is None:
            return problem_response(error)
        response.accepted_renderer = JSONRenderer()
        response.accepted_media_type = "application/json"
        response.renderer_context = {"request": request, "response": response}  # type: ignore[attr-defined]
        response.render()
        return response


def exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponseBase | None:
    """DRF's exception handler, which also answers database outages with 503 and Retry-After.

    ``IdempotentMixin`` views do so by themselves; set this as ``EXCEPTION_HANDLER``
    for ``@api_view`` functions, whose authentication runs before ``@idempotent``.
    """
    # Imported here: rest_framework.views reads DEFAULT_RENDERER_CLASSES at import, which
    # may name this module's renderer while the app registry imports this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    response = _outage_answer(context.get("request"), exc)
    if response is None:
        response = drf_exception_handler(exc, context)
    return response


def _outage_answer(request: Any, exc: Exception) -> HttpResponseBase | None:
    """The 503 for a database outage, rendered as ``ERROR_FORMAT`` says; ``None`` otherwise."""
    if request is None or not is_outage(exc):
        return None
    try:
        return outage_response(request, exc)
    except IdempotencyAPIException as error:  # ERROR_FORMAT "drf": the project's handler renders it
        handler: Callable[..., Response | None] = api_settings.EXCEPTION_HANDLER  # type: ignore[assignment]
        view = (getattr(request, "parser_context", None) or {}).get("view")
        response = handler(error, {"request": request, "view": view, "args": (), "kwargs": {}})
        if response is not None:
            mark_logged(response)
        return response


def _is_html(renderer: BaseRenderer) -> bool:
    return str(renderer.media_type).split(";")[0].strip() == "text/html"


def _api_renderer(view: Any) -> BaseRenderer:
    """The view's first renderer that is not HTML: what a client accepting ``*/*`` gets."""
    renderers = view.get_renderers() if view is not None else []
    return next((r for r in renderers if not _is_html(r)), JSONRenderer())


register_adapter(DRFAdapter())


class IdempotentBrowsableAPIRenderer(BrowsableAPIRenderer):
    """DRF's browsable API, able to create on protected endpoints.

    Each page it renders carries a fresh key: in a hidden field of its HTML forms
    (``_idempotency_key``, read when the header is absent) and in the header of
    the requests its raw-data form sends. Submitting one page twice is one intent.
    """

    template = "idempotency/browsable_api.html"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> Any:
        self.idempotency_key = str(uuid.uuid4())
        return super().render(data, accepted_media_type, renderer_context)

    def get_context(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context(*args, **kwargs)
        context["idempotency_header"] = idempotency_settings.HEADER
        context["idempotency_key"] = self.idempotency_key
        return context

    def get_rendered_html_form(self, data: Any, view: Any, method: str, request: Any) -> Any:
        form = super().get_rendered_html_form(data, view, method, request)
        if not isinstance(form, str) or method in SAFE_METHODS:
            return form
        hidden = '{}<input type="hidden" name="{}" value="{}">'
        return format_html(hidden, form, KEY_FORM_FIELD, self.idempotency_key)
