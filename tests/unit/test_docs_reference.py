"""The reference pages name everything the code defines, so they cannot drift from it again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.dispatch import Signal

import idempotency
from idempotency import signals
from idempotency.conf import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CHECK_ID = re.compile(r"idempotency\.[EWI]\d{3}")


def _page(name: str) -> str:
    return (DOCS / name).read_text()


def _check_ids_in_code() -> set[str]:
    # Every id the package can report, wherever the checks live (the source, not one module);
    # the package imported, which the package pass installs from the wheel.
    sources = Path(idempotency.__file__).parent.rglob("*.py")
    return {match for path in sources for match in CHECK_ID.findall(path.read_text())}


def _error_classes(base: type) -> list[type]:
    found = []
    for sub in base.__subclasses__():
        found += [sub, *_error_classes(sub)]
    return found


def test_the_code_reports_check_ids():
    assert len(_check_ids_in_code()) >= 39  # the search above finds them at all


@pytest.mark.parametrize("check_id", sorted(_check_ids_in_code()))
def test_every_check_id_is_in_the_reference(check_id):
    assert f"`{check_id}`" in _page("checks.md")


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_every_setting_is_in_the_reference(name):
    assert re.search(rf"^\| `{name}` \|", _page("settings.md"), re.MULTILINE), name


def test_every_error_code_is_in_the_reference():
    codes = {cls.code for cls in _error_classes(idempotency.IdempotencyError)}
    assert "idempotency_key_reused" in codes
    page = _page("errors.md")
    assert sorted(code for code in codes if f"`{code}`" not in page) == []


def test_every_signal_is_in_the_reference():
    names = {name for name, value in vars(signals).items() if isinstance(value, Signal)}
    assert "record_claimed" in names
    page = _page("signals.md")
    assert sorted(name for name in names if f"| `{name}` |" not in page) == []


def test_every_marker_is_in_the_tests_readme():
    pyproject = (ROOT / "pyproject.toml").read_text()
    block = pyproject[
        pyproject.index("markers = [") : pyproject.index("]", pyproject.index("markers = ["))
    ]
    declared = set(re.findall(r'^\s*"(\w+):', block, re.M))
    listed = set(re.findall(r"^\| `(\w+)` \|", (ROOT / "tests" / "README.md").read_text(), re.M))
    assert declared and declared == listed
