"""Each private framework API of ``idempotency.compat``, against the public path it replaces."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.signals import post_init, pre_init
from django.http import HttpRequest, HttpResponse, QueryDict
from django.test import RequestFactory
from django.utils.log import log_response
from ninja import NinjaAPI, Router, Schema
from ninja.decorators import decorate_view

from idempotency import compat
from idempotency.models import IdempotencyRecord
from tests.support.factories import IdempotencyRecordFactory

# --- record_from_db: Model.from_db ---------------------------------------------------


def _row(record: IdempotencyRecord, names: list[str]) -> list[Any]:
    return list(IdempotencyRecord.objects.filter(pk=record.pk).values_list(*names).get())


def _fields(record: IdempotencyRecord) -> dict[str, Any]:
    values = {name: value for name, value in vars(record).items() if name != "_state"}
    return {**values, "_state": (record._state.db, record._state.adding)}


@pytest.mark.django_db
@pytest.mark.parametrize("columns", ["all", "some"])
def test_a_record_from_a_row_is_the_one_from_db_makes(columns: str) -> None:
    stored = IdempotencyRecordFactory(succeeded=True)
    names = [field.attname for field in IdempotencyRecord._meta.concrete_fields]
    if columns == "some":
        names = names[:5]  # the rest deferred, read on first access by both
    values = _row(stored, names)
    fast = compat.record_from_db("default", names, values)
    public = IdempotencyRecord.from_db("default", names, values)
    assert _fields(fast) == _fields(public)
    assert fast.get_deferred_fields() == public.get_deferred_fields()
    assert fast.status == public.status  # a deferred field loads the same
    assert _fields(fast) == _fields(public)


@pytest.mark.django_db
@pytest.mark.parametrize("signal", [pre_init, post_init])
def test_a_listener_of_init_gets_its_signal_and_the_same_record(signal: Any) -> None:
    stored = IdempotencyRecordFactory()
    names = [field.attname for field in IdempotencyRecord._meta.concrete_fields]
    values = _row(stored, names)
    heard: list[Any] = []

    def listener(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs)

    signal.connect(listener, sender=IdempotencyRecord)
    try:
        fast = compat.record_from_db("default", names, values)
        assert len(heard) == 1
        public = IdempotencyRecord.from_db("default", names, values)
        assert len(heard) == 2
    finally:
        signal.disconnect(listener, sender=IdempotencyRecord)
    assert _fields(fast) == _fields(public)


# --- sql_literal: a bound parameter ----------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize("value", ["plain", "it's 100%", "", 0, 17.5, True, None, [1, "two"]])
def test_a_literal_reads_as_the_parameter_does(value: Any) -> None:
    with connection.cursor() as cursor:
        parameter = [value] if not isinstance(value, list) else [str(value)]
        cursor.execute("SELECT %s::text", parameter)
        bound = cursor.fetchone()[0]
        literal = compat.sql_literal(connection, parameter[0])
        cursor.execute(f"SELECT ({literal})::text")  # no parameters: no % to escape
        assert cursor.fetchone()[0] == bound


# --- query_parsed: request.GET ---------------------------------------------------------


def test_a_query_is_parsed_once_asked_for_or_set() -> None:
    request = RequestFactory().post("/orders/?page=2")
    assert not compat.query_parsed(request)
    assert request.GET["page"] == "2"
    assert compat.query_parsed(request)
    other = RequestFactory().post("/orders/")
    other.GET = QueryDict("page=3")
    assert compat.query_parsed(other)
    assert compat.query_parsed(HttpRequest())  # made in __init__: read as it is


# --- mark_logged: Django's log_response ------------------------------------------------


@pytest.mark.parametrize("marked", [False, True])
def test_a_marked_response_is_not_logged_again(
    caplog: pytest.LogCaptureFixture, marked: bool
) -> None:
    response = HttpResponse(status=503)
    if marked:
        compat.mark_logged(response)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        log_response("Service Unavailable", response=response, request=RequestFactory().post("/"))
    assert bool(caplog.records) is not marked


# --- non_atomic_aliases: @transaction.non_atomic_requests ------------------------------


def _view(request: HttpRequest) -> HttpResponse:
    return HttpResponse()


def test_the_aliases_a_view_is_exempted_from() -> None:
    assert compat.non_atomic_aliases(_view) == set()
    assert compat.non_atomic_aliases(None) == set()
    exempted = transaction.non_atomic_requests(lambda request: _view(request))
    assert compat.non_atomic_aliases(exempted) == {"default"}
    exempted = transaction.non_atomic_requests(using="other")(lambda request: _view(request))
    assert compat.non_atomic_aliases(exempted) == {"other"}


# --- django-ninja: on_ninja_operation and ninja_response --------------------------------


class Item(Schema):
    id: int
    name: str


def _serve(router: Router, path: str) -> Any:
    api = NinjaAPI(urls_namespace=f"compat-{id(router)}")
    api.add_router("", router)
    match = next(found for pattern in api.urls[0] if (found := pattern.resolve(path)))
    return api, match


def test_ninja_calls_back_with_each_operation_it_makes() -> None:
    seen: list[Any] = []

    def create(request: HttpRequest) -> dict[str, Any]:
        return {}

    compat.on_ninja_operation(create, seen.append)
    router = Router()
    router.post("/items/")(create)
    _serve(router, "items/")
    assert seen and all(operation.view_func is create for operation in seen)


@pytest.mark.parametrize(
    "result", [{"id": 1, "name": "book", "extra": "dropped"}, Item(id=2, name="pen")]
)
def test_a_converted_result_is_the_response_ninja_sends(result: Any) -> None:
    operations: list[Any] = []

    def create(request: HttpRequest) -> Any:
        return result

    def bound(run: Any) -> Any:
        # The operation mounted on the API (ninja clones each): the one that converts.
        operations.append(inspect.unwrap(run).__self__)
        return run

    decorate_view(bound)(create)
    router = Router()
    router.post("/items/", response={201: Item})(create)
    api, match = _serve(router, "items/")
    sent = match.func(RequestFactory().post("/items/"), *match.args, **match.kwargs)
    request = RequestFactory().post("/items/")
    converted = compat.ninja_response(
        operations[-1], request, result, api.create_temporal_response(request)
    )
    assert (converted.status_code, converted.content) == (sent.status_code, sent.content)
    assert converted["Content-Type"] == sent["Content-Type"]


# --- unlocked: a queryset built without select_for_update() -----------------------------


@pytest.mark.django_db
def test_an_unlocked_batch_is_the_batch_built_without_its_lock() -> None:
    records = IdempotencyRecord.objects.filter(status="SUCCEEDED").order_by("expires_at")
    locked = records.select_for_update(skip_locked=True)[:10]
    built_without = str(records[:10].query)
    assert str(compat.unlocked(locked).query) == built_without
    assert locked.query.select_for_update  # the batch it was given keeps its lock
    if connection.features.has_select_for_update_skip_locked:
        assert "SKIP LOCKED" in str(locked.query) and "FOR UPDATE" not in built_without


# --- without_filter_on: a queryset built without the filters on one field -------------------


@pytest.mark.django_db
def test_a_batch_without_its_status_filter_is_the_batch_built_without_it() -> None:
    recent = IdempotencyRecord.objects.filter(expires_at__isnull=False)
    records = recent.filter(status__in=["SUCCEEDED"], scope="s").order_by("expires_at")[:10]
    built_without = str(recent.filter(scope="s").order_by("expires_at")[:10].query)
    assert str(compat.without_filter_on(records, "status").query) == built_without
    assert "status" in str(records.query)  # the batch it was given keeps its filter
