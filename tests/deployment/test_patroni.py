"""A PostgreSQL cluster under Patroni whose primary dies under load.

scripts/patroni.sh starts etcd and three PostgreSQL nodes under Patroni (a ttl of
10 s, a loop of 2 s). The example project runs under gunicorn on a multi-host
``DATABASE_URL`` (``target_session_attrs=read-write``): whichever node leads, it
connects there. Clients create orders, some as concurrent duplicates, and retry
every 409 and 503 with the same key, as the docs tell them to. Mid-load the
primary's machine "dies": Patroni and PostgreSQL (postmaster and backends) are
killed with SIGKILL; a standby is promoted; the dead node is started again and
rejoins as a standby.

With ``synchronous_mode_strict`` no acknowledged outcome may be lost: every key a
client was told was created (201, not replayed) has that order after the failover,
every answer is a documented one, no key has two orders, no record is stuck, and no
503 says that nothing was recorded. Then the same with asynchronous replication:
what it loses is counted and printed, not asserted away (docs/high-availability.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.clusters import (
    Answers,
    checked,
    errors_logged,
    figures,
    kinds,
    logged_gunicorn,
    until_answered,
)
from tests.support.example_server import ROOT, Server, prepare_example
from tests.support.servers import OPENER

pytestmark = [pytest.mark.postgres, pytest.mark.patroni]

DIR = Path(os.environ.get("PATRONI_DIR", "/tmp/idempotency-ha-patroni"))
API_PORT = int(os.environ.get("PATRONI_API_PORT", "8011"))
PG_PORT = int(os.environ.get("PATRONI_PG_PORT", "5511"))
NODES = 3
DATABASE = "idempotency_ha"
CLIENTS = 8
PACE = 0.1  # seconds a client waits between two orders: a bounded load
BEFORE_KILL = 3.0  # seconds of load before the primary dies
AFTER_WRITES = 3.0  # seconds of load once writes land again


def url(database: str) -> str:
    hosts = ",".join(f"127.0.0.1:{PG_PORT + n}" for n in range(NODES))
    return (
        f"postgres://postgres@{hosts}/{database}?target_session_attrs=read-write&connect_timeout=3"
    )


def conninfo(database: str) -> str:
    hosts = ",".join("127.0.0.1" for _ in range(NODES))
    ports = ",".join(str(PG_PORT + n) for n in range(NODES))
    return (
        f"host={hosts} port={ports} user=postgres dbname={database} "
        "target_session_attrs=read-write connect_timeout=2"
    )


def query(sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """On whichever node leads now."""
    with psycopg.connect(conninfo(DATABASE), autocommit=True) as db:
        return db.execute(sql, params).fetchall()


def api(node: int, path: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    """Patroni's REST API of ``node`` (1-based): the status and the JSON body, if any."""
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{API_PORT + node - 1}/{path}", data=data, method=method
    )
    try:
        with OPENER.open(request, timeout=2) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        return error.code, None
    except OSError:
        return 0, None


def leader() -> int | None:
    for node in range(1, NODES + 1):
        if api(node, "primary")[0] == 200:
            return node
    return None


