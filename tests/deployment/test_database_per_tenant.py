"""A database per tenant behind a router: records follow each tenant's writes.

Run with ``--ds=tests.deployment.shards_settings`` (scripts/test.sh, the tenants pass).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError
from django.db import connections
from django.test import Client, override_settings

from idempotency.exceptions import CrossDatabaseWrite
from idempotency.models import IdempotencyRecord, Status
from idempotency.tasks import purge_expired_records, recover_expired_leases
from tests.deployment.support import together
from tests.deployment.tenancy import TENANTS, tenant
from tests.support import output
from tests.support.factories import IdempotencyRecordFactory
from tests.support.output import timeless
from tests.testapp.models import Order

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.tenants,
    pytest.mark.django_db(transaction=True, databases="__all__"),
]

ALIASES = ("default", *TENANTS)
DUPLICATES = 6
# The same user id in every tenant: each tenant's database has its own users.
USER_ID = 7


@pytest.fixture(autouse=True)
def _database_per_tenant() -> None:
    assert set(connections.settings) == set(ALIASES), "run with tests.deployment.shards_settings"


@pytest.fixture
def clients() -> dict[str, Client]:
    """A logged-in client per tenant, for a user of that tenant's own database."""
    made = {}
    for alias in TENANTS:
        with tenant(alias):
            user = get_user_model().objects.create_user(pk=USER_ID, username=f"owner-{alias}")
            client = Client(headers={"X-Tenant": alias})
            client.force_login(user)
        made[alias] = client
    return made


def post(client: Client, path: str, key: str, sku: str = "book", pause: float = 0) -> Any:
    headers = {"Idempotency-Key": key, "X-Sku": sku, "X-Pause": str(pause)}
    return client.post(path, headers=headers)


def records(alias: str) -> list[str]:
    return sorted(IdempotencyRecord.objects.using(alias).values_list("idem_key", flat=True))


def skus(alias: str) -> Counter[str]:
    return Counter(Order.objects.using(alias).values_list("sku", flat=True))


@pytest.mark.parametrize("path", ["/orders/", "/orders/leased/"])
@override_settings(IDEMPOTENCY={"MAX_WAITERS": 64})  # every duplicate of the pass waits at once
def test_concurrent_duplicates_in_two_tenants_one_effect_per_key_per_tenant(clients, path):
    keys = [f"key-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    calls = [(alias, key) for alias in TENANTS for key in keys for _ in range(DUPLICATES)]

    def call(index: int) -> tuple[str, str, int, bytes]:
        alias, key = calls[index]
        response = post(clients[alias], path, key, sku=f"{alias}:{key}", pause=0.3)
        return alias, key, response.status_code, response.content

    answers = together(len(calls), call)

    assert {status for *_, status, _ in answers} == {201}
    for alias in TENANTS:
        for key in keys:
            bodies = {body for a, k, _, body in answers if (a, k) == (alias, key)}
            assert len(bodies) == 1, (alias, key, bodies)
            assert json.loads(bodies.pop())["sku"] == f"{alias}:{key}"
        # One order per key, each in its tenant's database, and the records beside them.
        assert skus(alias) == Counter({f"{alias}:{key}": 1 for key in keys})
        assert records(alias) == sorted(keys)
    assert records("default") == []
    assert skus("default") == Counter()


@override_settings(
    IDEMPOTENCY={"REPLAY_CACHE": "replay"},
    CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "replay": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    },
)
def test_same_key_and_user_id_in_two_tenants_never_answered_across_them(clients):
    """The default scope is ``user:7:...`` in both tenants; the cache keys name the database."""
    first = post(clients["tenant_a"], "/orders/", "shared", sku="alpha")
    replay = post(clients["tenant_a"], "/orders/", "shared", sku="alpha")  # cached now
    other = post(clients["tenant_b"], "/orders/", "shared", sku="alpha")

    assert first.status_code == other.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in other.headers
    assert skus("tenant_a") == skus("tenant_b") == Counter({"alpha": 1})
    assert records("tenant_a") == records("tenant_b") == ["shared"]


def test_a_write_to_another_database_than_the_records_is_refused_and_says_what_to_set(clients):
    with pytest.raises(
        CrossDatabaseWrite, match=r"'tenant_a' wrote to 'tenant_b'.*using='tenant_b'"
    ):
        post(clients["tenant_a"], "/orders/elsewhere/", "stray")

    assert skus("tenant_b") == Counter()
    assert records("tenant_a") == records("tenant_b") == []


@override_settings(IDEMPOTENCY={"WRITE_GUARD": False})
def test_the_guard_turned_off_lets_the_write_through(clients):
    assert post(clients["tenant_a"], "/orders/elsewhere/", "stray").status_code == 201

    assert skus("tenant_b") == Counter({"book": 1})
    assert records("tenant_a") == ["stray"]


