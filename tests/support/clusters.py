"""What the failover and Galera suites share: the example project served with a log of
its own, clients that retry as clients do, the answers they got, and the figures printed.

The servers log the protocol's events at DEBUG (``LOG_LEVEL``), one line per claim
with its key: a claim is a run of the view, so the log counts how often each key's
view ran, on each server.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.example_server import ROOT, Server, _no_control_socket, _stop
from tests.support.servers import free_port, wait_until_up

# The answers a protected create may give under a failover or a contention, by status and
# code (docs/errors.md): anything else is a failure of the app, not of the database.
DOCUMENTED = {
    (201, ""),
    (409, "idempotency_key_in_use"),
    (503, "database_unavailable"),
    (503, "outcome_unknown"),
}


@dataclass(frozen=True)
class Answer:
    """One HTTP answer to a create, as a client saw it."""

    key: str
    status: int
    code: str  # the problem's ``code``; "" for a 2xx
    replayed: bool
    order: int | None  # the order's id in a 2xx body
    detail: str
    retry_after: float
    sent: float  # time.monotonic() when sent, and when answered
    answered: float

    @property
    def kind(self) -> tuple[int, str]:
        return self.status, self.code


def create(server: Server, key: str, path: str = "/api/orders/", body: Any = None) -> Answer:
    """An order (or what ``path`` makes of ``body``) under ``key``; its sku is the key."""
    sent = time.monotonic()
    reply = server.create_order(body or {"sku": key, "quantity": 1}, key, path=path)
    answered = time.monotonic()
    try:
        body = json.loads(reply.body) if reply.body else {}
    except ValueError:
        body = {"detail": reply.body[:300].decode(errors="replace")}
    ok = 200 <= reply.status < 300
    return Answer(
        key=key,
        status=reply.status,
        code="" if ok else str(body.get("code", "")),
        replayed=reply.replayed,
        order=int(body["id"]) if ok and "id" in body else None,
        detail="" if ok else str(body.get("detail", "")),
        retry_after=float(reply.headers.get("retry-after", "0") or 0),
        sent=sent,
        answered=answered,
    )


@dataclass
class Answers:
    """Every answer the clients got, thread-safe."""

    all: list[Answer] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, answer: Answer) -> Answer:
        with self.lock:
            self.all.append(answer)
        return answer

    def of(self, key: str) -> list[Answer]:
        """The answers ``key`` got, in the order they came."""
        return sorted((a for a in self.all if a.key == key), key=lambda a: a.answered)

    def by_kind(self) -> Counter[tuple[int, str]]:
        return Counter(answer.kind for answer in self.all)

    def undocumented(self) -> list[Answer]:
        return [answer for answer in self.all if answer.kind not in DOCUMENTED]

    def acknowledged(self) -> dict[str, Answer]:
        """Per key, the first 2xx that was no replay: the create a client was told happened."""
        first: dict[str, Answer] = {}
        for answer in sorted(self.all, key=lambda a: a.answered):
            if answer.status == 201 and not answer.replayed:
                first.setdefault(answer.key, answer)
        return first


def until_answered(
    server: Server | Callable[[], Server],
    key: str,
    answers: Answers,
    *,
    deadline: float = 90.0,
    pause: float = 1.0,
    path: str = "/api/orders/",
    body: Any = None,
) -> Answer:
    """A client's request for ``key``: retried with the same key after a 409 or a 503.

    It waits ``Retry-After`` (at most ``pause`` seconds), as a client that follows it
    does; ``server`` may be a callable choosing the server for each try.
    """
    give_up = time.monotonic() + deadline
    while True:
        chosen = server() if callable(server) else server
        answer = answers.add(create(chosen, key, path, body))
        if answer.status not in (409, 503):
            return answer
        assert time.monotonic() < give_up, f"{key} never got an answer: {answer}"
        time.sleep(min(max(answer.retry_after, 0.1), pause))


@contextmanager
def logged_gunicorn(env: dict[str, str], log: Path) -> Iterator[str]:
    """The example project under gunicorn, logging the protocol's events (with keys) to ``log``."""
    port = free_port()
    command = [
        *(sys.executable, "-m", "gunicorn", "example_project.wsgi:application"),
        *("--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4"),
        *("--timeout", "60", "--graceful-timeout", "5"),
        *_no_control_socket(),
    ]
    with log.open("ab") as output:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**env, "LOG_LEVEL": "DEBUG"},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(process, url + "/", "gunicorn")
            yield url
        finally:
            _stop(process)


def view_runs(logs: Iterable[Path], event: str = "claimed") -> Counter[str]:
    """How often each key's view ran, over the servers' logs.

    In atomic mode each claim runs the view in the claim's transaction. A lease-mode
    claim is committed after its ``claimed`` event, and may fail to commit (a duplicate's
    claim on another node certified first): there ``completed`` counts the runs.
    """
    pattern = re.compile(rf"idempotency {event} key='([^']*)'")
    runs: Counter[str] = Counter()
    for log in logs:
        runs.update(pattern.findall(log.read_text(errors="replace")))
    return runs


# What a server logs when it failed, not the database: a 500, a worker that died or hung.
_SERVER_ERRORS = ("Internal Server Error", "Exception in worker", "WORKER TIMEOUT", "Worker exited")


def errors_logged(logs: Iterable[Path]) -> list[str]:
    """The servers' own failures, which the answers alone might not show."""
    return [
        line
        for log in logs
        for line in log.read_text(errors="replace").splitlines()
        if any(error in line for error in _SERVER_ERRORS)
    ]


def figures(title: str, rows: list[tuple[str, Any]]) -> str:
    """A block of figures for the pass's output: ``name: value``, one a line."""
    width = max(len(name) for name, _ in rows)
    lines = [f"-- {title}"] + [f"   {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)


def kinds(counter: Counter[tuple[int, str]]) -> str:
    return ", ".join(
        f"{status}{' ' + code if code else ''}: {count}"
        for (status, code), count in sorted(counter.items())
    )


def checked(env: dict[str, str]) -> str:
    """What ``manage.py check --database default`` says of the example project's database."""
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--database", "default"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout + done.stderr
