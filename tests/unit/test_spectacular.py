"""``idempotency.contrib.spectacular``: the OpenAPI schema of protected DRF operations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import jsonschema
import pytest
from django.conf import settings
from django.test import override_settings
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from openapi_spec_validator import validate

from idempotency.contrib.spectacular import IdempotencySchemaMixin
from tests.support.processes import ROOT

KEY_HEADERS = {"Idempotency-Key", "X-Request-Id"}


class ProjectAutoSchema(IdempotencySchemaMixin, SpectacularAutoSchema):
    """A project's own schema class, with the idempotency mixin first among its bases."""

    def get_tags(self) -> list[str]:
        return ["project"]


def generate(schema_class: str = "idempotency.contrib.spectacular.AutoSchema") -> dict[str, Any]:
    rest_framework = {**settings.REST_FRAMEWORK, "DEFAULT_SCHEMA_CLASS": schema_class}
    with override_settings(REST_FRAMEWORK=rest_framework):
        generated = SchemaGenerator(urlconf="tests.support.spectacular_urls").get_schema(
            public=True
        )
    # Through JSON, as a client reads it.
    schema: dict[str, Any] = json.loads(json.dumps(generated))
    return schema


def key_headers(operation: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in operation.get("parameters", []) if p["name"] in KEY_HEADERS]


def is_documented_as_protected(operation: dict[str, Any]) -> bool:
    responses = operation["responses"]
    return {"400", "409", "422"} <= set(responses) and all(
        "Idempotent-Replayed" in response.get("headers", {})
        for status, response in responses.items()
        if status.startswith("2")
    )


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return generate()


def test_schema_is_valid_openapi(schema):
    validate(schema)


@pytest.mark.parametrize(
    ("path", "method", "header", "required"),
    [
        ("/orders/", "post", "Idempotency-Key", True),
        ("/optional-orders/", "post", "Idempotency-Key", False),
        ("/lease-orders/", "post", "Idempotency-Key", True),
        ("/payable-orders/{id}/pay/", "post", "Idempotency-Key", True),
        ("/refunds/", "post", "X-Request-Id", False),
        ("/transfers/", "post", "Idempotency-Key", True),
    ],
)
def test_protected_operations_have_the_header_and_responses(schema, path, method, header, required):
    operation = schema["paths"][path][method]

    (parameter,) = key_headers(operation)
    assert (parameter["name"], parameter["in"], parameter["required"]) == (
        header,
        "header",
        required,
    )
    assert parameter["schema"]["maxLength"] == 255
    assert is_documented_as_protected(operation)


def test_a_header_the_view_declares_is_kept(schema):
    (parameter,) = key_headers(schema["paths"]["/payable-orders/{id}/pay/"]["post"])

    assert parameter["description"] == "One per payment intent."


@pytest.mark.parametrize(("path", "method"), [("/ref-orders/", "post"), ("/webhook/", "post")])
def test_a_key_read_elsewhere_has_responses_but_no_header(schema, path, method):
    operation = schema["paths"][path][method]

    assert key_headers(operation) == []
    assert is_documented_as_protected(operation)


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/orders/", "get"),
        ("/orders/{id}/", "get"),
        ("/orders/{id}/", "put"),
        ("/orders/{id}/", "patch"),
        ("/orders/{id}/", "delete"),
        ("/payable-orders/", "get"),
        ("/refunds/", "get"),
        ("/transfers/", "get"),
    ],
)
def test_other_operations_are_left_alone(schema, path, method):
    operation = schema["paths"][path][method]

    assert key_headers(operation) == []
    assert not {"409", "422"} & set(operation["responses"])
    for response in operation["responses"].values():
        assert "Idempotent-Replayed" not in response.get("headers", {})


def test_the_replay_headers_are_named_as_configured():
    with override_settings(IDEMPOTENCY={"REPLAYED_HEADER": "Idempotency-Replayed"}):
        generated = generate()
    headers = generated["paths"]["/orders/"]["post"]["responses"]["201"]["headers"]
    assert {"Idempotency-Replayed", "Idempotency-Replay"} <= set(headers)
    assert "Idempotent-Replayed" not in headers
    assert headers["Idempotency-Replay"]["schema"]["enum"] == ["omitted"]


def stripe_error(request: Any, error: Any, status: int) -> Any:
    raise AssertionError("only its declaration is read here")


stripe_error.openapi_schema = {  # type: ignore[attr-defined]
    "type": "object",
    "properties": {"error": {"type": "object"}},
    "required": ["error"],
}


def test_the_errors_follow_the_shape_a_renderer_declares():
    with override_settings(IDEMPOTENCY={"ERROR_FORMAT": stripe_error}):
        generated = generate()
    validate(generated)
    component = generated["components"]["schemas"]["IdempotencyProblem"]
    assert component == stripe_error.openapi_schema  # type: ignore[attr-defined]
    responses = generated["paths"]["/orders/"]["post"]["responses"]
    for status in ("409", "422"):
        assert set(responses[status]["content"]) == {"application/json"}
    assert "Retry-After" in responses["409"]["headers"]


def test_problem_responses_carry_their_codes_and_retry_after(schema):
    responses = schema["paths"]["/orders/"]["post"]["responses"]
    problem = schema["components"]["schemas"]["IdempotencyProblem"]

    for status, code in [
        ("400", "idempotency_key_missing"),
        ("400", "idempotency_key_invalid"),
        ("409", "idempotency_key_in_use"),
        ("409", "idempotency_key_under_review"),
        ("422", "idempotency_key_reused"),
        ("503", "database_unavailable"),
        ("503", "outcome_unknown"),
    ]:
        content = responses[status]["content"]["application/problem+json"]
        assert PROBLEM in content["schema"].get("oneOf", [content["schema"]])
        assert code in responses[status]["description"]
        assert code in problem["properties"]["code"]["description"]
    for status in ("409", "503"):
        assert responses[status]["headers"]["Retry-After"]["schema"]["type"] == "integer"
    assert "application/json" in responses["201"]["content"]


