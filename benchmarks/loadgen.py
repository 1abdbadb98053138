"""A small concurrent HTTP load generator: threads, one keep-alive connection each.

It runs in the benchmark's own process, never in the server's: gunicorn
serves, this drives. Latency is measured per request, from just before the
request is written to just after the whole response body is read.
"""

from __future__ import annotations

import http.client
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

TIMEOUT = 30.0


@dataclass(frozen=True)
class Call:
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]
    method: str = "POST"


@dataclass(frozen=True)
class Reply:
    status: int
    replayed: bool
    seconds: float
    body: bytes


@dataclass
class Sample:
    """What one round of one variant measured."""

    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    replayed: int = 0
    failures: int = 0  # connection errors, timeouts
    seconds: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def succeeded(self) -> int:
        return sum(count for status, count in self.statuses.items() if 200 <= status < 300)

    @property
    def throughput(self) -> float:
        """Answers with the outcome (2xx) per second: a fast 409 or 423 is not served work."""
        return self.succeeded / self.seconds if self.seconds else 0.0

    def add(self, reply: Reply) -> None:
        self.latencies.append(reply.seconds)
        self.statuses[reply.status] += 1
        self.replayed += reply.replayed


class Client:
    """One keep-alive connection; reconnects when the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
        self.connection.connect()

    def send(self, call: Call) -> Reply:
        for attempt in range(2):
            started = time.perf_counter()
            try:
                self.connection.request(
                    call.method, call.path, body=call.body or None, headers=dict(call.headers)
                )
                response = self.connection.getresponse()
                body = response.read()
            except (ConnectionError, http.client.HTTPException):
                # A keep-alive connection the server closed between requests: reconnect once.
                self.close()
                self.connection = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)
                if attempt:
                    raise
                continue
            elapsed = time.perf_counter() - started
            if response.getheader("Connection", "").lower() == "close":
                self.close()
                self.connection = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)
            replayed = _is_replay(response)
            return Reply(response.status, replayed, elapsed, body)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.connection.close()


def _is_replay(response: http.client.HTTPResponse) -> bool:
    # This app and drf-idempotency say Idempotent-Replayed: true; drf-idempotencykey
    # names the key in Cached-From-Idempotency-Key; django-idempotency-key says nothing.
    return (response.getheader("Idempotent-Replayed") or "").lower() == "true" or bool(
        response.getheader("Cached-From-Idempotency-Key")
    )


def drive(host: str, port: int, calls: Sequence[Call], concurrency: int) -> Sample:
    """Send ``calls`` over ``concurrency`` connections as fast as the server answers."""
    sample = Sample()
    lock = threading.Lock()
    next_index = itertools.count()
    clients = [Client(host, port) for _ in range(concurrency)]
    start = threading.Barrier(concurrency + 1)

    def worker(client: Client) -> None:
        start.wait()
        while (index := next(next_index)) < len(calls):
            try:
                reply = client.send(calls[index])
            except (OSError, http.client.HTTPException):
                with lock:
                    sample.failures += 1
                continue
            with lock:
                sample.add(reply)

    threads = [threading.Thread(target=worker, args=(client,), daemon=True) for client in clients]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join(TIMEOUT * 4)
    sample.seconds = time.perf_counter() - began
    for client in clients:
        client.close()
    return sample


def burst(host: str, port: int, calls: Sequence[Call]) -> list[Reply | None]:
    """Send every call at the same instant, each on its own connection; ``None`` for a failure."""
    clients = [Client(host, port) for _ in calls]
    replies: list[Reply | None] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def worker(index: int) -> None:
        start.wait()
        try:
            replies[index] = clients[index].send(calls[index])
        except (OSError, http.client.HTTPException):
            replies[index] = None

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT * 2)
    for client in clients:
        client.close()
    return replies


@dataclass(frozen=True)
class Timed:
    """One reply of a paced load: when it was sent (``time.monotonic``), how long it took."""

    sent: float
    seconds: float
    status: int  # 0 for a connection error or a timeout
    replayed: bool = False


def paced(
    host: str,
    port: int,
    make_call: Callable[[], Call],
    connections: int,
    rate: float,
    stop: threading.Event,
) -> list[Timed]:
    """Send ``rate`` requests per second over ``connections`` until ``stop`` is set.

    A steady, bounded load: each connection sends on its own schedule and never
    catches up in a burst when a reply was late, so the server sees the same
    offered load whatever runs beside it, and a slow reply shows as latency.
    """
    replies: list[Timed] = []
    lock = threading.Lock()
    interval = connections / rate

    def worker(index: int) -> None:
        client = Client(host, port)
        next_at = time.monotonic() + index * interval / connections
        while not stop.is_set():
            pause = next_at - time.monotonic()
            if pause > 0 and stop.wait(pause):
                break
            sent = time.monotonic()
            try:
                reply = client.send(make_call())
                timed = Timed(sent, reply.seconds, reply.status, reply.replayed)
            except (OSError, http.client.HTTPException):
                timed = Timed(sent, time.monotonic() - sent, 0)
            with lock:
                replies.append(timed)
            next_at = max(next_at + interval, time.monotonic())
        client.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return replies
