"""The module paths the protocol moved from still import, for one release, with a warning."""

from __future__ import annotations

import importlib
import sys

import pytest

MOVED = {
    "idempotency.core": ("execute", "Operation", "Attempt", "database_unavailable"),
    "idempotency.transitions": ("transition", "postpone", "can_transition"),
    "idempotency.write_guard": ("writes_only_to", "CrossDatabaseWrite"),
    "idempotency.resolution": ("mark_records", "run_resolvers", "ResolutionReport"),
    "idempotency.fanout": ("recover_everywhere", "purge_everywhere", "total"),
}


@pytest.mark.parametrize("path", sorted(MOVED))
def test_an_old_path_warns_and_gives_the_same_objects(path, monkeypatch):
    monkeypatch.delitem(sys.modules, path, raising=False)
    with pytest.warns(DeprecationWarning, match=path.replace(".", r"\.")):
        module = importlib.import_module(path)
    for name in MOVED[path]:
        assert getattr(module, name) is not None, name


def test_the_old_paths_give_what_the_new_ones_do(monkeypatch):
    from idempotency import Operation, execute
    from idempotency.protocol.states import transition

    for path in ("idempotency.core", "idempotency.transitions"):
        monkeypatch.delitem(sys.modules, path, raising=False)
    with pytest.warns(DeprecationWarning):
        core = importlib.import_module("idempotency.core")
        transitions = importlib.import_module("idempotency.transitions")
    assert core.execute is execute and core.Operation is Operation
    assert transitions.transition is transition
