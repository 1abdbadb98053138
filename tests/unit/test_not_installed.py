"""Without "idempotency" in INSTALLED_APPS, every entry point says to add it.

Each case runs in a process of its own: the app registry of this one has the app.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.support.processes import ROOT, process_env, python

FIX = 'add "idempotency" to INSTALLED_APPS'

SETTINGS = """
SECRET_KEY = "not-installed"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rest_framework",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
ROOT_URLCONF = "not_installed_urls"
USE_TZ = True
"""

URLS = """
from django.urls import path
from rest_framework import viewsets

from idempotency import IdempotentCreateMixin


class Orders(IdempotentCreateMixin, viewsets.ViewSet):
    pass


urlpatterns = [path("orders/", Orders.as_view({"post": "create"}))]
"""


@pytest.fixture
def project(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "not_installed_settings.py").write_text(SETTINGS)
    (tmp_path / "not_installed_urls.py").write_text(URLS)
    return process_env(
        database=False,
        DJANGO_SETTINGS_MODULE="not_installed_settings",
        PYTHONPATH=f"{tmp_path}:{ROOT}",
    )


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        python(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "statement",
    [
        "import idempotency.drf",
        "import idempotency.decorators",
        "from idempotency import IdempotentCreateMixin",
        "from idempotency import idempotent",
        "from idempotency import idempotent_function",
        "from idempotency import IdempotencyRecord",
    ],
)
def test_importing_an_entry_point_says_to_add_the_app(project, statement):
    script = textwrap.dedent(f"""
        import django
        from django.core.exceptions import ImproperlyConfigured

        django.setup()
        try:
            {statement}
        except ImproperlyConfigured as exc:
            print("refused:", exc)
        """)

    result = run(project, "-c", script)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("refused:") and FIX in result.stdout


@pytest.mark.parametrize("command", ["check", "migrate"])
def test_check_and_migrate_end_on_the_fix_not_on_app_label(project, command):
    result = run(project, "-m", "django", command)

    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured:") and FIX in last
    assert "app_label" not in result.stderr


def test_with_the_app_installed_the_same_project_checks_clean(project, tmp_path):
    settings = tmp_path / "not_installed_settings.py"
    settings.write_text(SETTINGS.replace('"rest_framework",', '"rest_framework", "idempotency",'))

    result = run(project, "-m", "django", "check")

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout
