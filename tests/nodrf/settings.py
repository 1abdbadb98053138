"""A project without Django REST framework, for tests/test_without_drf.py.

``import rest_framework`` fails in any process that loads these settings, as if
it were not installed.
"""

import sys

sys.modules["rest_framework"] = None  # type: ignore[assignment]

from tests.settings import (  # noqa: E402
    ALLOWED_HOSTS,
    DATABASES,
    DEFAULT_AUTO_FIELD,
    PASSWORD_HASHERS,
    SECRET_KEY,
    STATIC_URL,
    TEMPLATES,
    USE_TZ,
)

__all__ = [
    "ALLOWED_HOSTS",
    "DATABASES",
    "DEFAULT_AUTO_FIELD",
    "PASSWORD_HASHERS",
    "SECRET_KEY",
    "STATIC_URL",
    "TEMPLATES",
    "USE_TZ",
]

DEBUG = False
ROOT_URLCONF = "tests.nodrf.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django.contrib.staticfiles",
    "idempotency",
    "tests.testapp.apps.TestAppConfig",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
