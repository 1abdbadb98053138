"""A three-node MariaDB Galera cluster: duplicates on different nodes at once, lagging nodes.

scripts/galera.sh starts the cluster (one applier thread per node); each test serves
the example project under gunicorn and sends every key to several servers at once,
with the cheap password hasher so that the duplicates really meet.

- Multi-writer (each server writes to its own node): the per-key ``GET_LOCK`` turn of
  the MySQL store holds on one node only, so duplicates on different nodes may each
  run the view; the cluster lets one commit (the others fail certification at
  ``COMMIT``, 1213, or are aborted by its write set). Every duplicate must still get
  the winner's outcome (or a 409 to retry), never a 503, and no key two orders.
- Single-writer (every server writes to one node, as docs/high-availability.md
  recommends): duplicates queue as on one server, and each key's view runs once.
- A replay sent to a node that has not applied the record yet reads with
  ``wsrep_sync_wait``: the first outcome, not a second run.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.clusters import (
    Answer,
    Answers,
    checked,
    create,
    errors_logged,
    figures,
    kinds,
    logged_gunicorn,
    until_answered,
    view_runs,
)
from tests.support.example_server import Server, prepare_example

pytestmark = [pytest.mark.mariadb, pytest.mark.galera]

DATABASE = "idempotency_galera"
KEYS = 60  # each sent to three servers at once
LAGGING_REPLAYS = 20


def node_urls() -> list[str]:
    urls = os.environ.get("GALERA_URLS", "").split()
    if len(urls) < 2:
        pytest.fail("needs a Galera cluster: run it with scripts/passes.sh galera")
    return urls


def on(url: str, database: str = DATABASE) -> str:
    return url.rsplit("/", 1)[0] + "/" + database


@contextmanager
def node(url: str, database: str | None = DATABASE, sync: bool = True) -> Iterator[Any]:
    """A connection of the test's own to one node; ``sync``: its reads see every commit."""
    parts = urlsplit(url)
    options: dict[str, Any] = {"host": parts.hostname, "port": parts.port, "user": "root"}
    if database:
        options["db"] = database
    import MySQLdb  # here: the package pass collects this module without the mysql extra

    db = MySQLdb.connect(**options, autocommit=True)
    try:
        db.cursor().execute(f"SET SESSION wsrep_sync_wait = {15 if sync else 0}")
        yield db
    finally:
        db.close()


def count(url: str, sql: str, *params: Any, sync: bool = True) -> int:
    with node(url, sync=sync) as db:
        cursor = db.cursor()
        cursor.execute(sql, params)
        return int(cursor.fetchone()[0])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The example project's database on the cluster, one server per node, and their logs."""
    urls = node_urls()
    with node(urls[0], database=None) as db:
        size = db.cursor()
        size.execute("SHOW STATUS LIKE 'wsrep_cluster_size'")
        assert int(size.fetchone()[1]) == len(urls), "every node should be in the cluster"
        db.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        db.cursor().execute(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4")
    env = prepare_example(on(urls[0]))
    logs = tmp_path_factory.mktemp("galera-logs")
    try:
        with ExitStack() as stack:
            servers = []
            for number, url in enumerate(urls, 1):
                node_env = {**env, "DATABASE_URL": on(url)}
                log = logs / f"node{number}.log"
                served = stack.enter_context(logged_gunicorn(node_env, log))
                servers.append(Server(served, DATABASE))
            yield {"urls": urls, "env": env, "servers": servers, "logs": logs}
    finally:
        with node(urls[0], database=None) as db:
            db.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE}")


def at_once(
    servers: list[Server], keys: list[str], answers: Answers, **request: Any
) -> list[list[Answer]]:
    """Each key sent to every server at once (a barrier per key); per key, each first answer.

    A duplicate answered 409 or 503 is retried with the same key on its server, as a
    client that follows ``Retry-After`` does. ``request``: ``create``'s path and body.
    """
    barriers = {key: threading.Barrier(len(servers), timeout=60) for key in keys}

    def one(job: tuple[str, Server]) -> Answer:
        key, server = job
        barriers[key].wait()
        first = answers.add(create(server, key, **request))
        if first.status in (409, 503):
            until_answered(server, key, answers, **request)
        return first

    jobs = [(key, server) for key in keys for server in servers]
    with ThreadPoolExecutor(max_workers=8 * len(servers)) as pool:
        firsts = list(pool.map(one, jobs))
    return [firsts[i : i + len(servers)] for i in range(0, len(firsts), len(servers))]


