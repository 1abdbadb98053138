"""What the whole suite shares: the deprecations that fail it, and the docs' examples.

Every ```python block in README.md and docs/ runs as a test (sybil), in order, one
namespace per page, with Django set up from tests.settings and a test database. A block
that is only an illustration is preceded by ``<!-- skip: next "illustration: why" -->``.
"""

from __future__ import annotations

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


def _page_namespace(namespace: dict[str, Any]) -> None:
    # Functions defined on a page get a module name, as in a project's views.py.
    namespace["__name__"] = "docs_example"


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=["*.md"],
    setup=_page_namespace,
    fixtures=["transactional_db"],
).pytest()
