"""django.tasks tasks, and views that enqueue them, for tests/protocol/test_django_tasks.py.

The tasks run in django-tasks-db's ``db_worker`` (a process of its own) or in the test's.
``place_order``'s effect is an ``Order`` whose ``sku`` carries the key; ``charge_order``
charges a payment provider (tests.support.fake_provider) through a step of its attempt.
``checkout`` is an atomic-mode view that writes an ``Order`` and enqueues ``charge_order``
in its transaction: the task row commits with the record, or not at all.
"""

from __future__ import annotations

import json
import os
import signal
import time
from functools import partial
from typing import Any

import httpx
from django.contrib.auth import get_user_model
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from idempotency import idempotent
from idempotency.django_tasks import IdempotentTaskContext, idempotent_task
from idempotency.steps import current

from .lease_views import sku_for
from .models import Order

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]

LEASE_SECONDS = 1.0
# Set in a worker's environment: its run of a task prints what it did ("placed <ref>" once
# the order is written, uncommitted; "charged <order>" once the charge is in hand, and
# recorded for a recorded step), then hangs there until the test kills the worker.
HANG_IN_TASK = "IDEMPOTENCY_TEST_HANG_IN_TASK"


def _hang(done: str) -> None:
    if os.environ.get(HANG_IN_TASK):
        print(done, flush=True)
        time.sleep(60)


def _owner_id() -> int:
    user, _ = get_user_model().objects.get_or_create(username="shop")
    return int(user.pk)


@task()
@idempotent_task(
    key=lambda ref, **_: ref,
    scope=lambda ref, owner_id, **_: f"user:{owner_id}:orders",
    lock_timeout=30,  # a duplicate on another worker waits for the first's commit
)
def place_order(ref: str, owner_id: int, quantity: int = 1, seconds: float = 0) -> dict[str, int]:
    order = Order.objects.create(owner_id=owner_id, sku=sku_for(ref), quantity=quantity)
    _hang(f"placed {ref}")
    time.sleep(seconds)  # the first run holds the key while a duplicate arrives
    return {"order": order.pk, "quantity": quantity}


def charge(provider: str, amount: int, key: str) -> dict[str, Any]:
    answer = httpx.post(
        f"{provider}/charges",
        json={"amount": amount, "currency": "eur"},
        headers={"Idempotency-Key": key},
    )
    answer.raise_for_status()
    return dict(answer.json())


@task(takes_context=True)
@idempotent_task(
    key=lambda order, **_: order,
    mode="lease",
    lease_seconds=LEASE_SECONDS,
    # A lost run is run again: its charge is keyed by the step, so not made twice.
    resolver="idempotency.steps.effects_carry_step_keys",
)
def charge_order(
    context: IdempotentTaskContext, provider: str, order: str, amount: int
) -> dict[str, Any]:
    attempt = context.idempotency
    assert attempt is current()
    # Recorded: a later run of the intent gets the charge back without calling the provider.
    charged = attempt.step("charge", lambda key: charge(provider, amount, key))
    _hang(f"charged {order}")  # killed here: the provider answered, the record is not finished
    return {"charge": charged["id"], "attempt": context.attempt}


# -- a view that enqueues in its transaction ------------------------------------------------


def _checkout(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    ref = request.headers["Idempotency-Key"]
    if body.get("die_after_commit"):
        # The process dies as soon as its transaction has committed: before any answer,
        # and before any later on_commit hook.
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
    order = Order.objects.create(owner_id=_owner_id(), sku=sku_for(ref), quantity=1)
    enqueue = partial(charge_order.enqueue, provider=body["provider"], order=ref, amount=1)
    if body.get("on_commit"):
        # What a backend outside the database needs (or it escapes a rollback): the
        # enqueue waits for the commit, and a crash in between loses it.
        transaction.on_commit(enqueue)
        task = ""
    else:
        # django-tasks-db writes the task's row in this transaction: it commits with the
        # order and the record, or rolls back with them.
        task = str(enqueue().id)
    time.sleep(float(body.get("seconds", 0)))  # a duplicate arrives meanwhile
    if body.get("fail"):
        raise RuntimeError("the view failed after enqueuing")
    return JsonResponse({"order": order.pk, "task": task}, status=201)


def _scope(request: HttpRequest, operation: str) -> str:
    return "shop:checkout"


checkout = csrf_exempt(idempotent(scope=_scope)(_checkout))
# The record written once: a concurrent duplicate runs the view too, then rolls back.
checkout_run = csrf_exempt(idempotent(scope=_scope, in_flight="run")(_checkout))

urlpatterns = [
    path("checkout/", checkout),
    path("checkout-run/", checkout_run),
]
