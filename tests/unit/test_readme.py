"""The README's front door: install commands that work before the first release, and the port.

Its curl commands run against the example in tests/example/test_readme_curls.py; the
wheel it names is built and installed by the package pass (scripts/package-check.sh).
"""

from __future__ import annotations

import re
import shlex
from importlib.metadata import version

from tests.support.processes import ROOT

README = (ROOT / "README.md").read_text()


def console_commands(tool: str) -> list[list[str]]:
    blocks = re.findall(r"```console\n(.*?)```", README, flags=re.S)
    joined = [re.sub(r"\\\n\s*", "", block) for block in blocks]  # continuation lines
    lines = [line.split("  #")[0].strip() for block in joined for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith(f"{tool} ")]


def test_each_install_command_installs_from_a_checkout_or_a_wheel():
    # Not on PyPI yet: "pip install django-idempotency" finds nothing there.
    targets = [words[-1] for words in console_commands("pip") if words[1] == "install"]
    assert len(targets) == 3
    for target in targets:
        source = target.partition("[")[0]
        assert source.startswith(("/path/to/", "dist/")), target


def test_the_wheel_installed_is_the_one_pip_wheel_builds_for_this_version():
    (build,) = [words for words in console_commands("pip") if words[1] == "wheel"]
    assert build[-1] == "/path/to/django-idempotency" and "--no-deps" in build
    wheel = f"django_idempotency-{version('django-idempotency')}-py3-none-any.whl"
    assert f'pip install "dist/{wheel}[' in README


def test_the_example_port_is_documented_beside_the_curls_that_assume_8000():
    assert "make example PORT=8080" in README
    assert "ADDR=${ADDR:-127.0.0.1:${PORT:-8000}}" in (ROOT / "scripts/example.sh").read_text()
    curls = console_commands("curl")
    assert curls and all(words[-1].startswith("http://127.0.0.1:8000/") for words in curls)
