"""The README's ``curl`` commands, run as written against the example as ``make example`` serves it.

The example is migrated on a SQLite file of its own, the README's demo user
(alice / alice) is added as scripts/example.sh adds it, and Django's runserver
serves it; only the host and port of each command are changed to that server's.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.processes import ROOT, python, start, stop
from tests.support.servers import free_port, wait_until_up

README = ROOT / "README.md"
DEMO_USER = (
    "from django.contrib.auth.models import User; "
    "User.objects.create_user('alice', password='alice')"
)


def readme_curls() -> list[str]:
    """Every ``curl`` command of the README's console blocks, continuation lines joined."""
    blocks = re.findall(r"```console\n(.*?)```", README.read_text(), flags=re.S)
    joined = [re.sub(r"\\\n\s*", "", block) for block in blocks]
    lines = [line.split("  #")[0].strip() for block in joined for line in block.splitlines()]
    return [line for line in lines if line.startswith("curl ")]


@pytest.fixture(scope="module")
def example_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    database = tmp_path_factory.mktemp("example") / "db.sqlite3"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TEST_DATABASE_NAME")},
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": f"sqlite:///{database}",
        "PYTHONPATH": str(ROOT),
    }
    manage = python(str(ROOT / "manage.py"))
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, cwd=ROOT, check=True)
    subprocess.run([*manage, "shell", "-c", DEMO_USER], env=env, cwd=ROOT, check=True)
    port = free_port()
    server = start([*manage, "runserver", "--noreload", f"127.0.0.1:{port}"], env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(server, url + "/", "the example project")
        yield url
    finally:
        stop(server)


def run(command: str, url: str) -> tuple[int, dict[str, str], str]:
    argv = [
        url + arg.removeprefix("http://127.0.0.1:8000")
        if arg.startswith("http://127.0.0.1:8000")
        else arg
        for arg in shlex.split(command)
    ]
    out = subprocess.run(
        [*argv, "-sS", "--noproxy", "*"], capture_output=True, text=True, check=True
    ).stdout
    head, _, body = out.replace("\r\n", "\n").partition("\n\n")
    status = int(head.split()[1])
    headers = dict(line.split(": ", 1) for line in head.splitlines()[1:] if ": " in line)
    return status, {k.lower(): v for k, v in headers.items()}, body


def test_the_readme_shows_the_drf_and_the_plain_view_curls():
    commands = readme_curls()
    assert len(commands) == 3
    assert [c.rsplit(" ", 1)[-1] for c in commands] == [
        "http://127.0.0.1:8000/api/orders/",
        "http://127.0.0.1:8000/api/orders/",
        "http://127.0.0.1:8000/partner/orders/",
    ]


def test_drf_create_replay_and_reuse_as_the_readme_says(example_url):
    create, reuse, _ = readme_curls()

    first = run(create, example_url)
    again = run(create, example_url)
    other = run(reuse, example_url)

    assert first[0] == 201 and "idempotent-replayed" not in first[1]
    assert again[0] == 201 and again[1]["idempotent-replayed"] == "true"
    assert again[2] == first[2]
    assert other[0] == 422 and '"idempotency_key_reused"' in other[2]


def test_plain_view_create_and_replay_as_the_readme_says(example_url):
    *_, partner = readme_curls()

    first = run(partner, example_url)
    again = run(partner, example_url)
    anonymous = run(partner.replace("Token partner-token-1", "Token wrong"), example_url)

    assert first[0] == 201 and again[0] == 201
    assert again[1]["idempotent-replayed"] == "true"
    assert anonymous[0] == 403 and '"idempotency_scope_unavailable"' in anonymous[2]
