"""``READ_FIRST``: a replay of a final record answered from one read, before any transaction.

Runs on every database (the PostgreSQL store composes its own read; the
others use the ORM's). The read may only answer a ``SUCCEEDED`` or
``FAILED_FINAL`` record of the same scope, key and request hash; everything
else takes the claim's path as without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from idempotency.exceptions import KeyInUse, KeyReused
from idempotency.models import IdempotencyRecord, Status
from idempotency.protocol import execute as core  # the module
from tests.support.factories import UserFactory
from tests.unit.protocol.test_execute import OTHER_HASH, Business, operation

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_share() -> Iterator[None]:
    saved = core.replay_share._shares
    core.replay_share._shares = {}
    yield
    core.replay_share._shares = saved


@pytest.fixture
def business() -> Business:
    return Business(owner=UserFactory())


def statements(run: Any) -> tuple[Any, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        result = run()
    return result, [query["sql"] for query in queries.captured_queries]


def only_the_read(sql: list[str]) -> bool:
    return len(sql) == 1 and sql[0].lstrip().upper().startswith("SELECT")


@override_settings(IDEMPOTENCY={"READ_FIRST": "always"})
def test_a_replay_of_a_final_record_is_one_read(business):
    business.run()
    result, sql = statements(business.run)
    assert result == "replayed"
    assert only_the_read(sql), sql
    assert business.runs == 1
    assert business.replays[-1].status == Status.SUCCEEDED


@override_settings(IDEMPOTENCY={"READ_FIRST": "always"})
def test_a_final_failure_is_replayed_from_the_read(business):
    business.run()
    IdempotencyRecord.objects.update(status=Status.FAILED_FINAL)
    result, sql = statements(business.run)
    assert result == "replayed"
    assert only_the_read(sql), sql
    assert business.replays[-1].status == Status.FAILED_FINAL


@override_settings(IDEMPOTENCY={"READ_FIRST": "always"})
def test_another_body_under_the_key_is_still_422(business):
    business.run()
    with pytest.raises(KeyReused):
        business.run(operation(request_hash=OTHER_HASH))
    assert business.runs == 1


@override_settings(IDEMPOTENCY={"READ_FIRST": "always"})
def test_another_scope_is_never_answered_from_the_read(business):
    business.run()
    assert business.run(operation(scope="user:2:tests.create_order")) is not None
    assert business.runs == 2
    assert business.replays == []


@override_settings(IDEMPOTENCY={"READ_FIRST": "always"})
def test_a_record_in_flight_is_not_answered_from_the_read(business):
    business.run()
    IdempotencyRecord.objects.update(status=Status.PROCESSING, lease_until=None)
    with pytest.raises(KeyInUse):
        business.run()
    assert business.replays == []


@override_settings(IDEMPOTENCY={"READ_FIRST": "always"})
def test_a_retryable_record_is_claimed_again(business):
    business.run()
    IdempotencyRecord.objects.update(status=Status.FAILED_RETRYABLE)
    business.run()
    assert business.runs == 2
    assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED


@override_settings(IDEMPOTENCY={"READ_FIRST": "never"})
def test_never_replays_through_the_claim(business):
    business.run()
    _, sql = statements(business.run)
    assert not only_the_read(sql), sql
    assert business.replays


def test_auto_reads_first_only_once_replays_are_common(business):
    business.run()
    _, sql = statements(business.run)  # one replay among few requests: the claim's path
    assert not only_the_read(sql), sql
    for _ in range(40):
        business.run()
    _, sql = statements(business.run)
    assert only_the_read(sql), sql


def test_auto_costs_first_requests_nothing_while_replays_are_rare(business):
    business.run(operation(key="first"))
    _, with_auto = statements(lambda: business.run(operation(key="second")))
    with override_settings(IDEMPOTENCY={"READ_FIRST": "never"}):
        _, without = statements(lambda: business.run(operation(key="third")))
    assert len(with_auto) == len(without)
    assert business.runs == 3
