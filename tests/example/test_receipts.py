"""The example's receipts: a protected view that enqueues a protected ``django.tasks`` task.

``POST /api/orders/{id}/receipt/`` enqueues ``issue_receipt`` in its atomic-mode
transaction (django-tasks-db: the task is a row of the records' database), and
django-tasks-db's worker runs it here, in this process, as docs/tasks.md does.
Through DRF's test client, on SQLite and PostgreSQL; tests/example/test_http.py
does the same over HTTP with a ``db_worker`` process.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django_tasks_db.compat import TaskResultStatus
from django_tasks_db.models import DBTaskResult
from rest_framework.test import APIClient

from example_project.shop import views
from example_project.shop.models import Order, Receipt
from example_project.shop.tasks import issue_receipt
from idempotency.models import IdempotencyRecord
from tests.example.conftest import basic

# A worker commits its runs: the tests' data must be committed for it to see, as in a project.
pytestmark = pytest.mark.django_db(transaction=True)

TASK_PATH = "example_project.shop.tasks.issue_receipt"
SIGNALS = [signal.SIGINT, signal.SIGTERM, *([signal.SIGQUIT] if hasattr(signal, "SIGQUIT") else [])]


def run_the_worker() -> None:
    """``manage.py db_worker`` in this process: every task ready, then back."""
    handlers = {number: signal.getsignal(number) for number in SIGNALS}
    try:
        call_command("db_worker", "--batch", "--no-startup-delay", verbosity=0)
    finally:
        for number, handler in handlers.items():  # the worker took them for its shutdown
            signal.signal(number, handler)


@pytest.fixture
def client(alice: User) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=basic("alice", "alice-password"))
    return api


@pytest.fixture
def order(alice: User) -> Order:
    return Order.objects.create(owner=alice, sku="BOOK-1", quantity=1)


def ask(client: APIClient, order: Order, key: str | None) -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post(f"/api/orders/{order.pk}/receipt/", headers=headers)


def tasks() -> list[DBTaskResult]:
    return list(DBTaskResult.objects.filter(task_path=TASK_PATH))


def test_the_same_key_twice_enqueues_one_task_and_the_worker_issues_one_receipt(client, order):
    first = ask(client, order, "receipt-1")
    again = ask(client, order, "receipt-1")

    assert first.status_code == again.status_code == 202
    assert "Idempotent-Replayed" not in first and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json() == {"order": order.pk, "task_id": first.json()["task_id"]}
    [enqueued] = tasks()  # the retry enqueued nothing
    assert str(enqueued.pk) == first.json()["task_id"]
    assert enqueued.args_kwargs == {"args": [order.pk], "kwargs": {}}
    assert client.get(f"/api/orders/{order.pk}/receipt/").status_code == 404  # not run yet

    run_the_worker()

    receipt = Receipt.objects.get()
    enqueued.refresh_from_db()
    assert enqueued.status == TaskResultStatus.SUCCESSFUL
    shown = client.get(f"/api/orders/{order.pk}/receipt/")
    assert shown.status_code == 200
    assert shown.json() == {
        "id": receipt.pk,
        "order": order.pk,
        "issued_at": shown.json()["issued_at"],
    }


def test_new_keys_enqueue_again_and_the_task_answers_with_the_first_receipt(client, order):
    # A client that lost the first answer and retried with a new key: a second request,
    # a second task, and still one receipt: the task is keyed by the order.
    assert ask(client, order, "receipt-a").status_code == 202
    assert ask(client, order, "receipt-b").status_code == 202
    run_the_worker()
    assert ask(client, order, "receipt-c").status_code == 202  # after the receipt was issued
    run_the_worker()

    receipt = Receipt.objects.get(order=order)
    results = [row.task_result for row in tasks()]
    assert len(results) == 3
    assert {result.status for result in results} == {TaskResultStatus.SUCCESSFUL}
    assert {result.return_value["receipt"] for result in results} == {receipt.pk}
    assert len({result.return_value["issued_at"] for result in results}) == 1
    assert IdempotencyRecord.objects.filter(scope="receipts", idem_key=str(order.pk)).count() == 1


def test_a_view_that_fails_after_enqueuing_rolls_its_task_back(client, order, monkeypatch):
    class EnqueueThenFail:
        def enqueue(self, *args: Any) -> None:
            issue_receipt.enqueue(*args)  # the real one: its row is written, then...
            raise RuntimeError("the view fails after enqueuing")

    monkeypatch.setattr(views, "issue_receipt", EnqueueThenFail())
    with pytest.raises(RuntimeError):
        ask(client, order, "receipt-broken")

    assert tasks() == []  # rolled back with the record and the view's writes
    assert not IdempotencyRecord.objects.filter(idem_key="receipt-broken").exists()

    monkeypatch.undo()
    retried = ask(client, order, "receipt-broken")  # the key is free: the retry runs
    assert retried.status_code == 202 and "Idempotent-Replayed" not in retried
    run_the_worker()
    assert [str(row.pk) for row in tasks()] == [retried.json()["task_id"]]
    assert Receipt.objects.filter(order=order).count() == 1


@pytest.fixture
def bobs_order() -> Order:
    bob = User.objects.create_user("bob", password="bob-password")
    return Order.objects.create(owner=bob, sku="BOOK-2", quantity=1)


def test_refused_requests_enqueue_nothing(client, order, bobs_order):
    without_key = ask(client, order, None)
    not_hers = ask(client, bobs_order, "receipt-x")
    assert ask(client, order, "receipt-x").status_code == 202
    other_order = ask(
        client, Order.objects.create(owner=order.owner, sku="B", quantity=1), "receipt-x"
    )

    assert without_key.status_code == 400
    assert without_key.json()["code"] == "idempotency_key_missing"
    assert not_hers.status_code == 404  # the queryset is the caller's orders
    assert other_order.status_code == 422  # the same key for another order's receipt
    assert other_order.json()["code"] == "idempotency_key_reused"
    assert len(tasks()) == 1
