"""Real HTTP servers for tests: a free port, a client that ignores proxies, readiness."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from tests.support.factories import UserFactory
from tests.support.processes import process_env, python, start, stop

ORDER = {"sku": "book", "quantity": 2}

# No proxy from the environment may stand between the tests and 127.0.0.1.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotent-replayed") == "true"


def to_reply(status: int, headers: Any, body: bytes) -> Reply:
    return Reply(status, {name.lower(): value for name, value in headers.items()}, body)


def send(
    url: str,
    method: str = "GET",
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 20.0,
) -> Reply:
    """One request; a JSON body unless ``body`` is bytes. Error statuses are replies too."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
    try:
        with OPENER.open(request, timeout=timeout) as response:
            return to_reply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        return to_reply(error.code, error.headers, error.read())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_up(process: subprocess.Popen[bytes], url: str, name: str) -> None:
    """Until ``url`` answers at all (any status); fails if ``process`` exits first."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{name} exited with {process.returncode}")
        try:
            with OPENER.open(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"{name} did not answer within 30 s")


@dataclass(frozen=True)
class AsgiServer:
    """A server of the test project, and the session cookie of a user it knows."""

    url: str
    cookie: str

    def post(self, path: str, body: Any = ORDER, key: str | None = "k-1", **headers: str) -> Reply:
        all_headers = {"Cookie": self.cookie, **headers}
        if key is not None:
            all_headers["Idempotency-Key"] = key
        return send(self.url + path, "POST", body, all_headers)

    def get(self, path: str) -> Reply:
        return send(self.url + path, headers={"Cookie": self.cookie})

    def together(self, requests: list[dict[str, Any]]) -> list[Reply]:
        """``post(**kwargs)`` for each, released at once by a barrier, on parallel connections."""
        barrier = threading.Barrier(len(requests))

        def one(kwargs: dict[str, Any]) -> Reply:
            barrier.wait(timeout=20)
            return self.post(**kwargs)

        with ThreadPoolExecutor(len(requests)) as pool:
            return list(pool.map(one, requests))


@contextmanager
def uvicorn(settings_module: str, ready_path: str) -> Iterator[AsgiServer]:
    """``tests.support.asgi`` under uvicorn with ``settings_module``, on the test database.

    Needs a ``transaction=True`` test on PostgreSQL: the user and session made
    here are committed, and the server's own connections see them.
    """
    user = UserFactory()
    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    cookie = f"{name}={client.cookies[name].value}"
    port = free_port()
    command = python(
        *(
            "-m",
            "uvicorn",
            "tests.support.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ),
        *("--lifespan", "off", "--no-access-log"),
    )
    env = process_env(DJANGO_SETTINGS_MODULE=settings_module, PYTHONUNBUFFERED="1")
    with tempfile.NamedTemporaryFile(suffix=".log") as log_file:
        log = Path(log_file.name)
        process = start(command, env, log)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(process, url + ready_path, "uvicorn")
            yield AsgiServer(url=url, cookie=cookie)
        finally:
            stop(process)
            sys.stdout.write(log.read_text(errors="replace")[-5000:])
