import os

import pytest
from django.db import connection


def pytest_collection_modifyitems(config, items):
    if os.environ.get("REQUIRE_POSTGRES") and connection.vendor != "postgresql":
        raise pytest.UsageError(
            "REQUIRE_POSTGRES is set but DATABASE_URL does not point at PostgreSQL."
        )


@pytest.fixture(autouse=True)
def _postgres_marker_needs_postgres(request):
    # A postgres test run against SQLite would prove nothing: fail it, never skip.
    if request.node.get_closest_marker("postgres") and connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL: run it with DATABASE_URL=postgres://...")


@pytest.fixture(autouse=True)
def _no_durations_from_other_tests(monkeypatch):
    # Retry-After uses the durations this process saw: each test starts with none.
    from idempotency import waiting

    monkeypatch.setattr(waiting, "durations", waiting.Durations())
