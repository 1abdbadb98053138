"""What a protected request is: its key, scope and fingerprint, read from the request.

The key from its header (or an HTML form's field), the scope from
``SCOPE_FUNCTION``, and the default fingerprint over the method, path, query
and canonical body (``idempotency.fingerprint`` canonicalises; this reads).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from functools import lru_cache
from importlib import import_module
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, RawPostDataException
from django.http.multipartparser import MultiPartParserError
from django.http.request import HttpHeaders

from idempotency.adapters import (
    UNPARSED,
    AnyRequest,
    django_request_of,
    is_client_error,
    parsed_body,
)
from idempotency.compat import query_parsed
from idempotency.conf import idempotency_settings, load_callable
from idempotency.exceptions import (
    KeyMissing,
    ScopeUnavailable,
)
from idempotency.fingerprint import canonical, digest_of, fingerprint, parse_json
from idempotency.keys import call_key_function, checked_key, parse_key, validate_key
from idempotency.options import IdempotencyOptions
from idempotency.protocol import Operation

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


# An HTML form, which cannot send headers, may carry the key in this field instead
# (the DRF browsable API's forms do). It is not part of the fingerprint.
KEY_FORM_FIELD = "_idempotency_key"


# Form fields that are not the request's business content: left out of the fingerprint.
_FORM_ONLY_FIELDS = (KEY_FORM_FIELD, "csrfmiddlewaretoken")


_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def read_operation(request: AnyRequest, options: IdempotencyOptions, name: str) -> Operation | None:
    """The operation ``request`` asks for under ``options``: its key, scope and fingerprint.

    ``None`` when it carries no key and need not (``required``, ``REQUIRE_KEY``).
    A body too deep to read is refused before any parser or key function runs.
    """
    django_request = django_request_of(request)
    _json_body(django_request)
    if options.key is None:
        key = _header_key(request, django_request, options.header, options.required)
    else:
        key = read_key(request, options)
    if key is None:
        return None
    return _operation(request, django_request, options, key, name)


def read_key(request: AnyRequest, options: IdempotencyOptions) -> str | None:
    if options.key is None:
        return header_key(request, options.header, options.required)
    function = _loaded(options.key, "key")
    key = call_key_function(function, lambda: function(request), passes=is_client_error)
    if key is not None:
        validate_key(checked_key(key, function), max_length=idempotency_settings.MAX_KEY_LENGTH)
        return str(key)
    if _required(options.required):
        name = getattr(function, "__qualname__", repr(function))
        raise KeyMissing(f"{KeyMissing.default_detail} The key function {name} found none (None).")
    return None


def _loaded(function: Callable[..., Any] | str, option: str) -> Callable[..., Any]:
    """A view's option given as a callable, or as its dotted path (imported once, kept)."""
    return function if callable(function) else load_callable(function, option)


def header_key(request: AnyRequest, header: str | None, required: bool | None) -> str | None:
    """The key of the ``header`` header (default ``HEADER``), or of the form's key field."""
    return _header_key(request, django_request_of(request), header, required)


def _header_key(
    request: AnyRequest, django_request: HttpRequest, header: str | None, required: bool | None
) -> str | None:
    raw = django_request.META.get(_meta_name(header or idempotency_settings.HEADER))
    if raw is None:
        raw = _form_key(request, django_request)
    if raw is not None:
        return parse_key(raw, max_length=idempotency_settings.MAX_KEY_LENGTH)
    if _required(required):
        raise KeyMissing()
    return None


def _required(required: bool | None) -> bool:
    return required if required is not None else idempotency_settings.REQUIRE_KEY


@lru_cache(maxsize=16)
def _meta_name(header: str) -> str:
    # Read from META as the server put it: ``request.headers`` would copy every header first.
    return HttpHeaders.to_wsgi_name(header)


def _form_key(request: AnyRequest, django_request: HttpRequest) -> str | None:
    if (django_request.content_type or "") not in _FORM_TYPES:
        return None
    data = parsed_body(request)
    try:
        form: Mapping[str, Any] = request.POST if data is UNPARSED else data
    except MultiPartParserError:
        return None  # no key to read; the view rejects the body
    value = form.get(KEY_FORM_FIELD)
    return None if value is None else str(value)


def build_operation(
    request: AnyRequest, options: IdempotencyOptions, key: str, name: str
) -> Operation:
    return _operation(request, django_request_of(request), options, key, name)


def _operation(
    request: AnyRequest,
    django_request: HttpRequest,
    options: IdempotencyOptions,
    key: str,
    name: str,
) -> Operation:
    scope_function = _loaded(options.scope or idempotency_settings.SCOPE_FUNCTION, "scope")
    return Operation.of(
        options,
        checked_scope(scope_function, scope_function(request, name)),
        key,
        request_hash(request, options),
        name,
        method=django_request.method or "",
        path=django_request.path,
    )


