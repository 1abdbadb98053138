"""DRF integration: ``IdempotentCreateMixin`` and the hooks it shares with other views."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from django.http.response import HttpResponseBase
from rest_framework.request import Request

from idempotency.conf import idempotency_settings
from idempotency.core import Mode
from idempotency.http import IdempotencyOptions, protect, read_key, request_hash
from idempotency.models import Status
from idempotency.resolvers import ResolverSpec, register


def _operation_name(view: type, action: str) -> str:
    return f"{view.__module__}.{view.__qualname__}.{action}"


class IdempotentMixin:
    """Hooks and options for DRF views; call ``run_idempotently`` around an unsafe handler.

    Each ``get_idempotency_*`` hook can be overridden on a view; each class
    attribute left at ``None`` falls back to the ``IDEMPOTENCY`` setting.
    """

    idempotency_operation: str | None = None
    idempotency_header: str | None = None
    idempotency_required: bool | None = None
    idempotency_fields: Collection[str] | None = None
    idempotency_exclude: Collection[str] = ()
    idempotency_mode: Mode | None = None
    idempotency_lease_seconds: float | None = None
    idempotency_lock_timeout: float | None = None
    idempotency_wait_seconds: float | None = None
    # A callable or dotted path (see idempotency.resolvers); set on the class.
    idempotency_resolver: ResolverSpec | None = None
    # Operation names ``idempotency_resolver`` is registered under for recovery.
    idempotency_resolved_actions: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        resolver = cls.idempotency_resolver
        if resolver is None:
            return
        # Recovery runs where no request ever reached this view: register it by name now.
        names = (
            [cls.idempotency_operation]
            if cls.idempotency_operation
            else [_operation_name(cls, action) for action in cls.idempotency_resolved_actions]
        )
        for name in names:
            register(name, resolver)

    def get_idempotency_key(self, request: Request) -> str | None:
        options = IdempotencyOptions(
            header=self.idempotency_header, required=self.idempotency_required
        )
        return read_key(request, options)

    def get_idempotency_scope(self, request: Request, operation: str) -> str:
        return str(idempotency_settings.SCOPE_FUNCTION(request, operation))

    def get_idempotency_fingerprint(self, request: Request) -> str:
        options = IdempotencyOptions(
            fields=self.idempotency_fields, exclude=self.idempotency_exclude
        )
        return request_hash(request, options)

    def get_idempotency_outcome(self, response: HttpResponseBase) -> Status | None:
        policy: Callable[[HttpResponseBase], Status | None] = idempotency_settings.OUTCOME_POLICY
        return policy(response)

    def get_idempotency_operation(self) -> str:
        if self.idempotency_operation:
            return self.idempotency_operation
        action = getattr(self, "action", None) or self.request.method.lower()  # type: ignore[attr-defined]
        return _operation_name(type(self), action)

    def get_idempotency_options(self) -> IdempotencyOptions:
        return IdempotencyOptions(
            operation=self.get_idempotency_operation(),
            # The options' required check is done by get_idempotency_key itself.
            required=False,
            key=self.get_idempotency_key,
            scope=self.get_idempotency_scope,
            fingerprint=self.get_idempotency_fingerprint,
            mode=self.idempotency_mode,
            lease_seconds=self.idempotency_lease_seconds,
            lock_timeout=self.idempotency_lock_timeout,
            outcome_policy=self.get_idempotency_outcome,
            # Read from the class: a function stored on it must not become a bound method.
            resolver=type(self).idempotency_resolver,
            wait_seconds=self.idempotency_wait_seconds,
        )

    def run_idempotently(
        self, request: Request, handler: Callable[[], HttpResponseBase]
    ) -> HttpResponseBase:
        options = self.get_idempotency_options()
        return protect(request, handler, options, options.operation or "")


class IdempotentCreateMixin(IdempotentMixin):
    """Protects ``create`` of a DRF generic view or viewset; put it before the DRF mixins."""

    idempotency_resolved_actions = ("create", "post")

    # ``Any``, not ``HttpResponseBase``: DRF's stubs type ``CreateModelMixin.create`` as
    # returning ``Response``, and a narrower type here would make mypy reject every
    # user's ``class V(IdempotentCreateMixin, ModelViewSet)``. Replays are ``HttpResponse``.
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        return self.run_idempotently(
            request,
            lambda: super(IdempotentCreateMixin, self).create(request, *args, **kwargs),  # type: ignore[misc]
        )