PROBLEM = {"$ref": "#/components/schemas/IdempotencyProblem"}
VALIDATION_ERROR = {"$ref": "#/components/schemas/ValidationError"}


def test_drfs_own_400_is_documented_beside_the_problem(schema):
    # DRF answers 400 itself (a serializer's errors, a body it cannot parse), as
    # application/json; the idempotency problem is application/problem+json.
    response = schema["paths"]["/orders/"]["post"]["responses"]["400"]
    either = {"oneOf": [PROBLEM, VALIDATION_ERROR]}

    assert response["content"] == {
        "application/problem+json": {"schema": either},
        "application/json": {"schema": either},
    }
    assert "ValidationError" in response["description"]
    validation = schema["components"]["schemas"]["ValidationError"]
    assert "non_field_errors" in validation["description"]


def test_the_problem_and_the_validation_error_tell_bodies_apart(schema):
    # ``oneOf``: every body the server sends matches exactly one alternative.
    components = schema["components"]["schemas"]
    either = {"oneOf": [components["IdempotencyProblem"], components["ValidationError"]]}
    problem = {
        "type": "urn:idempotency:error:idempotency_key_missing",
        "title": "Idempotency key missing",
        "status": 400,
        "detail": "Send an Idempotency-Key header.",
        "code": "idempotency_key_missing",
    }
    for body in [
        problem,
        {"quantity": ["Ensure this value is greater than or equal to 1."]},
        {"non_field_errors": ["Invalid data."], "items": [{}, {"sku": ["Required."]}]},
        {"address": {"city": ["This field is required."]}},
        {"detail": "JSON parse error - Expecting value: line 1 column 1 (char 0)"},
    ]:
        jsonschema.validate(body, either)


def test_only_protected_statuses_get_the_problem(schema):
    responses = schema["paths"]["/orders/"]["post"]["responses"]
    assert responses["409"]["content"] == {"application/problem+json": {"schema": PROBLEM}}
    assert responses["422"]["content"] == {"application/problem+json": {"schema": PROBLEM}}


def test_the_key_header_publishes_the_expiry_policy():
    with override_settings(
        IDEMPOTENCY={
            "RETENTION": {"SUCCEEDED": 7200, "FAILED_FINAL": 7200},
            "OPERATION_RETENTION": {"tests.testapp.schema_views.transfer": {"SUCCEEDED": 600}},
        }
    ):
        schema = generate()

    paths = schema["paths"]
    (orders,) = key_headers(paths["/orders/"]["post"])
    (transfers,) = key_headers(paths["/transfers/"]["post"])
    assert "replayed for 2 hours (7200 s) after it was recorded" in orders["description"]
    assert "10 minutes (600 s) after a success" in transfers["description"]
    assert "2 hours (7200 s) after a final failure" in transfers["description"]


def test_settings_decide_the_header_name_length_and_requirement():
    with override_settings(
        IDEMPOTENCY={"HEADER": "X-Idem", "MAX_KEY_LENGTH": 64, "REQUIRE_KEY": False}
    ):
        schema = generate()

    parameters = schema["paths"]["/orders/"]["post"]["parameters"]
    (parameter,) = [p for p in parameters if p["name"] == "X-Idem"]
    assert (parameter["required"], parameter["schema"]["maxLength"]) == (False, 64)


@pytest.mark.parametrize(
    "schema_class",
    ["drf_spectacular.openapi.AutoSchema", "idempotency.contrib.spectacular.AutoSchema"],
)
def test_the_mixins_docstrings_never_describe_an_operation(schema_class):
    # tests.testapp.views.OrderViewSet has no docstring of its own.
    schema = generate(schema_class)

    descriptions = [
        operation.get("description", "")
        for operations in schema["paths"].values()
        for operation in operations.values()
    ]
    assert not any("create" in text or "Hooks" in text for text in descriptions), descriptions


def test_a_projects_own_schema_class_keeps_its_behaviour():
    schema = generate("tests.unit.test_spectacular.ProjectAutoSchema")

    operation = schema["paths"]["/orders/"]["post"]
    assert operation["tags"] == ["project"]
    assert is_documented_as_protected(operation)


# --- the example project ----------------------------------------------------------------


def example_schema() -> dict[str, Any]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings"}
    env.pop("DATABASE_URL", None)  # generating the schema reads no database
    result = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn"]
        + ["--format", "openapi-json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    schema: dict[str, Any] = json.loads(result.stdout)
    return schema


def test_example_project_schema_is_valid_and_documents_protected_operations():
    schema = example_schema()
    validate(schema)
    paths = schema["paths"]

    for path in ("/api/orders/", "/api/reports/"):
        assert [p["name"] for p in key_headers(paths[path]["post"])] == ["Idempotency-Key"]
        assert is_documented_as_protected(paths[path]["post"])
        assert key_headers(paths[path]["get"]) == []
    callback = paths["/api/payments/callback/"]["post"]
    assert key_headers(callback) == []  # keyed by the provider's trade number
    assert is_documented_as_protected(callback)
    for operation in paths["/api/orders/{id}/"].values():
        assert key_headers(operation) == []
        assert not {"409", "422"} & set(operation["responses"])
    assert not any(
        "Protects" in operation.get("description", "")
        for operations in paths.values()
        for operation in operations.values()
    )
