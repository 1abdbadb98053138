"""A schema per tenant with django-tenants: nothing is answered across tenants.

Two tenants, ``alpha`` and ``beta``, reached by their hostnames; users live in the
public schema, so one user (one ``pk``) works in both. Run with
``--ds=tests.deployment.tenants_settings`` (scripts/test.sh, the tenants pass).
"""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client, override_settings

from idempotency.models import IdempotencyRecord, Status
from idempotency.stores.postgres_waiting import channel
from idempotency.tasks import purge_expired_records, recover_expired_leases
from tests.deployment.support import together
from tests.support import output
from tests.support.factories import IdempotencyRecordFactory
from tests.support.output import timeless

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.tenants,
    pytest.mark.django_db(transaction=True),
]

TENANTS = ("alpha", "beta")
DUPLICATES = 5
REPLAY_CACHE = {
    "IDEMPOTENCY": {"REPLAY_CACHE": "replay", "MAX_WAITERS": 64},
    "CACHES": {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "replay": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    },
}


@pytest.fixture(autouse=True)
def tenants() -> Iterator[None]:
    """Both tenants and their hostnames; their schemas are made (and migrated) once.

    Afterwards the connection goes back to the public schema, which the test
    client's requests left: the flush after the test empties the current schema.
    """
    assert settings.DATABASES["default"]["ENGINE"] == "django_tenants.postgresql_backend", (
        "run with tests.deployment.tenants_settings"
    )
    from tests.deployment.customers.models import Customer, Domain

    for name in TENANTS:
        customer, _ = Customer.objects.get_or_create(schema_name=name, defaults={"name": name})
        Domain.objects.get_or_create(domain=f"{name}.localhost", tenant=customer)
    yield
    connection.set_schema_to_public()


@pytest.fixture
def user() -> Any:
    return get_user_model().objects.create_superuser(username="both", password="pw")


def client_for(name: str, user: Any) -> Client:
    client = Client(HTTP_HOST=f"{name}.localhost")
    client.force_login(user)
    return client


def in_schema(name: str, read: Any) -> Any:
    connection.set_schema(name)
    try:
        return read()
    finally:
        connection.set_schema_to_public()


def purchases(name: str, tag: str) -> Counter[str]:
    """The purchases of this test (tagged): tenant schemas are not emptied between tests."""
    from tests.deployment.shop.models import Purchase

    chosen = Purchase.objects.filter(sku__contains=tag)
    return in_schema(name, lambda: Counter(chosen.values_list("sku", flat=True)))


def keys(name: str) -> list[str]:
    return in_schema(
        name, lambda: sorted(IdempotencyRecord.objects.values_list("idem_key", flat=True))
    )


def post(client: Client, path: str, key: str, sku: str, pause: float = 0) -> Any:
    headers = {"Idempotency-Key": key, "X-Sku": sku, "X-Pause": str(pause)}
    return client.post(path, headers=headers)


@override_settings(**REPLAY_CACHE)
@pytest.mark.parametrize(
    "path",
    [
        "/purchases/",
        "/purchases/leased/",
        "/purchases/shared-scope/",
        "/purchases/shared-scope/leased/",
    ],
)
def test_concurrent_duplicates_in_two_schemas_one_effect_per_key_per_tenant(user, path):
    """Atomic and lease mode (waiting on LISTEN), the default scope and one naming no tenant."""
    tag = uuid.uuid4().hex[:6]
    key_names = [f"k{n}-{tag}" for n in range(2)]
    clients = {name: [client_for(name, user) for _ in range(DUPLICATES)] for name in TENANTS}
    calls = [(name, key, n) for name in TENANTS for key in key_names for n in range(DUPLICATES)]

    def call(index: int) -> tuple[str, str, int, bytes]:
        name, key, n = calls[index]
        response = post(clients[name][n], path, key, sku=f"{name}:{key}", pause=0.4)
        return name, key, response.status_code, response.content

    answers = together(len(calls), call)
    # And once more each, from the replay cache where it is on.
    again = [(n, k, *_answer(post(clients[n][0], path, k, f"{n}:{k}"))) for n, k, _ in calls[::5]]

    assert {status for *_, status, _ in answers + again} == {201}
    for name in TENANTS:
        for key in key_names:
            bodies = {body for n, k, _, body in answers + again if (n, k) == (name, key)}
            assert len(bodies) == 1, (name, key, bodies)
            assert json.loads(bodies.pop())["sku"] == f"{name}:{key}"
        assert purchases(name, tag) == Counter({f"{name}:{key}": 1 for key in key_names})
        assert set(key_names) <= set(keys(name))
    assert not set(key_names) & set(keys("public"))


def _answer(response: Any) -> tuple[int, bytes]:
    return response.status_code, response.content


@override_settings(**REPLAY_CACHE)
@pytest.mark.parametrize("path", ["/purchases/", "/purchases/shared-scope/"])
def test_the_replay_cache_never_answers_one_tenant_with_anothers_outcome(user, path):
    alpha, beta = client_for("alpha", user), client_for("beta", user)
    tag = uuid.uuid4().hex[:6]
    key, sku = f"shared-{tag}", f"order-{tag}"

    post(alpha, path, key, sku)
    cached = post(alpha, path, key, sku)
    other = post(beta, path, key, sku)

    assert cached.headers["Idempotent-Replayed"] == "true"
    assert other.status_code == 201 and "Idempotent-Replayed" not in other.headers
    assert purchases("beta", tag) == purchases("alpha", tag) == Counter({sku: 1})


def test_the_default_scope_names_the_tenant(user):
    post(client_for("alpha", user), "/purchases/", key := uuid.uuid4().hex, "x")

    scope = in_schema("alpha", lambda: IdempotencyRecord.objects.get(idem_key=key).scope)
    assert scope == f"tenant:alpha:user:{user.pk}:purchases.create"


