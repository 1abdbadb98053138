"""A protected call on another thread, inside an atomic-mode attempt, keeps its own transaction.

Context variables are copied into other threads (``copy_context().run``,
``asyncio.to_thread``, ``sync_to_async``), Django's connections are not: whatever
the outer attempt shares must stay on the outer thread's connection. Otherwise
the inner call's record would be written in the outer transaction while its
business writes commit on its own thread's connection, and a retry of the
inner call would run its effect again.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection

from idempotency import idempotent_function
from idempotency.models import IdempotencyRecord, Status
from tests.support.factories import UserFactory
from tests.testapp.models import Order

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class OuterFailed(Exception):
    pass


def _closing(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``func`` and close the thread's own connection, as Django does after a request."""

    def run(*args: Any) -> Any:
        try:
            return func(*args)
        finally:
            connection.close()

    return run


def in_copied_context_thread(func: Callable[..., Any], *args: Any) -> Any:
    results: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            results.append(_closing(func)(*args))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=contextvars.copy_context().run, args=(target,))
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


def in_asyncio_to_thread(func: Callable[..., Any], *args: Any) -> Any:
    async def run() -> Any:
        return await asyncio.to_thread(_closing(func), *args)

    return asyncio.run(run())


def in_sync_to_async_thread(func: Callable[..., Any], *args: Any) -> Any:
    return async_to_sync(sync_to_async(_closing(func), thread_sensitive=False))(*args)


THREADS = {
    "copy_context().run in a thread": in_copied_context_thread,
    "asyncio.to_thread": in_asyncio_to_thread,
    "sync_to_async(thread_sensitive=False)": in_sync_to_async_thread,
}


@pytest.mark.parametrize("run_elsewhere", THREADS.values(), ids=THREADS.keys())
def test_inner_effect_is_committed_if_and_only_if_its_record_is(run_elsewhere):
    owner = UserFactory()
    runs: list[str] = []

    @idempotent_function(scope="cross-thread:inner", key=lambda ref: ref)
    def place_order(ref: str) -> int:
        runs.append(ref)
        return Order.objects.create(owner=owner, sku=ref, quantity=1).pk

    @idempotent_function(scope="cross-thread:outer", key=lambda ref: ref)
    def batch(ref: str) -> None:
        run_elsewhere(place_order, "inner-1")
        raise OuterFailed(ref)

    with pytest.raises(OuterFailed):
        batch("outer-1")

    effect = Order.objects.filter(sku="inner-1").exists()
    record = IdempotencyRecord.objects.filter(scope__endswith="inner", idem_key="inner-1")
    assert effect, "the inner call committed on its own thread's connection"
    assert record.filter(status=Status.SUCCEEDED).exists(), "its record committed beside it"
    assert not IdempotencyRecord.objects.filter(idem_key="outer-1").exists()

    first = Order.objects.get(sku="inner-1").pk
    assert place_order("inner-1") == first  # the retry replays, it does not run again
    assert runs == ["inner-1"]
    assert Order.objects.filter(sku="inner-1").count() == 1
