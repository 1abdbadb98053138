"""The database floor: one create's statements run by pgbench, without Python or HTTP.

The statements are the ones Django and this app send for the order create,
captured from one protected create in this process (parameters bound
client-side, as Django binds them by default). Three scripts: the unprotected
create (one autocommitted INSERT), the same INSERT in a transaction, the
protected create (BEGIN, claim, INSERT, finish, COMMIT; a new key each time,
so the claim is its one INSERT) and the protected create with the record
written once (``in_flight="run"``: BEGIN, INSERT, the finished record's INSERT,
COMMIT; captured from the real protocol too); each run with
pgbench's simple protocol (parsed and planned every time, as behind Django's
default connections) and prepared (planned once per connection, as with
``prepare_threshold``), in alternating rounds.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.server import USER, Database
from benchmarks.stats import rotated

UNPROTECTED = "INSERT (autocommit), the unprotected create"
TRANSACTION = "BEGIN; INSERT; COMMIT"
PROTECTED = "BEGIN; claim; INSERT; finish; COMMIT, the protected create"
WRITTEN_ONCE = "BEGIN; INSERT; record INSERT; COMMIT, the record written once"
PROTOCOLS = ("simple", "prepared")


def measurement(script: str, protocol: str) -> str:
    return f"{script}, {protocol}"


@dataclass
class FloorResult:
    tps: dict[str, list[float]] = field(default_factory=dict)
    clients: int = 0
    missing: str = ""  # why nothing was measured

    def median(self, name: str) -> float:
        return statistics.median(self.tps[name]) if self.tps.get(name) else float("nan")

    def paired(self, top: str, bottom: str) -> tuple[float, float, float]:
        """The median of ``top``'s tx/s over ``bottom``'s per round, and the lowest and highest.

        The two ran seconds apart in one round: on a shared machine a ratio per
        round cancels the neighbours' drift that a ratio of medians keeps.
        """
        rounds = zip(self.tps.get(top, []), self.tps.get(bottom, []), strict=True)
        ratios = [a / b for a, b in rounds if b]
        if not ratios:
            return float("nan"), float("nan"), float("nan")
        return statistics.median(ratios), min(ratios), max(ratios)


def measure(
    database: Database,
    rounds: int,
    seconds: int,
    clients: int,
    scripts: dict[str, str] | None = None,
) -> FloorResult:
    """Needs Django set up on ``database`` (``bulk.setup_django``); ``scripts``: ``scripts()``'s."""
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        return FloorResult(missing="pgbench was not found on PATH: the floor was not measured.")
    result = FloorResult(clients=clients)
    with tempfile.TemporaryDirectory() as folder:
        runs = {}
        for index, (name, script) in enumerate((scripts or build_scripts()).items()):
            path = Path(folder) / f"script{index}.sql"
            path.write_text(script)
            for protocol in PROTOCOLS:
                runs[measurement(name, protocol)] = (path, protocol)
        for round_ in range(rounds):
            for name in rotated(list(runs), round_):
                path, protocol = runs[name]
                tps = _pgbench(pgbench, database, path, protocol, seconds, clients)
                result.tps.setdefault(name, []).append(tps)
    return result


def build_scripts() -> dict[str, str]:
    """pgbench's script of each measurement: each transaction takes a new key."""
    key = f"floor-{uuid.uuid4().hex}"
    insert, claim, finish = captured_statements(key)
    # The claim returns the new record's id: pgbench's \gset makes each column a
    # variable, and the finish uses :id.
    claim = claim.replace(f"'{key}'", "'floor-' || :k")
    finish = re.sub(r'"id" = \d+', '"id" = :id', finish, count=1)
    once = f"floor-{uuid.uuid4().hex}"
    once_insert, record = captured_written_once(once)
    record = record.replace(f"'{once}'", "'floor-once-' || :k")
    return {
        UNPROTECTED: f"{insert};\n",
        TRANSACTION: f"BEGIN;\n{insert};\nCOMMIT;\n",
        PROTECTED: protected_script(claim, insert, finish),
        WRITTEN_ONCE: written_once_script(once_insert, record),
    }


