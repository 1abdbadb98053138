"""``@idempotent``: protect a plain Django view (sync or async), a DRF ``@api_view`` function
or a view method. Nothing here needs Django REST framework."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar, overload

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from idempotency.compat import on_ninja_operation
from idempotency.http import AnyRequest, aprotect, decorate, protect
from idempotency.operations import declare
from idempotency.options import IdempotencyOptions
from idempotency.resolvers import register

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from idempotency.options import OptionArgs

F = TypeVar("F", bound=Callable[..., Any])


@overload
def idempotent(view: F, /) -> F: ...


@overload
def idempotent(view: None = None, /, **options: Unpack[OptionArgs]) -> Callable[[F], F]: ...


def idempotent(view: F | None = None, /, **options: Unpack[OptionArgs]) -> F | Callable[[F], F]:
    """Make a view safe to retry; ``@idempotent`` alone uses the settings.

    Put it *under* ``@api_view`` (and on the method of a class-based view or
    viewset action) so that authentication and permissions run first. An
    ``async def`` view stays async (see ``idempotency.http.aprotect``).
    """
    given = IdempotencyOptions(**options)  # the options: idempotency.options

    def decorator(view: F) -> F:
        refuse_wrong_target(view)
        default_operation = f"{view.__module__}.{view.__qualname__}"
        declare(given.operation or default_operation)
        if given.resolver is not None:
            # So that recovery, in a worker that never serves this view, finds it.
            register(given.operation or default_operation, given.resolver)

        if inspect.iscoroutinefunction(view):

            @wraps(view)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                request = _find_request(args, view)
                return await aprotect(
                    request, lambda: view(*args, **kwargs), given, default_operation
                )

            async_wrapper.idempotency_options = given  # type: ignore[attr-defined]
            return async_wrapper  # type: ignore[return-value]

        @wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = _find_request(args, view)
            return protect(request, lambda: view(*args, **kwargs), given, default_operation)

        # Read by the schema extensions (idempotency.contrib.spectacular).
        wrapper.idempotency_options = given  # type: ignore[attr-defined]
        _refuse_ninja_operation(wrapper)
        return wrapper  # type: ignore[return-value]

    return decorate(view, decorator)


_NINJA = (
    "idempotency.idempotent protects Django views; for a django-ninja operation use "
    "idempotency.ninja.idempotent, under @api.<method>(...)"
)


def refuse_wrong_target(view: Callable[..., Any]) -> None:
    """Refuse, at import, the decorations that would protect the wrong thing."""
    name = getattr(view, "__qualname__", repr(view))
    if hasattr(view, "_ninja_operation"):
        raise ImproperlyConfigured(f"{_NINJA} ({name}).")
    view_class = getattr(view, "view_class", None) or getattr(view, "cls", None)
    if view_class is None:
        return
    if hasattr(view, "actions"):  # a DRF viewset's as_view({...})
        raise ImproperlyConfigured(
            f"@idempotent decorates a function or a method, not {view_class.__qualname__}"
            ".as_view(): give the viewset IdempotentCreateMixin (it protects create), or "
            "put @idempotent(...) on the action method."
        )
    if hasattr(view, "cls"):  # DRF's APIView.as_view(), which @api_view returns
        raise ImproperlyConfigured(
            f"Put @idempotent under @api_view, not above it ({_api_view_function(view)}): "
            "above it, it would run "
            "before DRF authenticates the caller and parses the body. Write @api_view([...]), "
            "then the other DRF decorators, then @idempotent(...), then the function."
        )
    raise ImproperlyConfigured(
        f"@idempotent decorates a view function or method, not {view_class.__qualname__}"
        ".as_view(): decorate the handler (def post(...)) of the class, or wrap it with "
        "django.utils.decorators.method_decorator(idempotent(...), name='post')."
    )


def _api_view_function(view: Any) -> str:
    """The user's function behind ``@api_view``, not Django's ``View.as_view.<locals>.view``.

    ``api_view`` serves it from a handler method that closes over it, and gives its
    class the function's name and module (what is left when no handler is found).
    """
    view_class = view.cls
    for method in getattr(view_class, "http_method_names", ()):
        handler = vars(view_class).get(method)
        for cell in getattr(handler, "__closure__", None) or ():
            function = cell.cell_contents
            if callable(function) and hasattr(function, "__qualname__"):
                return f"{function.__module__}.{function.__qualname__}"
    return f"{view_class.__module__}.{view_class.__name__}"


def _refuse_ninja_operation(wrapper: Any) -> None:
    # django-ninja calls each of these with the operation it builds from the function
    # (idempotency.ninja uses the same hook): decorated with this decorator under a
    # ninja route, the function fails at import with the fix, not at its first request.
    def refuse(operation: Any) -> None:
        raise ImproperlyConfigured(f"{_NINJA} ({wrapper.__qualname__}).")

    on_ninja_operation(wrapper, refuse)


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