def assert_one_effect_per_key(url: str, keys: list[str], answers: Answers) -> None:
    """Each key: one order, one record, and every 2xx answer that order's."""
    for key in keys:
        orders = {a.order for a in answers.all if a.key == key and a.status == 201}
        assert len(orders) == 1, f"{key} was answered with orders {orders}"
        first_runs = [a for a in answers.all if a.key == key and a.status == 201 and not a.replayed]
        assert len(first_runs) == 1, f"{key} was answered as a first run {len(first_runs)} times"
    skus = ", ".join(["%s"] * len(keys))
    assert count(url, f"SELECT count(*) FROM shop_order WHERE sku IN ({skus})", *keys) == len(keys)
    records = f"SELECT count(*) FROM idempotency_idempotencyrecord WHERE idem_key IN ({skus})"
    assert count(url, records, *keys) == len(keys)
    processing = (
        "SELECT count(*) FROM idempotency_idempotencyrecord "
        f"WHERE status = 'PROCESSING' AND idem_key IN ({skus})"
    )
    assert count(url, processing, *keys) == 0


def report(
    title: str,
    url: str,
    keys: list[str],
    firsts: list[list[Answer]],
    answers: Answers,
    runs: dict[str, int],
    seconds: float,
) -> str:
    first_answers = [answer for group in firsts for answer in group]
    skus = ", ".join(["%s"] * len(keys))
    doubled = sum(
        count(
            url,
            f"SELECT count(*) FROM ({sql} WHERE {column} IN ({skus}) "
            f"GROUP BY {column} HAVING count(*) > 1) doubled",
            *keys,
        )
        for sql, column in (
            ("SELECT sku FROM shop_order", "sku"),
            ("SELECT idem_key FROM idempotency_idempotencyrecord", "idem_key"),
        )
    )
    ran = sum(runs.get(key, 0) for key in keys)
    return figures(
        title,
        [
            ("keys", len(keys)),
            ("requests", len(answers.all)),
            ("first answers", kinds(Answers(first_answers).by_kind())),
            ("first answers that were the winner's replay", sum(a.replayed for a in first_answers)),
            ("all answers", kinds(answers.by_kind())),
            ("view runs", ran),
            ("keys whose view ran more than once", sum(runs.get(k, 0) > 1 for k in keys)),
            ("losing runs (rolled back)", ran - len(keys)),
            ("keys with two orders or two records", doubled),
            ("seconds", f"{seconds:.1f}"),
        ],
    )


