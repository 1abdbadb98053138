"""Clients generated from the served schemas (openapi-python-client), driven over real HTTP.

The example project runs under gunicorn on PostgreSQL. From each schema it serves
(the DRF API's and the ninja API's) a client is generated as a client developer
would, imported, and used for the whole idempotency story of ``POST orders``: a
create, its replay, the key reused for another request (422), a duplicate of an
attempt still in flight (409, ``Retry-After``), and a body the framework itself
refuses (DRF's 400, ninja's 422). Each answer must parse into its documented type:
a validation error is not read as an idempotency problem, and does not crash the
client (as ``KeyError: 'type'`` did when those statuses documented the problem only).
"""

from __future__ import annotations

import base64
import importlib
import inspect
import json
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.example_server import USERS, Server, example_project, gunicorn, orders_held

pytestmark = pytest.mark.postgres  # the example server on the primary database; LOCK TABLE

GENERATOR = Path(sys.executable).parent / "openapi-python-client"


@dataclass(frozen=True)
class Api:
    """One generated client and the names it gave the create-order operation and models."""

    name: str
    schema_path: str
    operation: str  # the module of ``POST orders`` under ``api/<tag>/``
    body: str  # the request body's model
    created: str  # the 201's model
    validation_status: int  # the framework's own validation error status


DRF = Api(
    "drf", "/api/schema/?format=json", "api.api.api_orders_create", "OrderRequest", "Order", 400
)
NINJA = Api(
    "ninja",
    "/ninja/openapi.json",
    "api.default.example_project_shop_api_create_order",
    "OrderIn",
    "OrderOut",
    422,
)


@pytest.fixture(scope="module")
def server(django_db_blocker: Any) -> Iterator[Server]:
    with example_project(django_db_blocker) as (database, env), gunicorn(env) as url:
        yield Server(url=url, database=database)


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("generated")
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))


def generate(server: Server, api: Api, root: Path) -> ModuleType:
    """Generate ``<api>_client`` from the schema the server serves, and import it."""
    with urllib.request.urlopen(server.url + api.schema_path, timeout=30) as response:
        schema = json.load(response)
    path = root / f"{api.name}.json"
    path.write_text(json.dumps(schema))
    config = root / "config.yml"
    config.write_text("post_hooks: []\n")  # no formatter run over the generated code
    package = f"{api.name}_client"
    result = subprocess.run(
        [
            *(str(GENERATOR), "generate", "--path", str(path)),
            *("--output-path", str(root / package), "--meta", "none", "--config", str(config)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The generator warns about what it could not model: nothing, for these schemas.
    assert "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr
    return importlib.import_module(package)


class Generated:
    """The generated package of one API, as its user calls it."""

    def __init__(self, package: ModuleType, api: Api, server: Server) -> None:
        self.api = api
        name = package.__name__
        self.operation = importlib.import_module(f"{name}.{api.operation}")
        self.models = importlib.import_module(f"{name}.models")
        token = base64.b64encode(f"alice:{USERS['alice']}".encode()).decode()
        self.client = package.AuthenticatedClient(
            base_url=server.url, token=token, prefix="Basic", timeout=60.0
        )

    def create(self, key: str, sku: str, quantity: int) -> Any:
        body = getattr(self.models, self.api.body)(sku=sku, quantity=quantity)
        return self.operation.sync_detailed(client=self.client, body=body, idempotency_key=key)

    def model(self, name: str) -> type:
        model: type = getattr(self.models, name)
        return model


@pytest.fixture(params=[DRF, NINJA], ids=lambda api: api.name, scope="module")
def generated(request: Any, server: Server, packages: Path) -> Generated:
    api: Api = request.param
    return Generated(generate(server, api, packages), api, server)


def sku() -> str:
    return f"gen-{uuid.uuid4().hex[:12]}"


def test_the_key_is_a_typed_required_argument(generated):
    parameter = inspect.signature(generated.operation.sync_detailed).parameters["idempotency_key"]

    assert parameter.default is inspect.Parameter.empty
    assert parameter.annotation in (str, "str")


def test_create_and_replay(generated, server):
    key, item = str(uuid.uuid4()), sku()
    first = generated.create(key, item, 2)
    again = generated.create(key, item, 2)

    assert first.status_code == 201
    assert isinstance(first.parsed, generated.model(generated.api.created))
    assert (first.parsed.sku, first.parsed.quantity) == (item, 2)
    assert "Idempotent-Replayed" not in first.headers
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.parsed.id == first.parsed.id
    assert server.orders_with_sku(item) == 1


def test_key_reused_for_another_request_is_a_problem(generated, server):
    key, item = str(uuid.uuid4()), sku()
    assert generated.create(key, item, 1).status_code == 201
    reused = generated.create(key, item, 5)

    assert reused.status_code == 422
    assert isinstance(reused.parsed, generated.model("IdempotencyProblem"))
    assert reused.parsed.code == "idempotency_key_reused"
    assert reused.headers["Content-Type"] == "application/problem+json"
    assert server.orders_with_sku(item) == 1


def test_validation_error_parses_as_the_frameworks_error(generated, server):
    key, item = str(uuid.uuid4()), sku()
    invalid = generated.create(key, item, 0)  # quantity must be at least 1

    assert invalid.status_code == generated.api.validation_status
    assert isinstance(invalid.parsed, generated.model("ValidationError")), invalid.parsed
    assert "quantity" in invalid.content.decode()
    # Nothing was recorded: the corrected request runs under the same key.
    corrected = generated.create(key, item, 1)
    assert corrected.status_code == 201
    assert "Idempotent-Replayed" not in corrected.headers
    assert server.orders_with_sku(item) == 1


def test_malformed_key_is_a_problem(generated):
    malformed = generated.create("not a valid key", sku(), 1)  # spaces are not allowed

    assert malformed.status_code == 400
    assert isinstance(malformed.parsed, generated.model("IdempotencyProblem"))
    assert malformed.parsed.code == "idempotency_key_invalid"


def test_duplicate_of_an_attempt_in_flight_is_409(generated, server):
    """The first attempt claims its key, then waits on a lock the test holds on the orders
    table; its duplicate waits ``LOCK_TIMEOUT`` (2 s in the example) on the record and gets 409."""
    key, item = str(uuid.uuid4()), sku()
    answers: dict[str, Any] = {}
    with orders_held(server) as held:
        first = threading.Thread(
            target=lambda: answers.update(first=generated.create(key, item, 1)), daemon=True
        )
        first.start()
        held.wait_for_a_blocked_insert()
        duplicate = generated.create(key, item, 1)
        still_running = first.is_alive()
    first.join(60)

    assert still_running
    assert duplicate.status_code == 409
    assert isinstance(duplicate.parsed, generated.model("IdempotencyProblem"))
    assert duplicate.parsed.code == "idempotency_key_in_use"
    assert int(duplicate.headers["Retry-After"]) >= 1
    assert answers["first"].status_code == 201
    retried = generated.create(key, item, 1)
    assert (retried.status_code, retried.headers["Idempotent-Replayed"]) == (201, "true")
    assert server.orders_with_sku(item) == 1
