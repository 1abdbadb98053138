"""The benchmark's database (PostgreSQL, or MariaDB/MySQL) and its gunicorn server."""

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
POSTGRES, MYSQL = "postgres", "mysql"
# What a URL's scheme names, and the server's defaults when the URL leaves them out.
SCHEMES = {"postgres": POSTGRES, "postgresql": POSTGRES, "mysql": MYSQL, "mariadb": MYSQL}
DEFAULTS = {POSTGRES: (5432, "postgres"), MYSQL: (3306, "root")}


@dataclass(frozen=True)
class Database:
    host: str
    port: int
    user: str
    password: str
    name: str
    engine: str = POSTGRES  # or MYSQL: MariaDB or MySQL, through mysqlclient

    @classmethod
    def from_url(cls, url: str, name: str) -> Database:
        parts = urlsplit(url)
        engine = SCHEMES[parts.scheme]
        port, user = DEFAULTS[engine]
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or port,
            user=parts.username or user,
            password=parts.password or "",
            name=name,
            engine=engine,
        )

    @classmethod
    def named(cls, name: str) -> Database:
        """The database ``name`` on the server of ``BENCH_DATABASE_URL``."""
        server = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        return cls.from_url(server, name)

    @property
    def url(self) -> str:
        password = f":{self.password}" if self.password else ""
        return f"{self.engine}://{self.user}{password}@{self.host}:{self.port}/{self.name}"

    @property
    def mysql(self) -> bool:
        return self.engine == MYSQL

    @property
    def version(self) -> str:
        """The server's name and version, as the reports' setup line says it."""
        if self.mysql:
            return str(self.scalar("SELECT VERSION()"))
        return f"PostgreSQL {self.scalar('SHOW server_version')}"

    def connect(self, **options: Any) -> psycopg.Connection[Any]:
        """A PostgreSQL connection; MariaDB's are ``connect_mysql``'s (another DB-API)."""
        return psycopg.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password or None,
            dbname=options.pop("dbname", self.name),
            **options,
        )

    def connect_mysql(self, database: str | None = None) -> Any:
        try:
            import MySQLdb  # the mysql extra: only a MariaDB run needs it
        except ImportError as missing:
            raise RuntimeError(
                "A MariaDB/MySQL run needs mysqlclient: pip install -e '.[mysql]' "
                "(it builds against libmariadb-dev, scripts/system-deps.sh)."
            ) from missing

        return MySQLdb.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            database=self.name if database is None else database,
            autocommit=True,
            charset="utf8mb4",  # as example_project/settings.py connects
        )

    def recreate(self) -> None:
        if self.mysql:
            self._mysql_admin(f"DROP DATABASE IF EXISTS `{self.name}`")
            self._mysql_admin(f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4")
            return
        with self.connect(dbname="postgres", autocommit=True) as admin:
            name = sql.Identifier(self.name)
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(name))

    def drop(self) -> None:
        if self.mysql:
            self._mysql_admin(f"DROP DATABASE IF EXISTS `{self.name}`")
            return
        with self.connect(dbname="postgres", autocommit=True) as admin:
            name = sql.Identifier(self.name)
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))

    def scalar(self, query: str, *params: Any) -> Any:
        if self.mysql:
            connection = self.connect_mysql()
            try:
                cursor = connection.cursor()
                cursor.execute(query, params or None)
                row = cursor.fetchone()
            finally:
                connection.close()
        else:
            with self.connect(autocommit=True) as pg:
                row = pg.execute(query, params).fetchone()
        return None if row is None else row[0]

    def _mysql_admin(self, statement: str) -> None:
        connection = self.connect_mysql(database="")
        try:
            connection.cursor().execute(statement)
        finally:
            connection.close()


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
