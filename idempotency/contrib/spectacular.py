"""drf-spectacular: document the idempotency of each protected operation.

Install it with ``pip install "django-idempotency[spectacular]"`` and make this
module's ``AutoSchema`` DRF's schema class::

    REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "idempotency.contrib.spectacular.AutoSchema"}

A project that has its own ``AutoSchema`` puts ``IdempotencySchemaMixin`` first
among its bases instead. Each protected operation (``create`` of a view with
``IdempotentCreateMixin``, the unsafe methods of an ``@idempotent`` view or
action) gets the key header, the 400/409/422 problem responses with their codes,
``Retry-After`` on 409 and the replay headers (``REPLAYED_HEADER``,
``Idempotency-Replay``) on its 2xx responses; every
other operation is left as drf-spectacular describes it.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.plumbing import ComponentRegistry, ResolvedComponent

from idempotency import openapi
from idempotency.drf import IdempotentCreateMixin, IdempotentMixin, _operation_name
from idempotency.options import IdempotencyOptions

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
        protected = protection(self.view, method) if operation is not None else None
        if operation is None or protected is None:
            return operation
        return describe(operation, *protected, registry)


class AutoSchema(IdempotencySchemaMixin, SpectacularAutoSchema):
    pass


def protection(view: Any, method: str) -> tuple[IdempotencyOptions, str] | None:
    """The options ``view`` protects ``method`` with and its operation name, or ``None``."""
    if not openapi.protects(method):
        return None
    action = getattr(view, "action", None) or method.lower()
    if isinstance(view, IdempotentCreateMixin) and action in ("create", "post"):
        name = view._idempotency_options.operation or _operation_name(type(view), action)
        return _mixin_options(view), name
    return _marked(getattr(view, action, None))


def _mixin_options(view: IdempotentMixin) -> IdempotencyOptions:
    if type(view).get_idempotency_key is not IdempotentMixin.get_idempotency_key:
        return IdempotencyOptions(key=view.get_idempotency_key)  # a key from elsewhere: no header
    options = view._idempotency_options
    return IdempotencyOptions(header=options.header, required=options.required)


def _marked(handler: Any) -> tuple[IdempotencyOptions, str] | None:
    """The options ``@idempotent`` left on ``handler``, and the operation it names by default."""
    # ``@api_view`` serves the function through a handler that closes over it.
    function = getattr(handler, "__func__", handler)
    cells = [cell.cell_contents for cell in getattr(function, "__closure__", None) or ()]
    for candidate in (handler, *cells):
        options = getattr(candidate, "idempotency_options", None)
        if isinstance(options, IdempotencyOptions):
            # ``functools.wraps`` gave the wrapper the view's own module and name.
            return options, f"{candidate.__module__}.{candidate.__qualname__}"
    return None


def describe(
    operation: Operation, options: IdempotencyOptions, name: str, registry: ComponentRegistry
) -> Operation:
    problem = _component(registry, openapi.PROBLEM_COMPONENT, openapi.error_schema())
    validation = _component(
        registry, openapi.VALIDATION_COMPONENT, openapi.drf_validation_error_schema()
    )
    parameter = openapi.key_parameter(options, name)
    # A header the view already declares (``@extend_schema(parameters=...)``) is kept as is.
    declared = {(p["name"].lower(), p["in"]) for p in operation.get("parameters", [])}
    if parameter is not None and (parameter["name"].lower(), "header") not in declared:
        operation["parameters"] = [*operation.get("parameters", []), parameter]
    responses = operation.setdefault("responses", {})
    for status, extra in openapi.success_headers(list(responses)).items():
        responses[status].setdefault("headers", {}).update(extra["headers"])
    # DRF answers 400 itself (validation, a body it cannot parse): both bodies are documented.
    framework = {
        400: (validation, "the request did not pass DRF's validation (`ValidationError`).")
    }
    for status, response in openapi.error_responses(problem, framework).items():
        existing = responses.get(str(status))
        if existing is None:
            responses[str(status)] = response
            continue
        # The view documents this status itself: its bodies stay, the problem is added.
        content = existing.setdefault("content", {})
        content.setdefault(openapi.error_media_type(), {"schema": problem})
        existing.setdefault("headers", {}).update(response.get("headers", {}))
        if not existing["headers"]:
            del existing["headers"]
    return operation


def _component(registry: ComponentRegistry, name: str, schema: dict[str, Any]) -> dict[str, str]:
    component = ResolvedComponent(
        name=name, type=ResolvedComponent.SCHEMA, object=name, schema=schema
    )
    registry.register_on_missing(component)
    return component.ref  # type: ignore[no-any-return]
