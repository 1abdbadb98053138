"""``@idempotent``: protect a plain Django view (sync or async), a DRF ``@api_view`` function
or a view method. Nothing here needs Django REST framework."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection
from functools import wraps
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from idempotency.core import InFlight, Mode
from idempotency.http import AnyRequest, IdempotencyOptions, aprotect, protect
from idempotency.resolvers import ResolverSpec, register

F = TypeVar("F", bound=Callable[..., Any])


def idempotent(
    *,
    operation: str | None = None,
    header: str | None = None,
    required: bool | None = None,
    # ``...``: a DRF view's callables take a ``Request``, a plain view's an ``HttpRequest``.
    key: Callable[..., str | None] | str | None = None,
    scope: Callable[..., str] | str | None = None,
    fingerprint: Callable[..., str | bytes] | str | None = None,
    fields: Collection[str] | None = None,
    exclude: Collection[str] = (),
    mode: Mode | None = None,
    lease_seconds: float | None = None,
    lock_timeout: float | None = None,
    outcome_policy: Callable[..., Any] | str | None = None,
    resolver: ResolverSpec | None = None,
    wait_seconds: float | None = None,
    in_flight: InFlight | None = None,
) -> Callable[[F], F]:
    """Make a view safe to retry.

    Put it *under* ``@api_view`` (and on the method of a class-based view or
    viewset action) so that authentication and permissions run first. An
    ``async def`` view stays async (see ``idempotency.http.aprotect``).
    """
    options = IdempotencyOptions(
        operation=operation,
        header=header,
        required=required,
        key=key,
        scope=scope,
        fingerprint=fingerprint,
        fields=fields,
        exclude=exclude,
        mode=mode,
        lease_seconds=lease_seconds,
        lock_timeout=lock_timeout,
        outcome_policy=outcome_policy,
        resolver=resolver,
        wait_seconds=wait_seconds,
        in_flight=in_flight,
    )

    def decorator(view: F) -> F:
        default_operation = f"{view.__module__}.{view.__qualname__}"
        if resolver is not None:
            # So that recovery, in a worker that never serves this view, finds it.
            register(options.operation or default_operation, resolver)

        if inspect.iscoroutinefunction(view):

            @wraps(view)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                request = _find_request(args, view)
                return await aprotect(
                    request, lambda: view(*args, **kwargs), options, default_operation
                )

            async_wrapper.idempotency_options = options  # type: ignore[attr-defined]
            return async_wrapper  # type: ignore[return-value]

        @wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = _find_request(args, view)
            return protect(request, lambda: view(*args, **kwargs), options, default_operation)

        # Read by the schema extensions (idempotency.contrib.spectacular).
        wrapper.idempotency_options = options  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator


def _find_request(args: tuple[Any, ...], view: Callable[..., Any]) -> AnyRequest:
    # A function view gets (request, ...); a method gets (self, request, ...).
    # A framework's request wraps Django's (DRF's keeps it in ``_request``).
    for candidate in args[:2]:
        if isinstance(candidate, HttpRequest) or isinstance(
            getattr(candidate, "_request", None), HttpRequest
        ):
            return candidate
    raise ImproperlyConfigured(
        f"@idempotent could not find the request among the arguments of {view.__qualname__}."
    )
