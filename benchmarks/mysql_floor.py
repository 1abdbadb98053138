"""The database floor on MariaDB/MySQL: one create's statements, driven from Python.

``floor.py``'s counterpart. MariaDB has no pgbench, and mysqlslap cannot carry
a value from one statement to the next (the finish names the record the claim
read), so each client is a process of its own with one mysqlclient connection,
sending the captured statements as text, as Django sends them (no prepared
statements: mysqlclient has none). A transaction is what Django makes of one:
autocommit off, the statements, ``COMMIT``, autocommit on.

The statements are captured at the driver, below Django, from the second of two
protected creates in this process: the store's own (its named lock, the lock
wait it sets and puts back, on the driver's cursor) are among them, and what a
connection asks once (whether it is a Galera node) is not.
"""

from __future__ import annotations

import re
import statistics
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from benchmarks.floor import (
    PROTECTED,
    TRANSACTION,
    UNPROTECTED,
    WRITTEN_ONCE,
    FloorResult,
    _captured_create,
    measurement,
)
from benchmarks.server import Database
from benchmarks.stats import rotated

BEGIN, COMMIT = "BEGIN", "COMMIT"  # markers: autocommit off, and the commit with it back on
KEY, RECORD_ID = "__KEY__", "__RECORD_ID__"  # filled in per transaction
PROTOCOL = "simple"  # statements as text, as pgbench's simple protocol sends them
RECORDS = "`idempotency_idempotencyrecord`"


def build_scripts() -> dict[str, list[str]]:
    """Each measurement's statements, a new key per transaction (needs Django set up)."""
    protected = _captured(None)
    once = _captured("run")
    (insert,) = [sql for sql in once if sql.startswith("INSERT INTO `shop_order`")]
    return {
        UNPROTECTED: [insert],
        TRANSACTION: [BEGIN, insert, COMMIT],
        PROTECTED: [BEGIN, *protected, COMMIT],
        WRITTEN_ONCE: [BEGIN, *once, COMMIT],
    }


def _captured(in_flight: str | None) -> list[str]:
    _captured_create(f"floor-{uuid.uuid4().hex}", in_flight)  # the connection's first asks
    key = f"floor-{uuid.uuid4().hex}"
    with _sent() as sent:
        django_saw = _captured_create(key, in_flight)
    # Every statement ran in the protocol's one transaction (Django logs its edges).
    assert django_saw[0] == BEGIN and django_saw[-1] == COMMIT, django_saw
    # The capture's own look-up of the benchmark's user is no statement of the create.
    return [_template(sql, key) for sql in sent if "FROM `auth_user`" not in sql]


@contextmanager
def _sent() -> Iterator[list[str]]:
    """Every statement sent on a mysqlclient cursor meanwhile, as sent (parameters bound)."""
    from MySQLdb.cursors import BaseCursor

    sent: list[str] = []
    original = BaseCursor.execute

    def execute(self: Any, query: Any, args: Any = None) -> Any:
        result = original(self, query, args)
        executed = self._executed
        # A digest column's literal is raw bytes (_binary'...'): kept as they were sent.
        text = executed.decode(errors="surrogateescape") if isinstance(executed, bytes) else None
        sent.append(text if text is not None else str(executed))
        return result

    BaseCursor.execute = execute  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        BaseCursor.execute = original  # type: ignore[method-assign]


# A quoted literal as mysqlclient writes it (escape_string's escapes); a digest column's
# bytes are one too, written as they are.
_LITERAL = re.compile(r"'((?:[^'\\]|\\.)*)'", re.DOTALL)
_UNESCAPED = {"0": "\0", "n": "\n", "r": "\r", "Z": "\x1a"}


def _printable(literal: re.Match[str]) -> str:
    """A literal of bytes that are no text as ``X'...'``: the same bytes, printable."""
    text = re.sub(r"\\(.)", lambda escape: _UNESCAPED.get(escape[1], escape[1]), literal[1])
    if text.isprintable():
        return literal[0]
    return f"X'{text.encode(errors='surrogateescape').hex()}'"


