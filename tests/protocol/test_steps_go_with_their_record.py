"""No step outlives its record: whichever way a record goes, its steps go with it.

Recorded steps can hold what a provider answered; a step left behind is kept
forever. On PostgreSQL nothing in the schema deletes them (no foreign key: its
check made every purge slow), so every path that deletes or replaces a record
must: the purge (with and without a replay cache), the discard, the replacement
of an expired record, the admin's delete and its bulk delete. Steps an earlier
release left behind are swept by the cleanup command and the purge task.
Runs on every database of the suite.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.sites import site
from django.core.cache import caches as django_caches
from django.core.management import call_command
from django.db import connection
from django.db.models import Max
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from idempotency import tasks
from idempotency.fingerprint import digest_of, fingerprint
from idempotency.models import IdempotencyRecord, IdempotencyStep, Status
from idempotency.protocol import Attempt, Operation
from idempotency.protocol.execute import execute
from idempotency.retention import purge

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "tests.steps_go"
LOCAL = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}


@pytest.fixture(params=[None, "replays"], ids=["no-replay-cache", "replay-cache"])
def replay_cache(request: pytest.FixtureRequest) -> Iterator[str | None]:
    caches = {"default": LOCAL, "replays": {**LOCAL, "LOCATION": "replays"}}
    with override_settings(CACHES=caches, IDEMPOTENCY={"REPLAY_CACHE": request.param}):
        yield request.param
        django_caches["replays"].clear()  # the next test's database starts empty too


def operation(key: str, request: str = "a") -> Operation:
    return Operation(
        scope="user:1",
        key=key,
        request_hash=fingerprint([request]),
        name=NAME,
        mode="lease",
        lease_seconds=30,
    )


def run(op: Operation, work: Any, decide: Any = None) -> Any:
    from idempotency.functions import _record_result, _stored_result

    return execute(op, work, decide=decide or _record_result, replay=_stored_result)


def charge(attempt: Attempt) -> dict[str, str]:
    return attempt.step("charge", lambda key: {"id": f"ch_{attempt.operation.key}"})


def stepped(count: int) -> list[Operation]:
    """``count`` lease-mode requests that each recorded a step: a seed and a step row each."""
    made = [operation(f"k{n}") for n in range(count)]
    for op in made:
        run(op, charge)
    assert IdempotencyStep.objects.count() == 2 * count
    return made


def expire_all() -> None:
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(days=1))


def orphans(count: int) -> None:
    """Steps whose record is gone, as an earlier release's purge left them."""
    gone = (IdempotencyRecord.objects.aggregate(last=Max("pk"))["last"] or 0) + 1000
    rows = [
        IdempotencyStep(record_id=gone + n, request_started=timezone.now(), seed="00" * 32)
        for n in range(count)
    ]
    mysql = connection.vendor == "mysql"  # its foreign key refuses them otherwise
    with connection.cursor() as cursor:
        if mysql:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
        try:
            IdempotencyStep.objects.bulk_create(rows)
        finally:
            if mysql:
                cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


def test_the_purge_takes_the_steps(replay_cache):
    stepped(5)
    expire_all()
    assert purge() == 5
    assert not IdempotencyRecord.objects.exists()
    assert IdempotencyStep.objects.count() == 0


def test_a_purge_leaves_the_steps_of_the_records_it_keeps(replay_cache):
    kept, gone = stepped(2)
    IdempotencyRecord.objects.filter(idem_key=gone.key).update(
        expires_at=timezone.now() - timedelta(days=1)
    )
    assert purge() == 1
    record = IdempotencyRecord.objects.get()
    assert record.idem_key == kept.key
    assert set(IdempotencyStep.objects.values_list("record_id", flat=True)) == {record.pk}


def test_a_discard_takes_the_steps():
    # The work took a step, then its outcome was not to be recorded: the key is free again.
    run(operation("k1"), charge, decide=lambda value, attempt: None)
    assert not IdempotencyRecord.objects.exists()
    assert IdempotencyStep.objects.count() == 0


def test_a_replacement_takes_the_earlier_requests_steps():
    (op,) = stepped(1)
    expire_all()
    run(operation(op.key, request="another"), lambda attempt: "no steps this time")
    record = IdempotencyRecord.objects.get()
    assert record.request_hash == digest_of(fingerprint(["another"]))
    assert record.status == Status.SUCCEEDED
    assert IdempotencyStep.objects.count() == 0


def test_the_admins_delete_takes_the_steps(admin_client):
    stepped(1)
    record = IdempotencyRecord.objects.get()
    delete = reverse("admin:idempotency_idempotencyrecord_delete", args=[record.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert not IdempotencyRecord.objects.exists()
    assert IdempotencyStep.objects.count() == 0


def test_the_admins_bulk_delete_takes_the_steps(replay_cache, rf, admin_user):
    stepped(3)
    request = rf.post("/admin/")
    request.user = admin_user
    model_admin = site._registry[IdempotencyRecord]
    chosen = IdempotencyRecord.objects.filter(idem_key__in=["k0", "k2"])
    model_admin.delete_queryset(request, chosen)  # what Django's delete_selected calls
    assert list(IdempotencyRecord.objects.values_list("idem_key", flat=True)) == ["k1"]
    assert IdempotencyStep.objects.count() == 2


def test_the_cleanup_command_sweeps_steps_an_earlier_release_left():
    stepped(2)
    orphans(3)
    out = io.StringIO()
    call_command("idempotency_cleanup", "--dry-run", stdout=out)
    assert "Would purge 0 records and 3 steps whose record was gone" in out.getvalue()
    assert IdempotencyStep.objects.count() == 7
    out = io.StringIO()
    call_command("idempotency_cleanup", "--batch-size", "2", stdout=out)
    assert "Purged 0 records and 3 steps whose record was gone" in out.getvalue()
    assert IdempotencyStep.objects.count() == 4  # the live records' steps stay
    out = io.StringIO()
    call_command("idempotency_cleanup", stdout=out)
    assert "steps whose record was gone" not in out.getvalue()


def test_the_purge_task_sweeps_them_too(caplog):
    stepped(1)
    orphans(2)
    with caplog.at_level("INFO", logger="idempotency"):
        assert tasks.purge_expired_records() == 0
    assert IdempotencyStep.objects.count() == 2
    assert "Purged 2 steps whose record was gone" in caplog.text
