"""Test settings: SQLite by default, PostgreSQL or MariaDB/MySQL when DATABASE_URL points at it."""

import os

import environ

SECRET_KEY = "tests-only"
DEBUG = False
# tests/protocol/test_async.py serves over HTTP.
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
ROOT_URLCONF = "tests.support.urls"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django.contrib.staticfiles",
    "rest_framework",
    "idempotency",
    # django.tasks' database backend: docs/tasks.md, tests/protocol/test_django_tasks.py.
    "django_tasks_db",
    "tests.testapp.apps.TestAppConfig",
    "example_project.shop",
    "example_project.reports",
    "example_project.ops",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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


env = environ.Env()
DATABASES = {"default": env.db("DATABASE_URL", default="sqlite://:memory:")}
if os.environ.get("TEST_DATABASE_NAME"):
    # Lets parallel runs on one server use separate test databases.
    DATABASES["default"]["TEST"] = {"NAME": os.environ["TEST_DATABASE_NAME"]}
if os.environ.get("PREPARED_STATEMENTS") and "postgresql" in DATABASES["default"]["ENGINE"]:
    # The suite's second PostgreSQL run: psycopg 3 binds server-side and prepares
    # every statement at once, Django's and this app's (see docs/performance.md).
    DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 0}
    # A django-tasks-db migration makes a column NOT NULL with a default, which Django's
    # schema editor sends as one statement of two commands ("UPDATE ...; SET CONSTRAINTS
    # ALL IMMEDIATE"): PostgreSQL refuses to prepare it. Its tables come from its models.
    MIGRATION_MODULES = {"django_tasks_database": None}
if os.environ.get("PGBOUNCER"):
    # The pass through PgBouncer in transaction pooling mode (scripts/pgbouncer.sh):
    # what Django asks of a connection behind such a pooler, which also tells the
    # idempotency app not to LISTEN there (docs/databases.md, "Behind PgBouncer").
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
if os.environ.get("REPLICA_URL"):
    # The replica pass (scripts/replica.sh): a hot standby of DATABASE_URL's server,
    # a few seconds behind, that a router sends reads to. Its test database is the
    # primary's, streamed (MIRROR), not one of its own.
    DATABASES["replica"] = env.db("REPLICA_URL")
    DATABASES["replica"]["TEST"] = {"MIRROR": "default"}
    DATABASE_ROUTERS = ["tests.support.routers.PrimaryReplicaRouter"]
if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # Full Unicode, the session clock in UTC like the stored datetimes, and Django's
    # default isolation level said out loud (docs/databases.md).
    DATABASES["default"]["OPTIONS"] = {
        "charset": "utf8mb4",
        "init_command": "SET time_zone = '+00:00'",
        "isolation_level": "read committed",
    }
    DATABASES["default"].setdefault("TEST", {}).update(
        CHARSET="utf8mb4", COLLATION="utf8mb4_unicode_ci"
    )

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.BasicAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # From the start, as a project sets it: ``@api_view`` fixes its view's schema at import.
    "DEFAULT_SCHEMA_CLASS": "idempotency.contrib.spectacular.AutoSchema",
}

# Django's tasks (the django-tasks backport on Django 5.2) in the test database, run by
# django-tasks-db's db_worker: a task enqueued in a transaction commits or rolls back with it.
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": []}}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The example project's payment callback (tests/example/test_project.py).
PAYMENT_WEBHOOK_SECRET = "tests-webhook-secret"
