"""The benchmark's PostgreSQL database and its gunicorn server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
USER, PASSWORD = "bench", "bench-password"


@dataclass(frozen=True)
class Database:
    host: str
    port: int
    user: str
    password: str
    name: str

    @classmethod
    def from_url(cls, url: str, name: str) -> Database:
        parts = urlsplit(url)
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5432,
            user=parts.username or "postgres",
            password=parts.password or "",
            name=name,
        )

    @classmethod
    def named(cls, name: str) -> Database:
        """The database ``name`` on the server of ``BENCH_DATABASE_URL``."""
        server = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        return cls.from_url(server, name)

    @property
    def url(self) -> str:
        password = f":{self.password}" if self.password else ""
        return f"postgres://{self.user}{password}@{self.host}:{self.port}/{self.name}"

    def connect(self, **options: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password or None,
            dbname=options.pop("dbname", self.name),
            **options,
        )

    def recreate(self) -> None:
        with self.connect(dbname="postgres", autocommit=True) as admin:
            name = sql.Identifier(self.name)
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(name))

    def drop(self) -> None:
        with self.connect(dbname="postgres", autocommit=True) as admin:
            name = sql.Identifier(self.name)
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))

    def scalar(self, query: str, *params: Any) -> Any:
        with self.connect(autocommit=True) as connection:
            row = connection.execute(query, params).fetchone()
        return None if row is None else row[0]


def environment(database: Database, alternatives: Path | None, run_id: str) -> dict[str, str]:
    """What the server and ``manage.py`` run with: benchmark settings, this database."""
    paths = [str(ROOT)] + ([str(alternatives)] if alternatives else [])
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"TEST_DATABASE_NAME", "REQUIRE_POSTGRES", "PYTHONPATH"}
    }
    env.update(
        DJANGO_SETTINGS_MODULE="benchmarks.settings",
        DATABASE_URL=database.url,
        PYTHONPATH=os.pathsep.join(paths),
        PYTHONUNBUFFERED="1",
        BENCH_RUN_ID=run_id,
    )
    return env


def prepare(env: dict[str, str]) -> None:
    """Migrate and create the benchmark's user."""
    manage(env, "migrate", "--noinput", "-v", "0")
    code = (
        "from django.contrib.auth.models import User\n"
        f"User.objects.create_user({USER!r}, password={PASSWORD!r})\n"
    )
    manage(env, "shell", "-c", code)


def manage(env: dict[str, str], *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")


@contextmanager
def gunicorn(env: dict[str, str], workers: int, threads: int, log: Path) -> Iterator[int]:
    """Serve the benchmark settings on 127.0.0.1 at a free port; yields the port."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "example_project.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--worker-class",
        "gthread",
        "--threads",
        str(threads),
        "--keep-alive",
        "120",
        "--backlog",
        "2048",
        "--timeout",
        "60",
        "--log-level",
        "warning",
    ]
    with log.open("ab") as output:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=output)
    try:
        _wait_until_serving(port, process)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_until_serving(port: int, process: subprocess.Popen[bytes]) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("gunicorn exited before serving; see its log")
        try:
            with opener.open(f"http://127.0.0.1:{port}/", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not answer within 60 s")
