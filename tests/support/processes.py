"""Real processes against the test database: environment and lifecycle helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


SCHEMES = {"postgresql": ("postgres", 5432), "mysql": ("mysql", 3306)}


def database_url(name: str | None = None) -> str:
    """The URL of the test database (or of database ``name`` on its server), for another process."""
    settings = connection.settings_dict
    assert connection.vendor in SCHEMES, "processes share a database on PostgreSQL or MariaDB"
    scheme, default_port = SCHEMES[connection.vendor]
    credentials = quote(settings["USER"] or "")
    if settings["PASSWORD"]:
        credentials += ":" + quote(settings["PASSWORD"])
    host = settings["HOST"] or "127.0.0.1"
    port = settings["PORT"] or default_port
    return f"{scheme}://{credentials}@{host}:{port}/{quote(name or settings['NAME'])}"


def process_env(*, database: bool = True, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TEST_DATABASE_NAME", "DATABASE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    if database:
        env["DATABASE_URL"] = database_url()
    env.update(extra)
    return env


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def start(command: Sequence[str], env: dict[str, str], log: Path | None = None) -> subprocess.Popen:
    output = log.open("wb") if log is not None else subprocess.PIPE
    return subprocess.Popen(
        list(command),
        cwd=ROOT,
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
        start_new_session=True,  # its own process group: stopped as a whole
    )


def stop(process: subprocess.Popen, timeout: float = 10) -> None:
    """Stop a process we started (and its children), politely first."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)
