"""A project without Django REST framework: ``import rest_framework`` fails in its processes
(``tests/nodrf/settings.py``), and plain Django views, sync and async, are protected end to end.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from idempotency.models import IdempotencyRecord, Status
from tests.support.processes import process_env, python
from tests.support.servers import ORDER, AsgiServer, Reply, send, uvicorn
from tests.testapp.models import Order

SETTINGS = "tests.nodrf.settings"
FORM = "application/x-www-form-urlencoded"

IMPORTS_AND_CHECKS = """
import importlib, sys
import django
django.setup()
for name in ("idempotency", "idempotency.http", "idempotency.decorators", "idempotency.checks",
             "idempotency.admin", "idempotency.functions", "tests.nodrf.urls"):
    importlib.import_module(name)
from idempotency import IdempotencyOptions, idempotent, mark_final
try:
    import idempotency.drf
except ImportError:
    pass
else:
    raise SystemExit("idempotency.drf imported without DRF")
from django.core.management import call_command
call_command("check", fail_level="WARNING")
from django.core.checks import run_checks
from django.test import override_settings
with override_settings(IDEMPOTENCY={"ERROR_FORMAT": "drf"}):
    print(sorted(m.id for m in run_checks()))
assert not [m for m, module in sys.modules.items() if m.startswith("rest_framework") and module]
"""


def test_the_app_imports_and_checks_without_drf():
    result = subprocess.run(
        python("-c", IMPORTS_AND_CHECKS),
        env=process_env(database=False, DJANGO_SETTINGS_MODULE=SETTINGS),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # ERROR_FORMAT = "drf" needs DRF: the check says so.
    assert result.stdout.strip().splitlines()[-1] == "['idempotency.E028']"


@pytest.fixture
def server() -> Iterator[AsgiServer]:
    with uvicorn(SETTINGS, "/async/class-orders/") as running:
        yield running


def problem(reply) -> str:
    assert reply.headers["content-type"] == "application/problem+json"
    body = json.loads(reply.body)
    assert body["status"] == reply.status
    return str(body["code"])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
class TestOverHttp:
    @pytest.mark.parametrize("path", ["/orders/", "/async/orders/"])
    def test_claim_replay_and_errors(self, server, path):
        first = server.post(path)
        second = server.post(path)
        assert (first.status, first.replayed) == (201, False)
        assert (second.status, second.replayed, second.body) == (201, True, first.body)
        assert problem(server.post(path, {**ORDER, "quantity": 5})) == "idempotency_key_reused"
        assert server.post(path, {**ORDER, "quantity": 5}).status == 422
        missing = server.post(path, key=None)
        invalid = server.post(path, key="a b")
        assert (missing.status, problem(missing)) == (400, "idempotency_key_missing")
        assert (invalid.status, problem(invalid)) == (400, "idempotency_key_invalid")
        assert Order.objects.count() == 1
        assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED

    def test_an_html_form_may_carry_the_key_in_a_field(self, server):
        def submit(quantity: int) -> Reply:
            body = f"sku=book&quantity={quantity}&_idempotency_key=form-1".encode()
            headers = {"Cookie": server.cookie, "Content-Type": FORM}
            return send(server.url + "/orders/", "POST", body, headers)

        first, again, changed = submit(2), submit(2), submit(3)
        assert (first.status, again.status, again.replayed) == (201, 201, True)
        assert changed.status == 422
        assert IdempotencyRecord.objects.get().idem_key == "form-1"
        assert Order.objects.get().quantity == 2

    def test_an_unrecorded_outcome_rolls_back(self, server):
        assert server.post("/orders/", **{"X-Status": "400"}).status == 400
        assert Order.objects.count() == 0
        assert IdempotencyRecord.objects.count() == 0

    def test_concurrent_duplicates_get_409_and_make_one_order(self, server):
        replies = server.together([{"path": "/async/lease-orders/", "X-Sleep": "1"}] * 4)
        assert sorted(r.status for r in replies) == [201, 409, 409, 409]
        busy = [r for r in replies if r.status == 409]
        assert all(problem(r) == "idempotency_key_in_use" for r in busy)
        assert all(int(r.headers["retry-after"]) >= 1 for r in busy)
        assert Order.objects.count() == 1
