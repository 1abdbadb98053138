"""Schemathesis against the running example project (gunicorn, PostgreSQL): no 5xx, ever.

It generates requests from each served schema (the DRF API's and the ninja API's),
valid and invalid, authenticated as the demo user, and fails on any server error.
The payment callback answers 401 to every request it makes (it cannot sign them):
that is expected, a 5xx there would not be. Report creation is left out: each
request takes up to 30 s by design, which fuzzing would turn into minutes.
On the protected operations it also checks that each answer matches what the
schema documents for its status: a validation error as much as an idempotency problem.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.example_server import USERS, Server, example_project, gunicorn

pytestmark = pytest.mark.postgres  # schemathesis once, on the primary database


@pytest.fixture(scope="module")
def server(django_db_blocker: Any) -> Iterator[Server]:
    with example_project(django_db_blocker) as (database, env), gunicorn(env) as url:
        yield Server(url=url, database=database)


def schemathesis(server: Server, schema_path: str, *options: str, cwd: Any) -> str:
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "run", server.url + schema_path),
        *("--url", server.url, "--auth", f"alice:{USERS['alice']}"),
        # One worker: hypothesis parses lambdas' source with ``ast``, which CPython 3.11
        # cannot do from two threads at once ("AST constructor recursion depth mismatch").
        *("--max-examples", "10", "--seed", "1", "--workers", "1"),
        *("--request-timeout", "30", "--no-color", "--suppress-health-check", "all"),
        *options,
    ]
    result = subprocess.run(
        # In a scratch directory: schemathesis and hypothesis keep their caches in the cwd.
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]  # a failed check, or an untested operation
    assert " generated, " in output and "Errored" not in output, output[-3000:]
    return output


@pytest.mark.parametrize(
    ("schema_path", "protected"),
    [
        ("/api/schema/?format=json", ["api_orders_create"]),
        (
            "/ninja/openapi.json",
            [
                "example_project_shop_api_create_order",
                "example_project_shop_api_create_order_async",
            ],
        ),
    ],
)
def test_protected_operations_answer_what_their_schema_says(
    server, schema_path, protected, tmp_path
):
    # Valid and invalid bodies and keys: each answer (a creation, a replay, an idempotency
    # problem, the framework's own validation error) must match the documented body,
    # content type and headers of its status.
    checks = "not_a_server_error,response_schema_conformance,content_type_conformance"
    schemathesis(
        server,
        schema_path,
        *("--checks", checks, "--phases", "coverage,fuzzing"),
        *(arg for operation in protected for arg in ("--include-operation-id", operation)),
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    ("schema_path", "excluded"),
    [("/api/schema/?format=json", ["api_reports_create"]), ("/ninja/openapi.json", [])],
)
def test_no_server_errors(server, schema_path, excluded, tmp_path):
    schemathesis(
        server,
        schema_path,
        # Coverage: boundary and invalid values of every parameter; fuzzing: random ones.
        *("--checks", "not_a_server_error", "--phases", "coverage,fuzzing"),
        *(arg for operation in excluded for arg in ("--exclude-operation-id", operation)),
        cwd=tmp_path,
    )
