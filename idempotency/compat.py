"""What this package takes from Django, DRF and django-ninja beyond their public API.

Each function names the public path it stands for and why that path was not
enough; ``tests/unit/test_compat.py`` pins each against that path, so a
release that changes one fails there, not in a request. Nothing else in the
package touches a private name of a framework.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from idempotency.models import IdempotencyRecord

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.http import HttpRequest, HttpResponse
    from django.http.response import HttpResponseBase


def record_from_db(alias: str, attnames: Sequence[str], values: Sequence[Any]) -> IdempotencyRecord:
    """The record a row of ``attnames`` read from ``alias`` holds: ``Model.from_db``, made cheap.

    Public path: ``IdempotencyRecord.from_db(alias, attnames, values)``. Its
    general path (``Model.__init__`` matching values to fields, deferred
    fields worked out) costs more than the statement that read the row; what it
    does for a row (one attribute per column, a ``ModelState`` bound to
    ``alias``) is done here directly. Values as the ORM's converters give them;
    the columns not among ``attnames`` are deferred. A project that listens to
    ``pre_init`` or ``post_init`` for the records gets them through ``from_db``,
    its signals sent.
    """
    if pre_init.has_listeners(IdempotencyRecord) or post_init.has_listeners(IdempotencyRecord):
        return IdempotencyRecord.from_db(alias, list(attnames), list(values))
    record = IdempotencyRecord.__new__(IdempotencyRecord)
    state = record._state = ModelState()
    state.adding, state.db = False, alias
    record.__dict__.update(zip(attnames, values, strict=True))
    return record


def sql_literal(connection: BaseDatabaseWrapper, value: Any) -> str:
    """``value`` as a literal of the connection's SQL (PostgreSQL's psycopg 3 only).

    Public path: passing ``value`` as a parameter of each statement. The claim
    statement is composed once per alias with its constant defaults written in,
    so that each claim binds only what the request fills in; Django's
    ``DatabaseOperations.compose_sql`` (psycopg's own quoting) is the one way
    to write a value as PostgreSQL reads it.
    """
    literal: str = connection.ops.compose_sql("%s", [value])  # type: ignore[attr-defined]
    return literal


def query_parsed(request: HttpRequest) -> bool:
    """Whether ``request.GET`` was made already (by a middleware, or set by hand).

    Public path: ``request.GET``, which parses the query string on first
    access. Most unsafe requests have none: the fingerprint asks this first so
    as not to make an empty ``QueryDict`` for each (a ``WSGIRequest`` keeps the
    parsed ``GET`` in its instance dictionary, a plain ``HttpRequest`` always).
    """
    return "GET" in vars(request)


def mark_logged(response: HttpResponseBase) -> None:
    """Keep Django's ``django.request`` logger from logging ``response`` again.

    Public path: none; Django's ``log_response`` skips a response whose
    ``_has_been_logged`` is set, which is how Django avoids logging one twice.
    A 503 answered to a database outage is logged once, by the
    ``database_unavailable`` signal.
    """
    response._has_been_logged = True  # type: ignore[attr-defined]


def non_atomic_aliases(view: Any) -> set[str]:
    """The aliases ``@transaction.non_atomic_requests`` exempts ``view`` from.

    Public path: the decorator sets this; Django's handler reads it
    (``BaseHandler.make_view_atomic``) and offers no reader of its own.
    """
    aliases: set[str] = getattr(view, "_non_atomic_requests", set())
    return aliases


def on_ninja_operation(function: Callable[..., Any], callback: Callable[[Any], None]) -> None:
    """Have django-ninja call ``callback(operation)`` when it makes an operation of ``function``.

    Public path: none documented; ``ninja.utils.contribute_operation_callback``
    (in its ``__all__``, used by ninja's own ``decorate_view`` and pagination)
    appends to the list ninja reads, and is used when ninja is loaded. Without
    ninja loaded no ninja operation can be made of ``function`` yet, and
    ``idempotency.decorators`` must not import ninja: the list is set directly.
    """
    utils = sys.modules.get("ninja.utils")
    if utils is not None:
        utils.contribute_operation_callback(function, callback)
        return
    callbacks = getattr(function, "_ninja_contribute_to_operation", None)
    if callbacks is None:
        function._ninja_contribute_to_operation = callbacks = []  # type: ignore[attr-defined]
    callbacks.append(callback)


def ninja_response(
    operation: Any, request: HttpRequest, result: Any, temporal: HttpResponse
) -> HttpResponseBase:
    """The response django-ninja makes of what an operation returned.

    Public path: returning ``result`` from the operation, ninja then validates
    it against the operation's response schema and renders it. The record must
    hold that response, and the protocol finishes the record before the
    operation returns: so the protected operation converts its result itself,
    with ninja's own converter (``Operation._result_to_response``), and ninja
    passes the response it gets through as it is. No public API of ninja
    converts a result (1.6 to 1.7; the ``ninja`` extra admits the releases tested).
    """
    response: HttpResponseBase = operation._result_to_response(request, result, temporal)
    return response


def unlocked(queryset: QuerySet[Any]) -> QuerySet[Any]:
    """``queryset`` without its ``FOR UPDATE`` (the purge's optimistic batch on PostgreSQL).

    Public path: a queryset built without ``select_for_update()``. The purge's batch
    is built once, locked, for every store (``retention.batch``); PostgreSQL's store
    first tries it unlocked, and a queryset offers no way to drop the lock again but
    the flag on its query.
    """
    clone = queryset.all()
    clone.query.select_for_update = False
    return clone


def without_filter_on(queryset: QuerySet[Any], name: str) -> QuerySet[Any]:
    """``queryset`` without its own filters on the field ``name`` (the purge's range bound).

    Public path: a queryset built without them. The purge's batch is built once, with
    every filter (``retention.purgeable``); the bound of a batch's range needs only the
    filters its index holds, so that the database reads the index alone (the status is
    checked again by the delete). A queryset offers no way to drop a filter but the
    children of its query's ``WHERE``, whose top level ANDs each ``filter()``'s lookups.
    """
    clone = queryset.all()
    where = clone.query.where
    where.children = [
        child
        for child in where.children
        if getattr(getattr(getattr(child, "lhs", None), "target", None), "name", None) != name
    ]
    return clone