def test_a_waiter_is_woken_only_by_its_own_tenants_outcome(user):
    """Same scope and key in both schemas: alpha's finish must not end beta's wait."""
    path = "/purchases/shared-scope/leased/"
    tag = uuid.uuid4().hex[:6]
    key, sku = f"wait-{tag}", f"beta-{tag}"
    answers: dict[str, Any] = {}

    def beta_first() -> None:
        answers["first"] = post(client_for("beta", user), path, key, sku, pause=2.0)

    first = threading.Thread(target=beta_first)
    first.start()
    time.sleep(0.5)  # beta's first attempt holds the key
    waiter = threading.Thread(
        target=lambda: answers.setdefault("dup", post(client_for("beta", user), path, key, sku))
    )
    waiter.start()
    time.sleep(0.3)  # beta's duplicate listens
    assert post(client_for("alpha", user), path, key, sku).status_code == 201
    first.join(10)
    waiter.join(10)

    assert answers["first"].status_code == answers["dup"].status_code == 201
    assert answers["dup"].content == answers["first"].content
    assert purchases("beta", tag) == purchases("alpha", tag) == Counter({sku: 1})


def test_channels_of_the_same_key_differ_by_schema():
    assert channel("s", "k", "alpha") != channel("s", "k", "beta") != channel("s", "k")
    assert channel("s", "k") == channel("s", "k", None)


def test_the_admin_lists_only_its_tenants_records(user):
    alpha, beta = client_for("alpha", user), client_for("beta", user)
    post(alpha, "/purchases/", alpha_key := f"alpha-{uuid.uuid4().hex[:6]}", "a")
    post(beta, "/purchases/", beta_key := f"beta-{uuid.uuid4().hex[:6]}", "b")

    page = alpha.get("/admin/idempotency/idempotencyrecord/").content.decode()

    assert alpha_key in page and beta_key not in page


def seed(name: str, expired: int, stuck: int) -> None:
    """Expired records (purge's) and expired leases (recovery's) in schema ``name``."""

    def make() -> None:
        for _ in range(expired):
            IdempotencyRecordFactory(expired=True)
        for _ in range(stuck):
            IdempotencyRecordFactory(expired_lease=True)

    in_schema(name, make)


def statuses(name: str) -> Counter[str]:
    return in_schema(
        name, lambda: Counter(IdempotencyRecord.objects.values_list("status", flat=True))
    )


def run(command: str, *args: str) -> str:
    return timeless(output.run(command, *args))


SCHEMAS = ("public", *TENANTS)


@pytest.fixture
def emptied() -> None:
    """Tenant schemas keep their records between tests: start these from none."""
    for name in SCHEMAS:
        in_schema(name, lambda: IdempotencyRecord.objects.all().delete())


def test_cleanup_from_the_public_schema_purges_every_schema_and_names_each(emptied):
    for name, count in zip(SCHEMAS, (1, 2, 3), strict=True):
        seed(name, expired=count, stuck=0)

    assert run("idempotency_cleanup") == (
        "default/public: purged 1 record.\n"
        "default/alpha: purged 2 records.\n"
        "default/beta: purged 3 records.\n"
        "Purged 6 records in 3 shards.\n"
    )
    assert all(statuses(name) == Counter() for name in SCHEMAS)


def test_cleanup_run_for_one_tenant_stays_in_its_schema(emptied):
    """What ``tenant_command idempotency_cleanup --schema=alpha`` does."""
    for name in SCHEMAS:
        seed(name, expired=2, stuck=0)

    assert in_schema("alpha", lambda: run("idempotency_cleanup")) == "Purged 2 records.\n"
    assert statuses("alpha") == Counter()
    assert statuses("beta") == statuses("public") == Counter({Status.SUCCEEDED: 2})


def test_progress_names_each_schema_and_ids_are_a_schemas_own(emptied):
    for name in SCHEMAS:
        seed(name, expired=1, stuck=1)

    out = output.run("idempotency_cleanup", "--progress-every", "0")
    assert [line.split(",")[0] for line in out.splitlines() if "batch" in line] == [
        f"Purging default/{name}... 1 batch" for name in SCHEMAS
    ]
    with pytest.raises(CommandError, match=r"tenant_command idempotency_recover --schema=NAME"):
        run("idempotency_recover", "--id", "1")
    stuck = in_schema("alpha", lambda: IdempotencyRecord.objects.get(status=Status.PROCESSING))
    out = in_schema(
        "alpha", lambda: run("idempotency_recover", "--id", str(stuck.pk), "--mark", "final")
    )
    assert out.endswith("Changed 1 record.\n")
    assert statuses("alpha") == Counter({Status.FAILED_FINAL: 1})
    assert statuses("beta") == Counter({Status.PROCESSING: 1})


def test_all_tenants_command_purges_each_tenant(emptied):
    for name in TENANTS:
        seed(name, expired=2, stuck=0)

    call_command("all_tenants_command", "idempotency_cleanup", stdout=io.StringIO())
    connection.set_schema_to_public()

    assert all(statuses(name) == Counter() for name in TENANTS)


@override_settings(IDEMPOTENCY={"RELEASE_EXPIRED_WITHOUT_RESOLVER": True})
def test_recovery_and_the_beat_tasks_reach_every_schema(emptied):
    for name in SCHEMAS:
        seed(name, expired=1, stuck=2)

    out = run("idempotency_recover", "--dry-run")
    assert "default/beta: Would recover 2 records: 0 succeeded, 2 released" in out
    assert recover_expired_leases()["released"] == 6
    assert purge_expired_records() == 3
    assert all(statuses(name) == Counter({Status.FAILED_RETRYABLE: 2}) for name in SCHEMAS)
