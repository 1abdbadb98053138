"""The package's imports run one way: no module imports, even lazily, one that imports it back.

And they run downwards: each module belongs to a layer (``LAYERS``) and imports
only from its own layer or those below. A new module must be given a layer.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import idempotency

PACKAGE = Path(idempotency.__file__).resolve().parent


def imports_of(path: Path) -> set[str]:
    """The ``idempotency`` modules ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in MODULES}
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# The package's own __init__ lends its names lazily; migrations are Django's.
SOURCES = {
    module_name(path): path
    for path in PACKAGE.rglob("*.py")
    if path != PACKAGE / "__init__.py" and "migrations" not in path.parts
}
MODULES = set(SOURCES)


def cycle() -> list[str]:
    graph = {name: imports_of(path) - {name} for name, path in SOURCES.items()}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> list[str]:
        if name in trail:
            return [*trail[trail.index(name) :], name]
        if name in done:
            return []
        for imported in sorted(graph.get(name, ())):
            found = visit(imported, [*trail, name])
            if found:
                return found
        done.add(name)
        return []

    for name in sorted(graph):
        found = visit(name, [])
        if found:
            return found
    return []


def test_no_import_cycle_in_the_package():
    assert cycle() == []


# Lowest first, by the package's own folders where it has them. The foundation:
# settings and their validation, the model, keys, fingerprints, resolvers, the
# outcome's types. Then where records live (``stores/`` and what names the
# databases and schemas that hold them); then the protocol (``protocol/``); then
# recovery and retention, which move records through the protocol's table; then
# what adapts it all to a framework or a deployment (HTTP, DRF, ninja, Celery, the
# admin, commands, system checks) and the deprecated paths kept for one release.
def _folder(folder: str) -> set[str]:
    return {name for name in MODULES if name.startswith(f"idempotency.{folder}")}


LAYERS: list[set[str]] = [
    {
        "idempotency.conf",
        "idempotency.settings_checks",
        "idempotency.models",
        "idempotency.indexes",
        "idempotency.exceptions",
        "idempotency.outcomes",
        "idempotency.signals",
        "idempotency.keys",
        "idempotency.fingerprint",
        "idempotency.resolvers",
        "idempotency.operations",
        "idempotency.compat",
        "idempotency.progress",
    },
    _folder("stores")
    | {
        "idempotency.replay_cache",
        "idempotency.shards",
        "idempotency.unmigrated",
        "idempotency.logs",
        "idempotency.tracing",
    },
    _folder("protocol") | {"idempotency.steps"},
    {"idempotency.recovery", "idempotency.retention"},
    _folder("contrib")
    | _folder("management")
    | _folder("admin")
    | {
        "idempotency.options",
        "idempotency.adapters",
        "idempotency.request",
        "idempotency.response",
        "idempotency.http",
        "idempotency.decorators",
        "idempotency.functions",
        "idempotency.drf",
        "idempotency.ninja",
        "idempotency.openapi",
        "idempotency.celery",
        "idempotency.tasks",
        "idempotency.beat",
        "idempotency.django_tasks",
        "idempotency.django_tasks_jobs",
        "idempotency.checks",
        "idempotency.apps",
        # Deprecated paths, each re-exporting what moved, for one release.
        "idempotency.core",
        "idempotency.transitions",
        "idempotency.write_guard",
        "idempotency.fanout",
        "idempotency.resolution",
    },
]
STORES, PROTOCOL, ADAPTERS = LAYERS[1] & _folder("stores"), LAYERS[2], LAYERS[4]
# Frameworks the protocol must work without: it is reached through their adapters.
FRAMEWORKS = {
    "rest_framework",
    "ninja",
    "celery",
    "django.http",
    "django.contrib",
    "django.tasks",
    "django_tasks",
    "django_tasks_db",
}


def layer_of(name: str) -> int:
    for number, layer in enumerate(LAYERS):
        if name in layer:
            return number
    raise AssertionError(f"{name} is in no layer: add it to LAYERS in {__file__}")


def external_imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports from outside the package, with its parents."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found |= {".".join(parts[: i + 1]) for i in range(len(parts))}
    return found


def test_the_cycle_finder_finds_a_lazy_import_back(monkeypatch, tmp_path):
    one, other = tmp_path / "one.py", tmp_path / "other.py"
    one.write_text("from idempotency.other import x\n")
    other.write_text("def f():\n    import idempotency.one\n")
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "SOURCES", {"idempotency.one": one, "idempotency.other": other})
    monkeypatch.setattr(this, "MODULES", {"idempotency.one", "idempotency.other"})
    assert cycle() == ["idempotency.one", "idempotency.other", "idempotency.one"]


def test_every_module_imports_only_its_own_layer_or_those_below():
    upward = [
        f"{name} (layer {layer_of(name)}) imports {imported} (layer {layer_of(imported)})"
        for name, path in sorted(SOURCES.items())
        for imported in sorted(imports_of(path))
        if layer_of(imported) > layer_of(name)
    ]
    assert upward == []


def test_the_protocol_knows_nothing_of_http_nor_of_its_adapters():
    assert PROTOCOL, "idempotency/protocol/ holds the protocol"
    for name in sorted(PROTOCOL):
        assert not imports_of(SOURCES[name]) & (ADAPTERS | LAYERS[3]), name
        assert not external_imports_of(SOURCES[name]) & FRAMEWORKS, name


def test_the_stores_never_import_the_protocol():
    assert STORES, "idempotency/stores/ holds the stores"
    for name in sorted(STORES):
        assert not imports_of(SOURCES[name]) & PROTOCOL, name


def test_the_foundation_knows_nothing_of_the_frameworks_adapted():
    # But for compat: the one room of the frameworks' non-public API, each use of it
    # pinned against the public path it replaces (tests/unit/test_compat.py).
    for name in sorted((LAYERS[0] - {"idempotency.compat"}) & MODULES):
        assert not external_imports_of(SOURCES[name]) & FRAMEWORKS, name
