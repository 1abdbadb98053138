"""drf-spectacular: document the idempotency of each protected operation.

Install it with ``pip install "django-idempotency[spectacular]"`` and make this
module's ``AutoSchema`` DRF's schema class::

    REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "idempotency.contrib.spectacular.AutoSchema"}

A project that has its own ``AutoSchema`` puts ``IdempotencySchemaMixin`` first
among its bases instead. Each protected operation (``create`` of a view with
``IdempotentCreateMixin``, the unsafe methods of an ``@idempotent`` view or
action) gets the key header, the 400/409/422 problem responses with their codes,
``Retry-After`` on 409 and ``Idempotent-Replayed`` on its 2xx responses; every
other operation is left as drf-spectacular describes it.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.plumbing import ComponentRegistry, ResolvedComponent

from idempotency import openapi
from idempotency.drf import IdempotentCreateMixin, IdempotentMixin
from idempotency.http import IdempotencyOptions

Operation = dict[str, Any]


class IdempotencySchemaMixin:
    """Adds the idempotency parameters and responses to drf-spectacular's operations."""

    view: Any
    method: str

    def get_operation(
        self,
        path: str,
        path_regex: str,
        path_prefix: str,
        method: str,
        registry: ComponentRegistry,
    ) -> Operation | None:
        operation: Operation | None = super().get_operation(  # type: ignore[misc]
            path, path_regex, path_prefix, method, registry
        )
        options = protection(self.view, method) if operation is not None else None
        if operation is None or options is None:
            return operation
        return describe(operation, options, registry)


class AutoSchema(IdempotencySchemaMixin, SpectacularAutoSchema):
    pass


def protection(view: Any, method: str) -> IdempotencyOptions | None:
    """The options ``view`` protects ``method`` with, or ``None`` if it does not."""
    if not openapi.protects(method):
        return None
    action = getattr(view, "action", None)
    if isinstance(view, IdempotentCreateMixin) and (action or method.lower()) in ("create", "post"):
        return _mixin_options(view)
    return _marked_options(getattr(view, action or method.lower(), None))


def _mixin_options(view: IdempotentMixin) -> IdempotencyOptions:
    if type(view).get_idempotency_key is not IdempotentMixin.get_idempotency_key:
        return IdempotencyOptions(key=view.get_idempotency_key)  # a key from elsewhere: no header
    return IdempotencyOptions(header=view.idempotency_header, required=view.idempotency_required)


def _marked_options(handler: Any) -> IdempotencyOptions | None:
    options = getattr(handler, "idempotency_options", None)
    if options is not None:
        return options  # type: ignore[no-any-return]
    # ``@api_view`` serves the function through a handler that closes over it.
    function = getattr(handler, "__func__", handler)
    for cell in getattr(function, "__closure__", None) or ():
        options = getattr(cell.cell_contents, "idempotency_options", None)
        if isinstance(options, IdempotencyOptions):
            return options
    return None


def describe(
    operation: Operation, options: IdempotencyOptions, registry: ComponentRegistry
) -> Operation:
    problem = ResolvedComponent(
        name=openapi.PROBLEM_COMPONENT,
        type=ResolvedComponent.SCHEMA,
        object=openapi.PROBLEM_COMPONENT,
        schema=openapi.problem_schema(),
    )
    registry.register_on_missing(problem)
    parameter = openapi.key_parameter(options)
    # A header the view already declares (``@extend_schema(parameters=...)``) is kept as is.
    declared = {(p["name"].lower(), p["in"]) for p in operation.get("parameters", [])}
    if parameter is not None and (parameter["name"].lower(), "header") not in declared:
        operation["parameters"] = [*operation.get("parameters", []), parameter]
    responses = operation.setdefault("responses", {})
    for status, extra in openapi.success_headers(list(responses)).items():
        responses[status].setdefault("headers", {}).update(extra["headers"])
    for status, response in openapi.error_responses(problem.ref).items():
        existing = responses.setdefault(str(status), {"description": response["description"]})
        existing.setdefault("content", {}).update(response["content"])
        existing.setdefault("headers", {}).update(response.get("headers", {}))
        if not existing["headers"]:
            del existing["headers"]
    return operation
