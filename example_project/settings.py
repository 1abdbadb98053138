"""Settings of the example project, read from the environment (django-environ).

Nothing needs to be set for development: SQLite file ``db.sqlite3`` at the
repository root, DEBUG on, a development secret key. In production set at
least ``SECRET_KEY``, ``DEBUG=False``, ``ALLOWED_HOSTS`` and ``DATABASE_URL``.
"""

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("Set SECRET_KEY in the environment when DEBUG is off.")
    SECRET_KEY = "django-insecure-example-project-development-only"
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

# Only for test runs that drive the running project: every request authenticates,
# and Django's default hasher is slow on purpose. Never set in production.
if env.list("PASSWORD_HASHERS", default=[]):
    PASSWORD_HASHERS = env.list("PASSWORD_HASHERS")

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
# Behind PgBouncer in transaction pooling mode (docs/databases.md, "Behind PgBouncer").
if env.bool("DATABASE_TRANSACTION_POOLING", default=False):
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # MariaDB/MySQL: full Unicode (Django 4.2 connects as 3-byte "utf8"), the session clock
    # in UTC like the datetimes Django stores; Django's default isolation level, READ
    # COMMITTED, is kept (docs/databases.md).
    options = DATABASES["default"].setdefault("OPTIONS", {})
    options.setdefault("charset", "utf8mb4")
    options.setdefault("init_command", "SET time_zone = '+00:00'")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "idempotency",
    # Django's tasks in this database, run by `manage.py db_worker` (docs/tasks.md).
    "django_tasks_db",
    "example_project.shop",
    "example_project.reports",
    "example_project.ops",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves the collected static files (the admin's CSS) from the app itself, with
    # DEBUG off too: run `manage.py collectstatic` first (scripts/example.sh does).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
ASGI_APPLICATION = "example_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# Where `collectstatic` puts them and WhiteNoise serves them from (gzip/brotli copies too).
STATIC_ROOT = env.path("STATIC_ROOT", default=str(BASE_DIR / "staticfiles"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.BasicAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # The browsable API's forms carry a fresh idempotency key: it can create orders too.
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "idempotency.IdempotentBrowsableAPIRenderer",
    ],
    # drf-spectacular's, plus the idempotency header and responses of protected operations.
    "DEFAULT_SCHEMA_CLASS": "idempotency.contrib.spectacular.AutoSchema",
    # A database outage in any DRF view, its authentication included, is a 503 with
    # Retry-After (docs/databases.md), not Django's HTML error page.
    "EXCEPTION_HANDLER": "idempotency.drf.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Shop (Django REST framework)",
    "VERSION": "1.0.0",
    "DESCRIPTION": "The example project of django-idempotency.",
    "PREPROCESSING_HOOKS": ["example_project.shop.schema.without_unslashed_aliases"],
    # Request bodies get their own components (``OrderRequest``), without read-only
    # fields: a generated client that sent ``created_at`` anew with each retry of an
    # intent would change the fingerprint and get 422 for its own retry.
    "COMPONENT_SPLIT_REQUEST": True,
    # Clients send JSON; the form bodies the API also parses are the browsable API's.
    # (Three content types of one body also make openapi-python-client 0.29.1 write a
    # module that does not import.)
    "PARSER_WHITELIST": ["rest_framework.parsers.JSONParser"],
}

IDEMPOTENCY = {
    # How long a duplicate waits for the first attempt before it gets 409.
    "LOCK_TIMEOUT": env.float("IDEMPOTENCY_LOCK_TIMEOUT", default=2.0),
    # Lease mode (the reports): how long a duplicate waits for the first attempt's
    # outcome instead of answering 409 at once; 0 answers at once.
    "WAIT_SECONDS": env.float("IDEMPOTENCY_WAIT_SECONDS", default=0.0),
    # "conflict": a duplicate of an attempt in flight gets 409 at once, without
    # waiting LOCK_TIMEOUT on the first attempt's row lock (the draft's SHOULD).
    "IN_FLIGHT": env.str("IDEMPOTENCY_IN_FLIGHT", default="wait"),
}

# Django's tasks (built in on Django 6, the django-tasks backport on 5.2), run by
# `manage.py db_worker`. A task is a row of DATABASE_URL's database, written in the
# transaction of the view that enqueues it: the receipt's task exists if and only if its
# request's record committed (docs/tasks.md, "Enqueueing from a protected view"). Not read
# from the environment: a backend outside that database would break the promise.
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

# The payment provider signs each callback body with this secret (X-Signature).
PAYMENT_WEBHOOK_SECRET = env.str("PAYMENT_WEBHOOK_SECRET", default="dev-webhook-secret")

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/0")
# Task results (IdempotentTask duplicates answer with the first result): the same Redis.
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default=CELERY_BROKER_URL)

# Errors to the console (gunicorn's log): without it Django mails them to ADMINS only.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django.request": {"handlers": ["console"], "level": "ERROR"},
        "idempotency": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
    },
}
