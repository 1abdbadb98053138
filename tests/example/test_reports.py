"""The example reports: lease mode, their resolver, a gunicorn worker killed mid-work."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models.functions import Now
from django.test import override_settings
from rest_framework.test import APIClient

from example_project.reports.models import Report
from example_project.reports.resolvers import report_resolver
from example_project.reports.views import generate
from idempotency.exceptions import LeaseLost
from idempotency.models import IdempotencyRecord, Status
from idempotency.recovery import recover_expired
from idempotency.resolvers import resolver_for
from tests.support.example_server import collect_static
from tests.support.processes import process_env, python, start, stop

pytestmark = pytest.mark.django_db

REPORTS = "/api/reports/"
PBKDF2 = "django.contrib.auth.hashers.PBKDF2PasswordHasher"


@pytest.fixture
def client(alice: User) -> APIClient:
    api = APIClient()
    api.force_authenticate(alice)
    return api


def create(client: APIClient, body: Any, key: str | None = "report-1"):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(REPORTS, body, format="json", **headers)


def lose_lease(key: str = "report-1") -> None:
    """As if the worker that held the record had died (its lease ran out)."""
    IdempotencyRecord.objects.filter(idem_key=key).update(
        status=Status.PROCESSING,
        owner_token=b"dead-worker",
        lease_until=Now() - timedelta(seconds=1),
        response_status=None,
        response_body=None,
    )


class TestCreate:
    def test_creates_a_report_owned_by_the_caller(self, client, alice):
        response = create(client, {"seconds": 0})
        assert response.status_code == 201
        report = Report.objects.get()
        assert response.json()["id"] == report.pk
        assert response["Location"] == f"/api/reports/{report.pk}/"
        assert report.owner == alice
        assert report.idempotency_key == "report-1"
        record = IdempotencyRecord.objects.get()
        assert record.operation == "reports.create"
        assert report.idempotency_scope == record.scope
        assert record.status == Status.SUCCEEDED
        assert record.resource_id == str(report.pk)

    def test_repeat_is_replayed(self, client):
        first = create(client, {"seconds": 0.1})
        again = create(client, {"seconds": 0.1})
        assert again.status_code == 201
        assert again["Idempotent-Replayed"] == "true"
        assert again.json() == first.json()
        assert Report.objects.count() == 1

    @pytest.mark.parametrize("seconds", [-1, 30.5, "soon", None])
    def test_seconds_must_be_between_0_and_30(self, client, seconds):
        response = create(client, {"seconds": seconds})
        assert response.status_code == 400
        assert not IdempotencyRecord.objects.exists()  # the key stays free

    def test_a_key_is_required(self, client):
        assert create(client, {"seconds": 0}, key=None).status_code == 400

    def test_lists_only_the_callers_reports(self, client, alice):
        create(client, {"seconds": 0})
        bob = APIClient()
        bob.force_authenticate(User.objects.create_user("bob"))
        assert bob.get(REPORTS).json() == []
        assert len(client.get(REPORTS).json()) == 1


class TestResolver:
    def test_is_registered_for_recovery(self):
        assert resolver_for("reports.create") is report_resolver

    def test_done_with_the_response_the_view_gave(self, client):
        first = create(client, {"seconds": 0})
        resolution = report_resolver(IdempotencyRecord.objects.get())
        assert resolution.answer == "done"
        assert resolution.resource_id == str(first.json()["id"])
        assert resolution.response is not None
        assert resolution.response.status == 201
        assert json.loads(resolution.response.body or b"") == first.json()

    def test_not_done_without_a_report(self, client):
        create(client, {"seconds": 0})
        Report.objects.all().delete()
        assert report_resolver(IdempotencyRecord.objects.get()).answer == "not_done"

    def test_lost_lease_with_the_report_made_is_replayed(self, client):
        first = create(client, {"seconds": 0})
        lose_lease()
        again = create(client, {"seconds": 0})
        assert again.status_code == 201
        assert again["Idempotent-Replayed"] == "true"
        assert again.json() == first.json()
        assert Report.objects.count() == 1

    def test_lost_lease_without_the_report_runs_again_once(self, client):
        create(client, {"seconds": 0})
        Report.objects.all().delete()
        lose_lease()
        again = create(client, {"seconds": 0})
        assert again.status_code == 201
        assert not again.has_header("Idempotent-Replayed")
        assert Report.objects.count() == 1
        assert IdempotencyRecord.objects.get().attempts == 2


class TestGenerate:
    def test_renews_the_lease_while_it_works(self):
        class Attempt:
            renewals = 0

            def renew(self) -> None:
                self.renewals += 1

        attempt = Attempt()
        generate(attempt, 0.25, renew_every=0.1)  # type: ignore[arg-type]
        assert attempt.renewals == 3

    def test_stops_when_the_lease_was_taken_over(self):
        class Overtaken:
            def renew(self) -> None:
                raise LeaseLost()

        with pytest.raises(LeaseLost):
            generate(Overtaken(), 1, renew_every=0.01)  # type: ignore[arg-type]


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_gunicorn_worker_killed_mid_report_is_recovered_with_one_report(tmp_path):
    """A real server: the worker dies mid-work; recovery releases the key; the retry runs once."""
    with override_settings(PASSWORD_HASHERS=[PBKDF2]):  # one the example project knows
        User.objects.create_user("alice", password="alice-password")
    with _gunicorn(tmp_path) as server:
        outcome: dict[str, Any] = {}
        first = threading.Thread(target=lambda: outcome.update(first=server.create(3)))
        first.start()
        _wait_for(
            lambda: (
                IdempotencyRecord.objects.filter(status=Status.PROCESSING).exists()
                or not first.is_alive()
            )
        )
        assert first.is_alive(), _read(outcome["first"])
        time.sleep(0.5)  # inside the work now
        os.kill(server.worker_pid(), signal.SIGKILL)
        first.join(timeout=20)
        died = outcome["first"]  # the connection died with the worker: no HTTP answer
        assert isinstance(died, OSError) and not isinstance(died, urllib.error.HTTPError)

        record = IdempotencyRecord.objects.get()
        assert record.status == Status.PROCESSING
        server.wait_until_up()
        in_use = server.create(3)
        assert isinstance(in_use, urllib.error.HTTPError) and in_use.code == 409
        assert 1 <= int(in_use.headers["Retry-After"]) <= 10

        _wait_for(
            lambda: IdempotencyRecord.objects.expired_leases().exists(), timeout=15
        )  # the lease (10 s) ran out, by the database's clock
        report = recover_expired()  # what the beat task runs
        assert report.released == 1
        assert Report.objects.count() == 0

        retry = server.create(3)
        assert retry.status == 201
        again = server.create(3)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert json.loads(again.read()) == json.loads(retry.read())
        assert Report.objects.count() == 1


class _Server:
    def __init__(self, process: Any, url: str) -> None:
        self.process = process
        self.url = url

    def create(self, seconds: float) -> Any:
        """The response, or the error (HTTPError for 4xx/5xx, OSError if the connection died)."""
        credentials = base64.b64encode(b"alice:alice-password").decode()
        request = urllib.request.Request(
            self.url + REPORTS,
            data=json.dumps({"seconds": seconds}).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Basic {credentials}",
                "Idempotency-Key": "killed-report",
            },
            method="POST",
        )
        try:
            response = urllib.request.urlopen(request, timeout=20)
        except OSError as error:
            return error
        body = response.read()
        response.read = lambda: body  # readable again by the test
        return response

    def worker_pid(self) -> int:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        return int(children.split()[0])

    def wait_until_up(self) -> None:
        def answers() -> bool:
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        _wait_for(answers, timeout=30)


class _gunicorn:
    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "gunicorn.log"
        self.static = tmp_path / "static"

    def __enter__(self) -> _Server:
        port = _free_port()
        command = python(
            "-m",
            "gunicorn",
            "example_project.wsgi:application",
            *("--bind", f"127.0.0.1:{port}", "--workers", "1", "--timeout", "60"),
            *_no_control_socket(),
        )
        env = process_env(
            DJANGO_SETTINGS_MODULE="example_project.settings",
            SECRET_KEY="reports-test-secret",
            DEBUG="False",
            ALLOWED_HOSTS="127.0.0.1",
        )
        collect_static(env, self.static)
        self.server = _Server(start(command, env, log=self.log), f"http://127.0.0.1:{port}")
        try:
            self.server.wait_until_up()
        except BaseException:
            self.__exit__()
            raise
        return self.server

    def __exit__(self, *exc: object) -> None:
        stop(self.server.process)
        print(self.log.read_text()[-5000:])


def _read(response: Any) -> str:
    return (
        f"{getattr(response, 'code', None) or getattr(response, 'status', '')} {response.read()!r}"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _no_control_socket() -> list[str]:
    from gunicorn.config import KNOWN_SETTINGS

    if any(setting.name == "control_socket" for setting in KNOWN_SETTINGS):
        return ["--no-control-socket"]
    return []


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)