def test_duplicates_on_different_nodes_at_once_are_a_contention_never_a_503(
    cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    servers, urls = cluster["servers"], cluster["urls"]
    keys = [f"mw-{uuid.uuid4().hex[:8]}-{i}" for i in range(KEYS)]
    answers = Answers()
    started = time.monotonic()
    firsts = at_once(servers, keys, answers)
    seconds = time.monotonic() - started
    logs = sorted(Path(cluster["logs"]).glob("node*.log"))
    runs = view_runs(logs)
    with capsys.disabled():
        print("\n" + report("Galera, multi-writer", urls[0], keys, firsts, answers, runs, seconds))
    assert answers.undocumented() == []
    assert [a for a in answers.all if a.status == 503] == [], "a contention answered as an outage"
    assert errors_logged(logs) == []
    assert_one_effect_per_key(urls[0], keys, answers)


def test_lease_mode_duplicates_on_different_nodes_run_the_work_once(
    cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # A lease-mode claim commits by itself before the work: of duplicate claims on two
    # nodes one fails certification at its COMMIT, claims again and finds the other's.
    servers, urls = cluster["servers"], cluster["urls"]
    keys = [f"lm-{uuid.uuid4().hex[:8]}-{i}" for i in range(KEYS // 2)]
    answers = Answers()
    started = time.monotonic()
    firsts = at_once(servers, keys, answers, path="/api/reports/", body={"seconds": 0})
    seconds = time.monotonic() - started
    logs = sorted(Path(cluster["logs"]).glob("node*.log"))
    runs = view_runs(logs, "completed")
    with capsys.disabled():
        print(
            "\n"
            + report(
                "Galera, multi-writer, lease mode", urls[0], keys, firsts, answers, runs, seconds
            )
        )
    assert answers.undocumented() == []
    assert [a for a in answers.all if a.status == 503] == []
    assert {key: runs[key] for key in keys if runs[key] != 1} == {}, "a lease-mode work ran twice"
    for key in keys:
        reports = {a.order for a in answers.all if a.key == key and a.status == 201}
        assert len(reports) == 1, f"{key} was answered with reports {reports}"


def test_single_writer_duplicates_run_the_view_once(
    cluster: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    urls, env = cluster["urls"], cluster["env"]
    keys = [f"sw-{uuid.uuid4().hex[:8]}-{i}" for i in range(KEYS)]
    answers = Answers()
    logs = [tmp_path / f"writer{n}.log" for n in range(3)]
    with ExitStack() as stack:
        # Three servers, every one writing to node 1 (a connection string naming it).
        served = [stack.enter_context(logged_gunicorn(env, log)) for log in logs]
        servers = [Server(url, DATABASE) for url in served]
        started = time.monotonic()
        firsts = at_once(servers, keys, answers)
        seconds = time.monotonic() - started
    runs = view_runs(logs)
    with capsys.disabled():
        print("\n" + report("Galera, single-writer", urls[0], keys, firsts, answers, runs, seconds))
    assert answers.undocumented() == []
    assert [a for a in answers.all if a.status == 503] == []
    assert errors_logged(logs) == []
    assert {key: runs[key] for key in keys if runs[key] != 1} == {}, "a view ran twice"
    assert_one_effect_per_key(urls[0], keys, answers)


def test_a_replay_on_a_node_that_has_not_applied_the_record_answers_it(
    cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    urls, servers = cluster["urls"], cluster["servers"]
    lagging_log = Path(cluster["logs"]) / "node2.log"
    key = f"lag-{uuid.uuid4().hex[:8]}"
    record = "SELECT count(*) FROM idempotency_idempotencyrecord WHERE idem_key = %s"
    # Node 2 applies the others' commits in order, with one thread: a commit it cannot
    # apply yet (a session there holds a read lock on its table) holds back every later
    # one, the record's among them, while node 2 answers anything else.
    with node(urls[0]) as db:
        db.cursor().execute("CREATE TABLE IF NOT EXISTS lag_gate (id BIGINT PRIMARY KEY)")
    with node(urls[1], sync=True) as held:
        held.cursor().execute("LOCK TABLES lag_gate READ")
        with node(urls[0]) as db:
            db.cursor().execute("INSERT INTO lag_gate VALUES (%s)", [time.time_ns()])
        try:
            first = create(servers[0], key)
            assert first.status == 201, first
            assert count(urls[1], record, key, sync=False) == 0, "node 2 should lag"
            with ThreadPoolExecutor(1) as pool:
                replay = pool.submit(create, servers[1], key)
                time.sleep(1.0)
                assert not replay.done(), "a replay on node 2 cannot be answered before it applies"
                held.cursor().execute("UNLOCK TABLES")
                lagged = replay.result(timeout=60)
        finally:
            held.cursor().execute("UNLOCK TABLES")
    assert (lagged.status, lagged.replayed, lagged.order) == (201, True, first.order), lagged
    # Right after each create, its replay on the other nodes (applied a moment late).
    answers = Answers()
    keys = [f"lag-{uuid.uuid4().hex[:8]}-{i}" for i in range(LAGGING_REPLAYS)]
    for number, each in enumerate(keys):
        created = answers.add(create(servers[number % 3], each))
        assert created.status == 201, created
        for other in (servers[(number + 1) % 3], servers[(number + 2) % 3]):
            again = answers.add(create(other, each))
            assert (again.status, again.replayed, again.order) == (201, True, created.order)
    runs = view_runs(sorted(Path(cluster["logs"]).glob("node*.log")))
    with capsys.disabled():
        print(
            "\n"
            + figures(
                "Galera, replays on nodes that had not applied the record",
                [
                    (
                        "lagging node (1 s behind): replay answered in",
                        f"{lagged.answered - lagged.sent:.1f} s",
                    ),
                    ("replays right after the create", f"{2 * LAGGING_REPLAYS}, all the first's"),
                    ("view runs for these keys", sum(runs[k] for k in keys)),
                ],
            )
        )
    assert view_runs([lagging_log])[key] == 0
    assert {k: runs[k] for k in keys if runs[k] != 1} == {}


def test_check_database_warns_that_several_nodes_may_take_the_writes(cluster: dict[str, Any]):
    said = checked({**cluster["env"], "DATABASE_URL": on(cluster["urls"][1])})
    assert "idempotency.W012" in said and "Galera cluster of 3 nodes" in said, said