def wait_for(what: str, check: Any, seconds: float = 90) -> float:
    """Polls ``check`` until true; returns when (``time.monotonic()``)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"the cluster: {what} within {seconds} s"
        time.sleep(0.1)
    return time.monotonic()


def whole_cluster() -> bool:
    """A leader, and every other node streaming from it."""
    status, body = api(1, "cluster")
    if status != 200 or body is None:
        return False
    members = body.get("members", [])
    running = [m for m in members if m.get("state") in ("running", "streaming")]
    return len(running) == NODES and sum(m.get("role") == "leader" for m in members) == 1


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def kill_machine(node: int) -> float:
    """What a dead machine does to a node: Patroni, the postmaster and its backends gone at once."""
    patroni = int((DIR / f"patroni{node}.pid").read_text())
    postmaster = int((DIR / f"node{node}" / "postmaster.pid").read_text().split()[0])
    victims = [patroni, postmaster, *children(postmaster)]
    for pid in victims:
        with suppress(ProcessLookupError):  # a backend that had just ended
            os.kill(pid, signal.SIGKILL)
    return time.monotonic()


def restart(node: int) -> None:
    subprocess.run(["bash", "scripts/patroni.sh", "node", str(node)], cwd=ROOT, check=True)


def writable() -> bool:
    try:
        with psycopg.connect(conninfo("postgres"), autocommit=True) as db:
            return not db.execute("SELECT pg_is_in_recovery()").fetchone()[0]
    except psycopg.Error:
        return False


@pytest.fixture(scope="module")
def example_env() -> dict[str, str]:
    if not (DIR / "patroni1.yml").exists() or leader() is None:
        pytest.fail("needs the Patroni cluster: run it with scripts/passes.sh patroni")
    wait_for("whole", whole_cluster)
    with psycopg.connect(conninfo("postgres"), autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        db.execute(f"CREATE DATABASE {DATABASE}")
    return prepare_example(url(DATABASE))


@pytest.fixture(scope="module")
def served(
    example_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("patroni-logs") / "gunicorn.log"
    with logged_gunicorn(example_env, log) as served_url:
        yield Server(served_url, DATABASE)
    assert errors_logged([log]) == []


@dataclass
class Failover:
    """Clients creating orders while the primary dies; what they got, and when."""

    server: Server
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    answers: Answers = field(default_factory=Answers)
    keys: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    killed_at: float = 0.0

    def client(self, number: int) -> None:
        for count in range(100_000):
            if self.stop.is_set():
                return
            key = f"ha-{self.run}-{number}-{count}"
            self.keys.append(key)
            if count % 4 == 3:  # a duplicate sent at the same moment, as a double click
                twin = threading.Thread(target=self.create, args=(key,))
                twin.start()
                self.create(key)
                twin.join()
            else:
                self.create(key)
            time.sleep(PACE)

    def create(self, key: str) -> None:
        until_answered(self.server, key, self.answers, deadline=120, pause=1.0)

    @contextmanager
    def running(self) -> Iterator[None]:
        threads = [threading.Thread(target=self.client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        try:
            yield
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=180)

    def first_write_after_kill(self) -> float | None:
        fresh = [
            answer.answered
            for answer in self.answers.all
            if answer.status == 201 and not answer.replayed and answer.sent > self.killed_at
        ]
        return min(fresh) if fresh else None


def fail_over(server: Server) -> tuple[Failover, dict[str, float]]:
    """Load, the leader's machine killed, a standby promoted, the dead node back as a standby."""
    failover = Failover(server)
    victim = leader()
    assert victim is not None
    times: dict[str, float] = {}
    with failover.running():
        time.sleep(BEFORE_KILL)
        failover.killed_at = kill_machine(victim)
        times["writable"] = wait_for("a writable primary", writable) - failover.killed_at
        new = leader()
        assert new is not None and new != victim
        # The dead machine comes back once the others have moved on (before, its Patroni
        # would find its own leader key and simply start it again as the primary).
        restart(victim)
        wait_for("a first new write", lambda: failover.first_write_after_kill() is not None)
        time.sleep(AFTER_WRITES)
    first_write = failover.first_write_after_kill()
    assert first_write is not None
    times["first write"] = first_write - failover.killed_at
    back = wait_for("the old primary back", lambda: api(victim, "replica")[0] == 200)
    times["back"] = back - failover.killed_at
    wait_for("whole", whole_cluster)
    return failover, times


@dataclass(frozen=True)
class Tally:
    lost: list[str]  # keys whose acknowledged order is not in the database
    doubled: list[str]  # keys with two orders
    processing: int
    claims_nothing: int  # 503s saying nothing was recorded
    unknown_then_replayed: int  # keys answered outcome_unknown, whose retry was a replay


def tally(failover: Failover) -> Tally:
    prefix = f"ha-{failover.run}-%"
    orders = orders_by_key(failover)
    acknowledged = failover.answers.acknowledged()
    lost = [key for key, answer in acknowledged.items() if answer.order not in orders.get(key, [])]
    (processing,) = query(
        "SELECT count(*) FROM idempotency_idempotencyrecord "
        "WHERE status = 'PROCESSING' AND idem_key LIKE %s",
        prefix,
    )[0]
    unknown = {a.key for a in failover.answers.all if a.code == "outcome_unknown"}
    replayed = {a.key for a in failover.answers.all if a.status == 201 and a.replayed}
    return Tally(
        lost=lost,
        doubled=[key for key, ids in orders.items() if len(ids) > 1],
        processing=int(processing),
        claims_nothing=sum(
            "nothing was recorded" in a.detail.lower() for a in failover.answers.all
        ),
        unknown_then_replayed=len(unknown & replayed),
    )