def test_a_view_that_names_its_database_keeps_its_records_there(clients):
    assert post(clients["tenant_a"], "/orders/in-b/", "named").status_code == 201
    replay = post(clients["tenant_a"], "/orders/in-b/", "named")

    assert replay.headers["Idempotent-Replayed"] == "true"
    assert skus("tenant_b") == Counter({"book": 1})
    assert records("tenant_b") == ["named"]
    assert records("tenant_a") == []


def test_the_router_gets_the_scope_as_a_hint(monkeypatch):
    from idempotency.stores import records_database
    from tests.deployment.tenancy import TenantRouter

    seen: list[dict[str, Any]] = []
    original = TenantRouter.db_for_write

    def spy(self: Any, model: Any, **hints: Any) -> str | None:
        seen.append(hints)
        return original(self, model, **hints)

    monkeypatch.setattr(TenantRouter, "db_for_write", spy)
    with tenant("tenant_b"):
        assert records_database(scope="tenant-b:user:7") == "tenant_b"
    assert seen == [{"instance": None, "scope": "tenant-b:user:7"}]


def seed(alias: str, expired: int, stuck: int) -> None:
    """Expired records (purge's) and expired leases (recovery's) in ``alias``."""
    with tenant(None if alias == "default" else alias):
        for _ in range(expired):
            IdempotencyRecordFactory(expired=True)
        for _ in range(stuck):
            IdempotencyRecordFactory(expired_lease=True)


def statuses(alias: str) -> Counter[str]:
    return Counter(IdempotencyRecord.objects.using(alias).values_list("status", flat=True))


def run(command: str, *args: str) -> str:
    return timeless(output.run(command, *args))


def test_cleanup_purges_every_database_that_holds_records_and_names_each():
    for alias, count in zip(ALIASES, (1, 2, 3), strict=True):
        seed(alias, expired=count, stuck=0)

    assert run("idempotency_cleanup", "--dry-run") == (
        "default: would purge 1 record.\n"
        "tenant_a: would purge 2 records.\n"
        "tenant_b: would purge 3 records.\n"
        "Would purge 6 records in 3 shards.\n"
    )
    assert run("idempotency_cleanup", "--database", "tenant_b") == "Purged 3 records.\n"
    assert run("idempotency_cleanup").endswith("Purged 3 records in 3 shards.\n")
    assert all(statuses(alias) == Counter() for alias in ALIASES)


@override_settings(IDEMPOTENCY={"RELEASE_EXPIRED_WITHOUT_RESOLVER": True})
def test_recover_settles_expired_leases_in_every_database():
    for alias, count in zip(ALIASES, (1, 2, 3), strict=True):
        seed(alias, expired=0, stuck=count)

    out = run("idempotency_recover")

    assert "tenant_a: Recovered 2 records: 0 succeeded, 2 released for retry" in out
    assert out.splitlines()[-1].startswith("Recovered 6 records: 0 succeeded, 6 released")
    assert out.splitlines()[-1].endswith(" in 3 shards.")
    for alias, count in zip(ALIASES, (1, 2, 3), strict=True):
        assert statuses(alias) == Counter({Status.FAILED_RETRYABLE: count})


def test_progress_names_each_shard_it_is_in():
    for alias in ALIASES:
        seed(alias, expired=2, stuck=0)

    out = output.run("idempotency_cleanup", "--batch-size", "1", "--progress-every", "0")

    started = [line.split(",")[:2] for line in out.splitlines() if " 1 batch," in line]
    assert started == [[f"Purging {alias}... 1 batch", " 1/2 records (50%)"] for alias in ALIASES]


def test_records_chosen_by_id_are_looked_for_in_one_database():
    seed("tenant_a", expired=0, stuck=1)
    stuck = IdempotencyRecord.objects.using("tenant_a").get()

    with pytest.raises(CommandError, match=r"--id takes records of one shard; there are 3 "):
        run("idempotency_recover", "--id", str(stuck.pk), "--mark", "retry")
    assert run(
        "idempotency_recover", "--database", "tenant_a", "--id", str(stuck.pk), "--mark", "retry"
    ).endswith("Changed 1 record.\n")
    assert statuses("tenant_a") == Counter({Status.FAILED_RETRYABLE: 1})


@override_settings(IDEMPOTENCY={"RELEASE_EXPIRED_WITHOUT_RESOLVER": True})
def test_the_beat_tasks_fan_out_as_the_commands_do():
    for alias in ALIASES:
        seed(alias, expired=2, stuck=1)

    assert recover_expired_leases()["released"] == 3
    assert purge_expired_records() == 6
    assert all(statuses(alias) == Counter({Status.FAILED_RETRYABLE: 1}) for alias in ALIASES)


def test_a_database_that_is_not_one_is_refused():
    with pytest.raises(CommandError, match="--database should be an alias of DATABASES"):
        run("idempotency_cleanup", "--database", "tenant_c")