def checked_scope(function: Callable[..., Any], scope: object) -> str:
    """The scope a view's scope function gave, refused unless a non-empty string.

    ``None`` means it found no caller: refused as an anonymous request is (403), never
    turned into a scope of its own that every such caller would share.
    """
    if scope is None:
        raise ScopeUnavailable(
            f"The scope function {_name_of(function)} found no caller for this request."
        )
    if not isinstance(scope, str) or not scope:
        raise ImproperlyConfigured(
            f"The scope function {_name_of(function)} returned {scope!r}: it should return "
            "the scope as a non-empty string, or None for a request without a caller."
        )
    return scope


def _name_of(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


def request_hash(request: AnyRequest, options: IdempotencyOptions) -> bytes:
    """What the request's record keeps of its fingerprint (``digest_of``)."""
    if options.fingerprint is not None:
        material = _loaded(options.fingerprint, "fingerprint")(request)
        return digest_of(fingerprint([material]))
    return digest_of(fields_hash(request, options.fields, options.exclude))


def fields_hash(
    request: AnyRequest, fields: Collection[str] | None, exclude: Collection[str]
) -> str:
    """The request's hash by ``FINGERPRINT_FUNCTION``, over ``fields`` less ``exclude``."""
    function = idempotency_settings.FINGERPRINT_FUNCTION
    return str(function(request, fields=fields, exclude=exclude))


def default_scope(request: AnyRequest, operation: str) -> str:
    """``user:<pk>:<operation>``; anonymous callers have no scope and are refused.

    Where the request has a tenant (django-tenants' ``request.tenant``, other
    than the public schema), ``tenant:<schema>:user:<pk>:<operation>``: one
    user working in two tenants has two scopes.
    """
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        raise ScopeUnavailable()
    tenant = request_tenant(request)
    if tenant is not None:
        return f"tenant:{tenant}:user:{user.pk}:{operation}"
    return f"user:{user.pk}:{operation}"


def default_fingerprint(
    request: AnyRequest,
    *,
    fields: Collection[str] | None = None,
    exclude: Collection[str] = (),
) -> str:
    """SHA-256 of the method, the path, the sorted query and the canonical body."""
    django_request = django_request_of(request)
    # Most unsafe requests have no query string: "[]" without parsing one (unless the
    # request's GET was already made, or set by hand, when it is read as it is).
    has_query = query_parsed(django_request) or django_request.META.get("QUERY_STRING")
    query = sorted(django_request.GET.lists()) if has_query else []
    return fingerprint(
        [
            (django_request.method or "").upper(),
            django_request.path,
            json.dumps(query) if query else "[]",
            _canonical_body(request, django_request, fields, exclude),
        ]
    )


def _canonical_body(
    request: AnyRequest,
    django_request: HttpRequest,
    fields: Collection[str] | None,
    exclude: Collection[str],
) -> str | bytes:
    content_type = django_request.content_type or ""
    form = content_type in _FORM_TYPES
    if form:
        exclude = (*exclude, *_FORM_ONLY_FIELDS)
    exact = _json_body(django_request)
    if exact is not UNPARSED:
        if exact is _NOT_JSON:
            return request.body  # the view rejects it; the raw bytes still fingerprint it
        return canonical(exact, include=fields, exclude=exclude)
    data = parsed_body(request)
    if data is not UNPARSED:
        return canonical(data, include=fields, exclude=exclude)
    if form:
        try:
            fields_and_files: dict[str, list[Any]] = dict(request.POST.lists())
            fields_and_files.update(request.FILES.lists())
        except MultiPartParserError:
            return b""
        return canonical(fields_and_files, include=fields, exclude=exclude)
    return request.body


_NOT_JSON: Any = object()


def json_body(request: AnyRequest) -> Any:
    """The JSON body parsed exactly (numbers as ``Decimal``), for the fingerprint.

    ``UNPARSED`` when the request is not JSON or its body was already read as a
    stream (a framework's parse is used then), ``_NOT_JSON`` when it is malformed
    (the view rejects it; the raw bytes fingerprint it). ``RequestInvalid`` when it
    nests deeper than ``MAX_BODY_DEPTH`` or its bytes are not valid UTF-8 (surrogates
    included): every adapter calls this before the view runs. Parsed once per request.
    """
    return _json_body(django_request_of(request))


def _json_body(django_request: HttpRequest) -> Any:
    cached = getattr(django_request, "_idempotency_json", UNPARSED)
    if cached is not UNPARSED:
        return cached
    content_type = django_request.content_type or ""
    if not (content_type == "application/json" or content_type.endswith("+json")):
        return UNPARSED
    try:
        body = django_request.body
    except RawPostDataException:
        return UNPARSED
    try:
        parsed = parse_json(body) if body else _NOT_JSON
    except ValueError:
        parsed = _NOT_JSON
    django_request._idempotency_json = parsed  # type: ignore[attr-defined]
    return parsed


def request_tenant(request: Any) -> str | None:
    """The schema of the request's tenant (django-tenants' ``request.tenant``), but not public's."""
    tenant = getattr(request, "tenant", None)
    name = getattr(tenant, "schema_name", None)
    if name is None:
        return None
    if name == import_module("django_tenants.utils").get_public_schema_name():
        return None
    return str(name)