def orders_by_key(failover: Failover) -> dict[str, list[int]]:
    orders: dict[str, list[int]] = {}
    for sku, order in query(
        "SELECT sku, id FROM shop_order WHERE sku LIKE %s", f"ha-{failover.run}-%"
    ):
        orders.setdefault(sku, []).append(order)
    return orders


def retry_every_key(failover: Failover) -> list[str]:
    """One more retry of every key: the keys not answered with the replay of their order.

    The order is the acknowledged one, or, for a key whose create was answered
    ``outcome_unknown`` (its COMMIT landed, its acknowledgement died with the primary)
    and whose retries were replays, the one order the database holds for it.
    """
    acknowledged = failover.answers.acknowledged()
    orders = orders_by_key(failover)
    wrong = []
    for key in failover.keys:
        again = until_answered(failover.server, key, Answers(), deadline=30)
        first = acknowledged.get(key)
        expected = first.order if first else (orders.get(key) or [None])[0]
        if not (again.status == 201 and again.replayed and again.order == expected):
            history = [(a.status, a.code, a.replayed, a.order) for a in failover.answers.of(key)]
            wrong.append(f"{key}: retried {again}, expected {expected}, earlier {history}")
    return wrong


def report(title: str, failover: Failover, times: dict[str, float], counted: Tally) -> str:
    answers = failover.answers
    lost = counted.lost
    return figures(
        title,
        [
            ("keys (a quarter sent twice at once)", len(failover.keys)),
            ("requests", len(answers.all)),
            ("answers", kinds(answers.by_kind())),
            ("seconds without a writable primary", f"{times['writable']:.1f}"),
            ("first new write after the kill", f"{times['first write']:.1f} s"),
            ("old primary back as a standby after", f"{times['back']:.1f} s"),
            ("acknowledged creates", len(answers.acknowledged())),
            (
                "acknowledged outcomes lost",
                f"{len(lost)}" + (f" ({', '.join(lost)})" if lost else ""),
            ),
            ("keys with two orders", len(counted.doubled)),
            ("records left PROCESSING", counted.processing),
            ("outcome_unknown answers whose retry replayed", counted.unknown_then_replayed),
            ("503s saying nothing was recorded", counted.claims_nothing),
        ],
    )


def test_synchronous_strict_a_killed_primary_loses_no_acknowledged_outcome(
    served: Server, example_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (synchronous,) = query("SHOW synchronous_standby_names")[0]
    assert synchronous, "the cluster should replicate synchronously (synchronous_mode_strict)"
    assert "idempotency.W011" not in checked(example_env)
    failover, times = fail_over(served)
    counted = tally(failover)
    wrong = retry_every_key(failover)
    with capsys.disabled():
        print("\n" + report("Patroni, synchronous_mode_strict", failover, times, counted))
    assert failover.answers.undocumented() == []
    assert counted.claims_nothing == 0
    assert counted.lost == [], "an acknowledged create is gone"
    assert counted.doubled == []
    assert counted.processing == 0
    assert wrong == [], "a retry was not answered with the acknowledged order"


def test_asynchronous_a_killed_primary_may_lose_what_it_acknowledged(
    served: Server, example_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, _ = api(
        leader() or 1,
        "config",
        "PATCH",
        {
            "synchronous_mode": False,
            "synchronous_mode_strict": False,
        },
    )
    assert status == 200
    wait_for("asynchronous", lambda: query("SHOW synchronous_standby_names")[0][0] == "", 30)
    # The example project's reports run in lease mode: the check says what may be lost.
    said = checked(example_env)
    assert "idempotency.W011" in said and "none synchronous" in said, said
    failover, times = fail_over(served)
    counted = tally(failover)
    wrong = retry_every_key(failover)
    with capsys.disabled():
        print("\n" + report("Patroni, asynchronous", failover, times, counted))
        print(f"   retries answered with another order than acknowledged  {len(wrong)}")
    # What asynchronous replication may lose is reported above, not asserted; the
    # answers, the records and one order per key hold all the same.
    assert failover.answers.undocumented() == []
    assert counted.claims_nothing == 0
    assert counted.doubled == []
    assert counted.processing == 0