def statements(script: str) -> int:
    """Statements one transaction of ``script`` sends (pgbench's meta commands are none)."""
    return sum(1 for line in script.splitlines() if line.strip() and not line.startswith("\\"))


def written_once_script(insert: str, record: str) -> str:
    # RETURNING's id is read by nobody here: the script only has to send what the app sends.
    lines = ["\\set k random(1, 1000000000000)", "BEGIN;", f"{insert};", f"{record};"]
    return "\n".join([*lines, "COMMIT;", ""])


def protected_script(claim: str, insert: str, finish: str) -> str:
    lines = ["\\set k random(1, 1000000000000)", "BEGIN;", f"{claim} \\gset"]
    return "\n".join([*lines, f"{insert};", f"{finish};", "COMMIT;", ""])


def captured_statements(key: str) -> tuple[str, str, str]:
    """The order INSERT, the claim and the finish, as sent for one protected create."""
    from idempotency.models import IdempotencyRecord

    sent = _captured_create(key, in_flight=None)
    records = f'INSERT INTO "{IdempotencyRecord._meta.db_table}"'
    (claim,) = [sql for sql in sent if sql.startswith(records)]
    (insert,) = [sql for sql in sent if sql.startswith("INSERT") and sql != claim]
    (finish,) = [sql for sql in sent if sql.startswith("UPDATE")]
    return insert, claim, finish


def captured_written_once(key: str) -> tuple[str, str]:
    """The order INSERT and the finished record's INSERT of one create with ``in_flight="run"``.

    Captured from the protocol itself, as the default one's are, so the script
    follows whatever the store sends; it must send exactly those two and nothing else
    (no claim, no finish, no read).
    """
    from idempotency.models import IdempotencyRecord

    sent = _captured_create(key, in_flight="run")
    records = f'INSERT INTO "{IdempotencyRecord._meta.db_table}"'
    (record,) = [sql for sql in sent if sql.startswith(records)]
    (insert,) = [sql for sql in sent if sql.startswith("INSERT") and sql != record]
    assert [sql for sql in sent if sql not in ("BEGIN", "COMMIT")] == [insert, record], sent
    return insert, record


def _captured_create(key: str, in_flight: str | None) -> list[str]:
    """The statements one protected create sends, one line each."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from example_project.shop.models import Order
    from idempotency.models import Status
    from idempotency.outcomes import Outcome, StoredResponse
    from idempotency.protocol import Operation
    from idempotency.protocol.execute import execute

    user = get_user_model().objects.get(username=USER)
    operation = Operation(
        scope="bench-floor",
        key=key,
        request_hash="0" * 64,
        name="bench.floor" if in_flight is None else f"bench.floor.{in_flight}",
        method="POST",
        in_flight=in_flight,  # type: ignore[arg-type]  # a literal of InFlight or None
    )
    body = b'{"id": 1, "sku": "bench", "quantity": 1, "status": "PENDING"}'
    with CaptureQueriesContext(connection) as queries:
        execute(
            operation,
            lambda attempt: Order.objects.create(owner=user, sku="bench", quantity=1),
            decide=lambda order, attempt: Outcome(
                Status.SUCCEEDED,
                StoredResponse(201, [("Content-Type", "application/json")], body),
                str(order.pk),
            ),
            replay=lambda record: None,
        )
    # One line each: pgbench ends a meta command (\gset) at the end of its line.
    return [" ".join(query["sql"].split()) for query in queries]


def _pgbench(
    pgbench: str, database: Database, script: Path, protocol: str, seconds: int, clients: int
) -> float:
    command = [
        pgbench,
        "--no-vacuum",
        f"--protocol={protocol}",
        f"--client={clients}",
        f"--jobs={min(clients, 2)}",
        f"--time={seconds}",
        f"--file={script}",
        f"--host={database.host}",
        f"--port={database.port}",
        f"--username={database.user}",
        database.name,
    ]
    environment = {"PATH": os.environ.get("PATH", "")}
    if database.password:
        environment["PGPASSWORD"] = database.password
    completed = subprocess.run(command, capture_output=True, text=True, env=environment)
    match = re.search(r"^tps = ([\d.]+)", completed.stdout, re.MULTILINE)
    if completed.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench failed:\n{completed.stdout}\n{completed.stderr}")
    return float(match.group(1))
