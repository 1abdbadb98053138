"""The stores are the one writer of the records and their steps.

Every insert, update and delete of ``IdempotencyRecord`` and ``IdempotencyStep``
is a method of ``idempotency.stores``: the protocol, recovery, retention, steps,
the admin and the commands ask a store. Two checks keep it so: one reads the
package's source for ORM writes and write statements outside ``stores/`` (and
the migrations), the other runs every path that writes (claims, finishes, a
release, steps, recovery, an operator's move, the admin's delete, the purge with
a replay cache, the sweep of orphaned steps) and looks at who sent each write.
"""

from __future__ import annotations

import ast
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.sites import site
from django.db import connection
from django.test import override_settings
from django.utils import timezone

import idempotency
from idempotency.fingerprint import digest_of, fingerprint
from idempotency.models import IdempotencyRecord, IdempotencyStep, Status
from idempotency.protocol import Operation
from idempotency.protocol.execute import execute
from idempotency.protocol.states import transition
from idempotency.recovery import recover_expired
from idempotency.retention import purge, purge_orphan_steps

PACKAGE = Path(idempotency.__file__).resolve().parent
STORES = PACKAGE / "stores"

# Calls that write whatever they are called on, and those that write on a queryset.
ALWAYS = {"delete", "bulk_create", "bulk_update", "get_or_create", "update_or_create"}
QUERYSET = re.compile(r"objects|filter|exclude|using|select_for_update|record|step|rows")
# A write statement as SQL is sent (Django's) and as this package writes it.
WRITE_SQL = re.compile(r"^\s*(INSERT|UPDATE|DELETE|MERGE|REPLACE|TRUNCATE)\b", re.IGNORECASE)
WRITE_SQL_IN_SOURCE = re.compile(r"\b(INSERT INTO|DELETE FROM|UPDATE \S+ SET|TRUNCATE \S)")


def receiver(node: ast.AST) -> str:
    """The dotted chain a call is made on: ``IdempotencyStep.objects.using.filter``."""
    names = []
    while isinstance(node, (ast.Attribute, ast.Call)):
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        else:
            node = node.func
    if isinstance(node, ast.Name):
        names.append(node.id)
    return ".".join(reversed(names))


def literal(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with ``{}`` for each value it formats."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(literal(part) or "{}" for part in node.values)
    return None


def writes_in(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        text = literal(node)
        if text is not None and WRITE_SQL_IN_SOURCE.search(text):
            found.append((node.lineno, f"SQL {text[:30]!r}"))
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, on = node.func.attr, receiver(node.func.value)
        written = (
            name in ALWAYS
            or (name == "update" and node.keywords and not node.args and QUERYSET.search(on))
            or (name == "create" and "objects" in on)
            or (name == "save" and "form" not in on.lower() and "super" not in on)
        )
        if written:
            found.append((node.lineno, f".{name}() on {on or '?'}"))
    return found


def outside_the_stores() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if parts[0] not in ("stores", "migrations"):
            yield path


def test_no_code_outside_the_stores_writes_records_or_steps():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for path in outside_the_stores()
        for line, what in writes_in(path.read_text())
    ]
    assert offenders == [], "ask the store (idempotency.stores) to write: " + "; ".join(offenders)


@pytest.mark.parametrize(
    "source",
    [
        "IdempotencyStep.objects.using(db).filter(record_id=1).delete()",
        "IdempotencyRecord.objects.filter(pk=1).update(status='X')",
        "IdempotencyStep.objects.using(db).create(record_id=1)",
        "record.save(update_fields=['status'])",
        "cursor.execute('DELETE FROM idempotency_idempotencyrecord')",
        "cursor.execute(f'UPDATE {table} SET status = %s')",
    ],
)
def test_the_check_finds_each_kind_of_write(source):
    assert writes_in(source)


def test_the_check_leaves_reads_and_dicts_alone():
    assert not writes_in("values.update(status='X'); IdempotencyRecord.objects.filter(pk=1).get()")


# Who sends each write, run for real


class Writers:
    """Each write statement on the records and steps tables, with the package frame that sent it."""

    TABLES = (IdempotencyRecord._meta.db_table, IdempotencyStep._meta.db_table)

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if WRITE_SQL.match(sql) and any(table in sql for table in self.TABLES):
            self.seen.append((sql.split()[0].upper(), self.sender()))
        return execute(sql, params, many, context)

    @staticmethod
    def sender() -> str:
        """The innermost frame of the package (not of this test) on the stack."""
        for frame in reversed(traceback.extract_stack()):
            path = Path(frame.filename).resolve()
            if PACKAGE in path.parents:
                return str(path.relative_to(PACKAGE))
        return "?"

    def outside_the_stores(self) -> list[tuple[str, str]]:
        return [(kind, sender) for kind, sender in self.seen if not sender.startswith("stores")]


@contextmanager
def watched() -> Iterator[Writers]:
    writers = Writers()
    with connection.execute_wrapper(writers):
        yield writers


def lease_operation(key: str, request: str = "a") -> Operation:
    return Operation(
        scope="user:1",
        key=key,
        request_hash=fingerprint([request]),
        name="tests.one_writer",
        mode="lease",
        lease_seconds=30,
    )


def run(op: Operation, work: Any, decide: Any = None) -> Any:
    from idempotency.functions import _record_result, _stored_result

    return execute(op, work, decide=decide or _record_result, replay=_stored_result)


class Crash(Exception):
    pass


def crash(attempt: Any) -> None:
    attempt.step_key("charge")
    raise Crash


@pytest.mark.django_db(transaction=True)
def test_every_write_of_every_path_is_sent_by_a_store(rf, admin_user):
    local = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    caches = {"default": local, "replays": {**local, "LOCATION": "one-writer"}}
    with override_settings(CACHES=caches, IDEMPOTENCY={"REPLAY_CACHE": "replays"}), watched() as w:
        # A request's own moves: claim, steps, finish; a release and a retry; a discard.
        run(lease_operation("k1"), lambda a: a.step("charge", lambda key: {"id": "ch_1"}))
        with pytest.raises(Crash):
            run(lease_operation("k2"), crash)
        run(lease_operation("k2"), lambda a: a.step_key("charge"))
        run(lease_operation("k3"), lambda a: a.step_key("charge"), decide=lambda v, a: None)
        # Recovery and an operator: a lost lease, then a record under review marked done.
        lost = IdempotencyRecord.objects.create(
            scope="user:1",
            idem_key="k5",
            request_hash=digest_of(fingerprint(["a"])),
            owner_token=b"a" * 16,
            lease_until=timezone.now() - timedelta(minutes=1),
        )
        recover_expired()
        transition(IdempotencyRecord.objects.get(pk=lost.pk), Status.SUCCEEDED)
        # The replacement of an expired record, the admin's delete, the purge, the sweep.
        IdempotencyRecord.objects.filter(idem_key="k1").update(
            expires_at=timezone.now() - timedelta(days=1)
        )
        run(lease_operation("k1", request="b"), lambda a: None)
        request = rf.post("/admin/")
        request.user = admin_user
        site._registry[IdempotencyRecord].delete_queryset(
            request, IdempotencyRecord.objects.filter(idem_key="k2")
        )
        IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(days=1))
        purge()
        purge_orphan_steps()
    kinds = {kind for kind, _ in w.seen}
    assert kinds >= {"INSERT", "UPDATE", "DELETE"}
    # The test itself wrote too (the lost lease, the expiries): those come from no package frame.
    assert [seen for seen in w.outside_the_stores() if seen[1] != "?"] == []
