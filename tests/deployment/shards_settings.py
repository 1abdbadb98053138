"""A database per tenant: ``tenant_a`` and ``tenant_b`` beside ``default``, picked by a router.

The router reads a context variable that ``tenant_middleware`` sets from the
request, as Django's multiple-databases guide shows; every model (users and
sessions too) lives in the tenant's database. Run with
``--ds=tests.deployment.shards_settings`` and a ``postgres://`` DATABASE_URL.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, MIDDLEWARE

_base = os.environ.get("TEST_DATABASE_NAME", "test_idempotency_tenants")
_server = DATABASES["default"]
if not _server["ENGINE"].endswith("postgresql"):
    # On SQLite each alias would become a file named after its test database, here.
    raise RuntimeError("tests.deployment.shards_settings needs a postgres:// DATABASE_URL")
DATABASES = {
    alias: {**_server, "TEST": {"NAME": f"{_base}_{alias}"}}
    for alias in ("default", "tenant_a", "tenant_b")
}
DATABASE_ROUTERS = ["tests.deployment.tenancy.TenantRouter"]
MIDDLEWARE = ["tests.deployment.tenancy.tenant_middleware", *MIDDLEWARE]
ROOT_URLCONF = "tests.deployment.urls"
