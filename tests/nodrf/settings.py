"""A project without Django REST framework, for tests/deployment/test_without_drf.py.

``import rest_framework`` fails in any process that loads these settings, as if
it were not installed.
"""

import sys

sys.modules["rest_framework"] = None  # type: ignore[assignment]

from tests import settings as with_drf  # noqa: E402
from tests.settings import (  # noqa: E402
    ALLOWED_HOSTS,
    DATABASES,
    DEFAULT_AUTO_FIELD,
    MIDDLEWARE,
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
    "MIDDLEWARE",
    "PASSWORD_HASHERS",
    "SECRET_KEY",
    "STATIC_URL",
    "TEMPLATES",
    "USE_TZ",
]

DEBUG = False
ROOT_URLCONF = "tests.nodrf.urls"
# The test project's apps but DRF and the example project (which uses DRF).
INSTALLED_APPS = [
    app
    for app in with_drf.INSTALLED_APPS
    if app != "rest_framework" and not app.startswith("example_project")
]
