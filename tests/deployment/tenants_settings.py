"""A schema per tenant with django-tenants: two tenants reached by their hostnames.

Users, sessions and the admin's log live in the public schema (``SHARED_APPS``);
each tenant's purchases and idempotency records in its own (``TENANT_APPS``),
and the public schema keeps records of its own endpoints. Run with
``--ds=tests.deployment.tenants_settings`` and a ``postgres://`` DATABASE_URL.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, MIDDLEWARE

DATABASES = {
    "default": {
        **DATABASES["default"],
        "ENGINE": "django_tenants.postgresql_backend",
        "TEST": {"NAME": os.environ.get("TEST_DATABASE_NAME", "test_idempotency") + "_schemas"},
    }
}
DATABASE_ROUTERS = ["django_tenants.routers.TenantSyncRouter"]
SHARED_APPS = [
    "django_tenants",
    "tests.deployment.customers.apps.CustomersConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django.contrib.staticfiles",
    "idempotency",
]
TENANT_APPS = ["idempotency", "tests.deployment.shop.apps.ShopConfig"]
INSTALLED_APPS = SHARED_APPS + [app for app in TENANT_APPS if app not in SHARED_APPS]
TENANT_MODEL = "customers.Customer"
TENANT_DOMAIN_MODEL = "customers.Domain"
MIDDLEWARE = ["django_tenants.middleware.main.TenantMainMiddleware", *MIDDLEWARE]
ROOT_URLCONF = "tests.deployment.tenant_urls"
ALLOWED_HOSTS = [".localhost", "testserver"]
