"""The docs and the package's docstrings name modules that exist, not ones that moved away.

A name of a removed module sends a reader to nothing; a name of a module kept only to
re-export for one release (``MOVED``, each warning when imported) sends them to the
old house. Every dotted ``idempotency.…`` path, every ``….py`` file of the package and
every bare mention of a moved module's name in README.md, docs/ and the package's
docstrings and comments is checked. ``docs/architecture.md``'s table of moved paths is
the one place that names them, on purpose.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

import idempotency

# The package as imported (the installed wheel in the package pass), and the checkout that
# holds the docs and the tests.
PACKAGE = Path(idempotency.__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[2]
# Modules kept for one release, each re-exporting where its names went.
MOVED = ("core", "transitions", "write_guard", "resolution", "fanout")
# Removed modules whose names are no other thing's: a bare mention of one is stale.
REMOVED = ("waiting", "problems", "admin_actions", "admin_filters", "admin_forms")
DOCS = [ROOT / "README.md", ROOT / "tests" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TESTS = ROOT / "tests"
ALLOWED = {ROOT / "docs" / "architecture.md"}  # the table of moved paths

# A module path (``idempotency.protocol.claim``; two parts only when naming a moved
# module: ``idempotency.claimed`` is a log event, ``idempotency.E001`` a check).
DOTTED = re.compile(r"\bidempotency(?:\.[A-Za-z_]\w*)+")
# A file of the package by its path (``protocol/claim.py``), or a moved module's file.
ROOMS = "idempotency|protocol|stores|management|commands|contrib|prometheus|templates"
FILE = re.compile(rf"(?<![\w/.-])((?:(?:{ROOMS})/)+[a-z_]+\.py|(?:{'|'.join(MOVED)})\.py)\b")
BARE = re.compile(r"``(" + "|".join(MOVED + REMOVED) + r")``|`(" + "|".join(MOVED) + r")`(?!`)")
# A test module by its path in tests/ (``unit/protocol/test_claim.py``).
TEST_FILE = re.compile(
    r"(?<![\w/.-])(?:tests/)?((?:unit|protocol|deployment|example)/[\w/]*test_\w+\.py)"
)


def resolves(dotted: str) -> str | None:
    """The module ``dotted`` names (or whose attribute it names), or ``None``."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        target: object = found
        for name in parts[cut:]:
            if not hasattr(target, name):
                return None
            target = getattr(target, name)
        return module
    return None


def is_moved(module: str) -> bool:
    return module.removeprefix("idempotency.") in MOVED


def package_file(name: str) -> Path | None:
    relative = name.removeprefix("idempotency/")
    if (PACKAGE / relative).exists():
        return PACKAGE / relative
    # A path from inside its room (``commands/idempotency_cleanup.py``).
    matches = [path for path in PACKAGE.rglob("*.py") if path.as_posix().endswith(relative)]
    return matches[0] if len(matches) == 1 else None


def prose_of_package() -> Iterator[tuple[Path, int, str]]:
    """Each docstring and comment of the package's modules (not the moved ones themselves)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent == PACKAGE and path.stem in MOVED:
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                value = body[0].value
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    yield path, value.lineno, value.value
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                yield path, token.start[0], token.string


def prose_of_docs() -> Iterator[tuple[Path, int, str]]:
    for path in DOCS:
        if path in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            yield path, number, line


def stale(text: str) -> list[str]:
    found = []
    for dotted in DOTTED.findall(text):
        if is_moved(".".join(dotted.split(".")[:2])):  # not imported: each warns
            found.append(f"{dotted} (moved)")
        elif dotted.count(".") >= 2 and resolves(dotted) is None:
            found.append(f"{dotted} (no such module or name)")
    for name in FILE.findall(text):
        if Path(name).name.startswith("test_"):
            continue  # a test module: TEST_FILE's
        file = package_file(name)
        if file is None:
            found.append(f"{name} (no such file)")
        elif file.parent == PACKAGE and file.stem in MOVED:
            found.append(f"{name} (moved)")
    found += [f"``{a or b}`` (moved or removed)" for a, b in BARE.findall(text)]
    found += [
        f"{name} (no such test module)"
        for name in TEST_FILE.findall(text)
        if not (TESTS / name).exists()
    ]
    return found


def test_the_docs_name_modules_that_exist():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, line, text in prose_of_docs()
        for name in stale(text)
    ]
    assert offenders == []


def test_the_packages_docstrings_and_comments_name_modules_that_exist():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path, line, text in prose_of_package()
        for name in stale(text)
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "text",
    [
        "see ``idempotency.core``",
        "in idempotency/transitions.py",
        "the protocol (``core``)",
        "idempotency.stores.nowhere",
        "stores/nowhere.py",
        "fanout.py",
        "then `unit/test_core.py`",
    ],
)
def test_a_stale_name_is_found(text):
    assert stale(text)


def test_a_live_name_is_not():
    assert stale("``idempotency.protocol.execute.execute`` in protocol/claim.py, models.py") == []