def _template(sql: str, key: str) -> str:
    sql = _LITERAL.sub(_printable, sql)
    sql = " ".join(sql.split())
    sql = sql.replace(key, f"floor-{KEY}")
    sql = re.sub(r"'idempotency:[0-9a-f]{48}'", f"'idempotency:{KEY}'", sql)  # the named lock
    # The finish names the record the claim read: the id read back in this transaction.
    return re.sub(rf"{RECORDS}\.`id` = \d+", f"{RECORDS}.`id` = {RECORD_ID}", sql)


def statements(script: list[str]) -> int:
    """Round trips of one transaction: the autocommit switches count, as pgbench's BEGIN does."""
    return sum(2 if sql == COMMIT else 1 for sql in script)  # the commit, autocommit back on


def measure(
    database: Database,
    rounds: int,
    seconds: int,
    clients: int,
    scripts: dict[str, list[str]] | None = None,
) -> FloorResult:
    """Transactions per second of each script, ``clients`` at once, in alternating rounds."""
    chosen = scripts or build_scripts()
    result = FloorResult(clients=clients)
    with ProcessPoolExecutor(max_workers=clients) as pool:
        for round_ in range(rounds):
            for name in rotated(list(chosen), round_):
                start = time.time() + 0.5  # every client connected before the clock runs
                runs = [
                    pool.submit(_client, database, chosen[name], start, seconds, None)
                    for _ in range(clients)
                ]
                done = sum(run.result() for run in runs)
                result.tps.setdefault(measurement(name, PROTOCOL), []).append(done / seconds)
    return result


def _client(
    database: Database, script: list[str], start: float, seconds: float, limit: int | None
) -> int:
    """One client: ``script`` from ``start`` for ``seconds``, or ``limit`` transactions."""
    connection = database.connect_mysql()
    cursor = connection.cursor()
    # The session as Django sets it up (example_project/settings.py, Django's default
    # isolation): under REPEATABLE READ the claim's locking read of a missing key takes a
    # gap lock, and simultaneous claims deadlock where Django's never do.
    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    cursor.execute("SET time_zone = '+00:00'")
    time.sleep(max(0.0, start - time.time()))
    deadline, done = start + seconds, 0
    while (done < limit) if limit is not None else (time.time() < deadline):
        _transaction(connection, cursor, script, uuid.uuid4().hex)
        done += 1
    connection.close()
    return done


def _transaction(connection: Any, cursor: Any, script: list[str], key: str) -> None:
    record = "0"
    for sql in script:
        if sql == BEGIN:
            connection.autocommit(False)
        elif sql == COMMIT:
            connection.commit()
            connection.autocommit(True)
        else:
            sql = sql.replace(KEY, key).replace(RECORD_ID, record)
            cursor.execute(sql.encode(errors="surrogateescape"))
            row = cursor.fetchone() if cursor.description else None
            if row and f"FROM {RECORDS}" in sql:
                record = str(row[0])


# What one transaction writes: InnoDB's redo log, WAL's counterpart


@dataclass
class Redo:
    bytes_per_transaction: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        values = self.bytes_per_transaction.get(name)
        return statistics.median(values) if values else float("nan")


def redo(database: Database, scripts: dict[str, list[str]], rounds: int, transactions: int) -> Redo:
    """Redo bytes per transaction: the log sequence number before and after a run of one client.

    The LSN is the server's: whatever else writes meanwhile counts too, so the
    run wants a quiet server (the rounds alternate, and the median is reported).
    """
    result = Redo()
    for round_ in range(rounds):
        for name in rotated(list(scripts), round_):
            before = _lsn(database)
            _client(database, scripts[name], time.time(), 0, transactions)
            written = (_lsn(database) - before) / transactions
            result.bytes_per_transaction.setdefault(name, []).append(written)
    return result


def _lsn(database: Database) -> int:
    connection = database.connect_mysql()
    try:
        cursor = connection.cursor()
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_lsn_current'")
        return int(cursor.fetchone()[1])
    finally:
        connection.close()
