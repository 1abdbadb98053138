"""What the whole suite shares: the deprecations that fail it, and the docs' examples.

Every ```python block in README.md and docs/ runs as a test (sybil), in order, one
namespace per page, with Django set up from tests.settings and a test database. A block
that is only an illustration is preceded by ``<!-- skip: next "illustration: why" -->``.
"""

from __future__ import annotations

import signal
import sys
import types
from typing import Any

import django.utils.deprecation
import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser


def pytest_configure(config: pytest.Config) -> None:
    # What the next Django releases remove (RemovedInDjango60Warning, ...61Warning on
    # 5.2) fails here, not in a user's upgrade.
    for name in dir(django.utils.deprecation):
        if name.startswith("RemovedInDjango"):
            config.addinivalue_line("filterwarnings", f"error::django.utils.deprecation.{name}")


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _page_namespace(namespace: dict[str, Any]) -> None:
    # Functions defined on a page get a module name, as in a project's views.py, and are
    # found by their dotted path, as a task worker finds a project's tasks (docs/tasks.md).
    namespace["__name__"] = "docs_example"

    def found(name: str) -> Any:
        try:
            return namespace[name]
        except KeyError:
            raise AttributeError(name) from None

    page = types.ModuleType("docs_example")
    page.__getattr__ = found  # type: ignore[method-assign]
    sys.modules["docs_example"] = page
    # A task worker run on a page (db_worker) takes these for its own shutdown.
    namespace["__signals__"] = {number: signal.getsignal(number) for number in _SIGNALS}


def _page_done(namespace: dict[str, Any]) -> None:
    for number, handler in namespace["__signals__"].items():
        signal.signal(number, handler)
    sys.modules.pop("docs_example", None)


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=["*.md"],
    setup=_page_namespace,
    teardown=_page_done,
    fixtures=["transactional_db"],
).pytest()
