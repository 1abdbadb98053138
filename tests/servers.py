"""Real HTTP servers for tests: a free port, a client that ignores proxies, readiness."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

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


def reply(status: int, headers: Any, body: bytes) -> Reply:
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
            return reply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        return reply(error.code, error.headers, error.read())


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
