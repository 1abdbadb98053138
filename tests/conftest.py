import os

import pytest
from django.db import connection

# Marker -> the database vendors its tests need (a test run elsewhere would prove nothing).
NEEDS = {
    "postgres": ({"postgresql"}, "PostgreSQL: run it with DATABASE_URL=postgres://..."),
    "mariadb": ({"mysql"}, "MariaDB or MySQL: run it with DATABASE_URL=mysql://..."),
    "server_db": (
        {"postgresql", "mysql"},
        "PostgreSQL or MariaDB/MySQL: run it with DATABASE_URL=postgres://... or mysql://...",
    ),
}

REQUIRED = {
    "REQUIRE_POSTGRES": ("postgresql", "PostgreSQL"),
    "REQUIRE_MARIADB": ("mysql", "MariaDB or MySQL"),
}


def pytest_collection_modifyitems(config, items):
    for variable, (vendor, name) in REQUIRED.items():
        if os.environ.get(variable) and connection.vendor != vendor:
            raise pytest.UsageError(f"{variable} is set but DATABASE_URL does not point at {name}.")


@pytest.fixture(autouse=True)
def _database_markers_need_their_database(request):
    # Fail, never skip: a skipped concurrency test hides a missing guarantee.
    for marker, (vendors, advice) in NEEDS.items():
        if request.node.get_closest_marker(marker) and connection.vendor not in vendors:
            pytest.fail(f"this test needs {advice}")
