"""The package's imports run one way: no module imports, even lazily, one that imports it back."""

from __future__ import annotations

import ast
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


def test_the_protocol_knows_nothing_of_http_nor_of_its_adapters():
    imported = imports_of(SOURCES["idempotency.core"])
    assert not imported & {"idempotency.http", "idempotency.drf", "idempotency.decorators"}
    assert "rest_framework" not in SOURCES["idempotency.core"].read_text()
    assert "django.http" not in SOURCES["idempotency.core"].read_text()
