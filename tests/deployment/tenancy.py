"""A tenant router of the usual shape: the middleware names the tenant, the router follows it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.http import HttpRequest, HttpResponseBase

TENANTS = ("tenant_a", "tenant_b")
current: ContextVar[str | None] = ContextVar("tenant", default=None)


@contextmanager
def tenant(alias: str | None) -> Iterator[None]:
    token = current.set(alias)
    try:
        yield
    finally:
        current.reset(token)


def tenant_middleware(
    get_response: Callable[[HttpRequest], HttpResponseBase],
) -> Callable[[HttpRequest], HttpResponseBase]:
    def middleware(request: HttpRequest) -> HttpResponseBase:
        name = request.headers.get("X-Tenant")
        with tenant(name if name in TENANTS else None):
            return get_response(request)

    return middleware


class TenantRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return current.get()

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return current.get()

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return True  # every database has every table: each tenant's own users, orders, records
