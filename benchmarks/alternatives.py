"""Install the alternatives into ``benchmarks/.alt-packages``, beside (not into) ``.venv``.

``pip install --target`` with ``--no-deps`` puts exactly the packages of
``requirements-alt.txt`` there; the benchmark server gets the folder on its
``PYTHONPATH`` and runs with the project's own Django, DRF and psycopg.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements-alt.txt"
TARGET = HERE / ".alt-packages"


def ensure_installed(python: str = sys.executable) -> Path | None:
    """The folder holding the alternatives, installing them once; ``None`` if pip failed."""
    stamp = TARGET / f".installed-{_digest()}"
    if stamp.exists():
        return TARGET
    command = [
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--upgrade",
        "--target",
        str(TARGET),
        "-r",
        str(REQUIREMENTS),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        print(f"could not install the alternatives:\n{result.stderr}", file=sys.stderr)
        return None
    for old in TARGET.glob(".installed-*"):
        old.unlink()
    stamp.touch()
    return TARGET


def _digest() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
