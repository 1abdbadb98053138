"""``idempotency.ninja.idempotent`` on ninja operations, through Django's test client."""

from __future__ import annotations

import base64
import json
import subprocess
from datetime import timedelta
from typing import Any

import jsonschema
import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, override_settings
from django.utils import timezone
from ninja import NinjaAPI, Schema
from openapi_spec_validator import validate

from idempotency.models import IdempotencyRecord, Status
from idempotency.ninja import idempotent
from tests.support.factories import UserFactory
from tests.support.processes import process_env, python
from tests.testapp.models import Order
from tests.testapp.ninja_api import api

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.support.ninja_urls")]

ORDER = {"sku": "book", "quantity": 2}
PASSWORD = "ninja-password"


@pytest.fixture
def user():
    return UserFactory(password=PASSWORD)


@pytest.fixture
def auth(user) -> dict[str, str]:
    return {"Authorization": basic(user.username, PASSWORD)}


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def post(client, path: str, data: Any, headers: dict[str, str], key: str | None = "k-1"):
    all_headers = {**headers, **({} if key is None else {"Idempotency-Key": key})}
    return client.post(
        "/ninja" + path, json.dumps(data), content_type="application/json", headers=all_headers
    )


def problem_code(response) -> str:
    assert response["Content-Type"] == "application/problem+json"
    return str(json.loads(response.content)["code"])


def is_replay(response) -> bool:
    return response.headers.get("Idempotent-Replayed") == "true"


class TestFirstRequestAndReplay:
    def test_records_the_response_ninja_sends(self, client, auth, user):
        response = post(client, "/orders", ORDER, auth)

        order = Order.objects.get()
        assert response.status_code == 201
        assert json.loads(response.content) == {"id": order.pk, **ORDER}
        assert response["Location"] == f"/ninja/orders/{order.pk}"
        record = IdempotencyRecord.objects.get()
        assert record.status == Status.SUCCEEDED
        assert record.scope == f"user:{user.pk}:tests.testapp.ninja_api.create_order"
        assert record.response_status == 201
        assert bytes(record.response_body) == response.content
        assert record.resource_id == str(order.pk)

    def test_replay_is_the_stored_response_and_the_view_does_not_run(self, client, auth):
        first = post(client, "/orders", ORDER, auth)
        replay = post(client, "/orders", {"quantity": 2, "sku": "book"}, auth)

        assert (replay.status_code, replay.content) == (201, first.content)
        assert replay["Content-Type"] == first["Content-Type"]
        assert replay["Location"] == first["Location"]
        assert is_replay(replay) and not is_replay(first)
        assert "session" not in replay.cookies
        assert Order.objects.count() == 1

    def test_path_and_router_operations(self, client, auth, user):
        order = Order.objects.create(owner=user, sku="old", quantity=1)
        path = f"/ninja/routed/orders/{order.pk}"
        headers = {**auth, "Idempotency-Key": "put-1"}
        first = client.put(
            path, json.dumps(ORDER), content_type="application/json", headers=headers
        )
        replay = client.put(
            path, json.dumps(ORDER), content_type="application/json", headers=headers
        )

        assert first.status_code == replay.status_code == 200
        assert is_replay(replay)
        assert IdempotencyRecord.objects.get().operation == "orders.replace"

    def test_safe_methods_are_not_protected(self, client, auth):
        response = client.get("/ninja/orders", headers=auth)

        assert response.status_code == 200
        assert IdempotencyRecord.objects.count() == 0


class TestErrors:
    @pytest.mark.parametrize(
        ("key", "code"),
        [(None, "idempotency_key_missing"), ("bad key", "idempotency_key_invalid")],
    )
    def test_missing_or_malformed_key_is_400(self, client, auth, key, code):
        response = post(client, "/orders", ORDER, auth, key=key)

        assert response.status_code == 400
        assert problem_code(response) == code
        assert Order.objects.count() == IdempotencyRecord.objects.count() == 0

    def test_same_key_other_body_is_422_and_nothing_runs(self, client, auth):
        post(client, "/orders", ORDER, auth)
        response = post(client, "/orders", {**ORDER, "quantity": 3}, auth)

        assert response.status_code == 422
        assert problem_code(response) == "idempotency_key_reused"
        assert Order.objects.count() == 1

    def test_in_flight_is_409_with_retry_after(self, client, auth):
        post(client, "/orders", ORDER, auth)
        IdempotencyRecord.objects.update(
            status=Status.PROCESSING, lease_until=timezone.now() + timedelta(seconds=30)
        )
        response = post(client, "/orders", ORDER, auth)

        assert response.status_code == 409
        assert problem_code(response) == "idempotency_key_in_use"
        # A short poll (the first attempt took far under RETRY_AFTER), not the 30 s lease left.
        assert response["Retry-After"] == "1"
        assert Order.objects.count() == 1

    def test_under_review_is_its_own_409_without_retry_after(self, client, auth):
        post(client, "/orders", ORDER, auth)
        IdempotencyRecord.objects.update(status=Status.NEEDS_REVIEW, expires_at=None)
        response = post(client, "/orders", ORDER, auth)

        assert response.status_code == 409
        assert problem_code(response) == "idempotency_key_under_review"
        assert not response.has_header("Retry-After")
        assert Order.objects.count() == 1

    def test_another_header_name(self, client, auth):
        missing = post(client, "/lease", ORDER, auth)
        first = post(client, "/lease", ORDER, {**auth, "X-Request-Id": "r-1"}, key=None)
        replay = post(client, "/lease", ORDER, {**auth, "X-Request-Id": "r-1"}, key=None)

        assert problem_code(missing) == "idempotency_key_missing"
        assert (first.status_code, replay.status_code) == (201, 201)
        assert is_replay(replay)


class TestAuthAndValidationComeFirst:
    def test_anonymous_callers_get_ninjas_401_and_leave_no_record(self, client):
        response = post(client, "/orders", ORDER, {})

        assert response.status_code == 401
        assert IdempotencyRecord.objects.count() == 0

    def test_wrong_password_leaves_no_record(self, client, user):
        response = post(client, "/orders", ORDER, {"Authorization": basic(user.username, "no")})

        assert response.status_code == 401
        assert IdempotencyRecord.objects.count() == 0

    def test_invalid_payload_is_ninjas_422_then_a_corrected_retry_runs(self, client, auth):
        rejected = post(client, "/orders", {**ORDER, "quantity": 0}, auth)
        corrected = post(client, "/orders", ORDER, auth)

        assert rejected.status_code == 422
        assert "detail" in json.loads(rejected.content)
        assert corrected.status_code == 201 and not is_replay(corrected)

    def test_session_auth_is_scoped_by_the_user(self, client, user):
        client.force_login(user)
        response = post(client, "/orders", ORDER, {})

        assert response.status_code == 201
        assert IdempotencyRecord.objects.get().scope.startswith(f"user:{user.pk}:")

    def test_two_users_with_one_key_are_independent(self, client, auth):
        other = UserFactory(password=PASSWORD)
        mine = post(client, "/orders", ORDER, auth)
        theirs = post(client, "/orders", ORDER, {"Authorization": basic(other.username, PASSWORD)})

        assert (mine.status_code, theirs.status_code) == (201, 201)
        assert not is_replay(theirs)
        assert json.loads(mine.content)["id"] != json.loads(theirs.content)["id"]


class TestOutcomes:
    @pytest.mark.parametrize("path", ["/orders", "/lease"])
    def test_raised_http_error_is_rendered_by_ninja_and_the_key_stays_free(
        self, client, auth, path
    ):
        headers = {**auth, "X-Request-Id": "k-1"}
        failed = post(client, f"{path}?fail=404", ORDER, headers)
        retried = post(client, path, ORDER, headers)

        assert failed.status_code == 404
        assert json.loads(failed.content) == {"detail": "no such thing"}
        assert retried.status_code == 201 and not is_replay(retried)
        expected = 1 if path == "/orders" else 2  # lease mode: the first write is not rolled back
        assert Order.objects.count() == expected

    def test_exception_rolls_back_and_is_not_recorded(self, client, auth):
        with pytest.raises(RuntimeError):
            post(client, "/orders?fail=crash", ORDER, auth)

        assert Order.objects.count() == IdempotencyRecord.objects.count() == 0

    def test_outcome_policy_records_a_returned_status(self, client, auth):
        headers = {**auth, "X-Charge-Id": "c-1"}
        first = client.post("/ninja/charges?amount=5000", headers=headers)
        replay = client.post("/ninja/charges?amount=5000", headers=headers)

        assert (first.status_code, json.loads(first.content)) == (
            402,
            {"error": "insufficient_funds"},
        )
        assert (replay.status_code, replay.content) == (402, first.content)
        assert is_replay(replay)
        assert IdempotencyRecord.objects.get().status == Status.FAILED_FINAL

    def test_key_callable_without_a_key_runs_unprotected_when_optional(self, client, auth):
        response = client.post("/ninja/final", headers=auth)
        with_key = client.post("/ninja/final", headers={**auth, "Idempotency-Key": "f"})
        replay = client.post("/ninja/final", headers={**auth, "Idempotency-Key": "f"})

        assert response.status_code == with_key.status_code == replay.status_code == 402
        assert is_replay(replay)
        assert IdempotencyRecord.objects.get().status == Status.FAILED_FINAL
        assert Order.objects.count() == 2

    @override_settings(IDEMPOTENCY={"SCOPE_FUNCTION": "tests.unit.test_ninja.tenant_scope"})
    def test_the_projects_scope_function_wins(self, client, auth):
        post(client, "/orders", ORDER, auth)

        assert IdempotencyRecord.objects.get().scope.startswith("tenant:")


def tenant_scope(request, operation: str) -> str:
    return f"tenant:acme:{operation}"


class TestMisuse:
    def test_above_the_route_decorator_is_refused(self):
        other = NinjaAPI(urls_namespace="tests-ninja-misuse")

        with pytest.raises(ImproperlyConfigured, match="under @api"):

            @idempotent()
            @other.post("/x")
            def misplaced(request):
                return {}

    def test_options_are_those_of_the_view_decorator_and_checked_alike(self):
        with pytest.raises(ValueError, match="wait_seconds should be a number >= 0"):
            idempotent(wait_seconds=-1)
        with pytest.raises(ValueError, match="mode should be one of"):
            idempotent(mode="eventually")  # type: ignore[arg-type]

    def test_called_outside_ninja_is_refused(self, rf):
        @idempotent()
        def view(request):
            return {}

        with pytest.raises(ImproperlyConfigured, match="outside a ninja operation"):
            view(rf.post("/"))


def schema() -> dict[str, Any]:
    # Through JSON, as a client reads it (ninja's dict keeps integer status codes).
    generated: dict[str, Any] = json.loads(json.dumps(api.get_openapi_schema(path_prefix="")))
    return generated


class TestOpenAPI:
    def test_schema_is_valid(self):
        validate(schema())

    def test_protected_operation_has_the_header_and_the_responses(self):
        operation = schema()["paths"]["/orders"]["post"]

        (header,) = [p for p in operation["parameters"] if p["in"] == "header"]
        assert header["name"] == "Idempotency-Key"
        assert header["required"] is True
        assert header["schema"]["maxLength"] == 255
        responses = operation["responses"]
        assert "Idempotent-Replayed" in responses["201"]["headers"]
        assert "$ref" in responses["201"]["content"]["application/json"]["schema"]
        assert "Retry-After" in responses["409"]["headers"]
        for status, code in [
            ("400", "idempotency_key_missing"),
            ("409", "idempotency_key_under_review"),
            ("422", "idempotency_key_reused"),
        ]:
            assert code in responses[status]["description"]
        assert operation["description"] == "Creates an order of the caller."

    def test_one_problem_component_and_ninjas_422_beside_it(self):
        generated = schema()
        responses = generated["paths"]["/orders"]["post"]["responses"]
        problem = {"$ref": "#/components/schemas/IdempotencyProblem"}
        either = {"oneOf": [problem, {"$ref": "#/components/schemas/ValidationError"}]}

        unreadable = {"oneOf": [problem, {"$ref": "#/components/schemas/HttpError"}]}

        assert responses["409"]["content"] == {"application/problem+json": {"schema": problem}}
        # Ninja answers 422 (its validation error) and 400 (a body it cannot read) itself.
        for status, alternatives in [("422", either), ("400", unreadable)]:
            assert responses[status]["content"] == {
                "application/problem+json": {"schema": alternatives},
                "application/json": {"schema": alternatives},
            }
        components = generated["components"]["schemas"]
        assert (
            "idempotency_key_reused"
            in components["IdempotencyProblem"]["properties"]["code"]["description"]
        )
        assert components["ValidationError"]["required"] == ["detail"]
        # Defined once, referred to everywhere: no inline copy in any operation.
        assert '"code": {' not in json.dumps(generated["paths"])

    def test_ninjas_validation_error_matches_its_schema(self, client, auth):
        response = post(client, "/orders", {"sku": "book", "quantity": "many"}, auth)
        components = schema()["components"]["schemas"]
        either = {"oneOf": [components["IdempotencyProblem"], components["ValidationError"]]}

        assert response.status_code == 422
        jsonschema.validate(response.json(), either)
        assert isinstance(response.json()["detail"], list)

    def test_ninjas_unreadable_body_matches_its_schema(self, client, auth):
        response = client.post(
            "/ninja/orders",
            b"\xff\xfe",
            content_type="application/json",
            headers={**auth, "Idempotency-Key": "k-unreadable"},
        )
        components = schema()["components"]["schemas"]
        either = {"oneOf": [components["IdempotencyProblem"], components["HttpError"]]}

        assert response.status_code == 400
        jsonschema.validate(response.json(), either)
        missing = post(client, "/orders", ORDER, auth, key=None)
        jsonschema.validate(missing.json(), either)  # the problem is the other alternative

    def test_key_header_publishes_the_expiry_policy(self):
        (header,) = [
            p for p in schema()["paths"]["/orders"]["post"]["parameters"] if p["in"] == "header"
        ]
        assert "Keys expire" in header["description"]
        assert "1 day (86400 s)" in header["description"]

    def test_header_follows_the_options(self):
        paths = schema()["paths"]
        lease = paths["/lease"]["post"]["parameters"]
        optional = paths["/final"]["post"]["parameters"]
        charge = paths["/charges"]["post"]

        assert [p["name"] for p in lease if p["in"] == "header"] == ["X-Request-Id"]
        assert [p["required"] for p in optional if p["in"] == "header"] == [False]
        assert [p for p in charge["parameters"] if p["in"] == "header"] == []
        assert "Idempotent-Replayed" in charge["responses"]["200"]["headers"]
        assert "headers" not in charge["responses"]["402"]
        assert "409" in charge["responses"]

    def test_router_operation_mounted_on_the_api(self):
        operation = schema()["paths"]["/routed/orders/{order_id}"]["put"]

        assert "Idempotency-Key" in [p["name"] for p in operation["parameters"]]
        assert "Idempotent-Replayed" in operation["responses"]["200"]["headers"]

    def test_unprotected_operation_is_left_alone(self):
        operation = schema()["paths"]["/orders"]["get"]

        assert operation["parameters"] == []
        assert set(operation["responses"]) == {"200"}
        assert "headers" not in operation["responses"]["200"]

    @override_settings(IDEMPOTENCY={"MAX_KEY_LENGTH": 64, "REQUIRE_KEY": False})
    def test_settings_are_read_when_the_operation_is_declared(self):
        other = NinjaAPI(urls_namespace="tests-ninja-settings")

        @other.post("/x")
        @idempotent()
        def create(request):
            return {}

        generated = other.get_openapi_schema(path_prefix="")
        (header,) = generated["paths"]["/x"]["post"]["parameters"]
        assert (header["required"], header["schema"]["maxLength"]) == (False, 64)

    def test_the_errors_follow_the_shape_a_renderer_declares(self):
        def render(request, error, status):
            raise AssertionError("only its declaration is read here")

        render.openapi_schema = {"type": "object", "required": ["error"]}  # type: ignore[attr-defined]
        render.media_type = "application/vnd.shop.error+json"  # type: ignore[attr-defined]
        with override_settings(IDEMPOTENCY={"ERROR_FORMAT": render}):
            other = NinjaAPI(urls_namespace="tests-ninja-error-shape")

            class Created(Schema):
                id: int

            @other.post("/x", response={201: Created})
            @idempotent()
            def create(request):
                return 201, {"id": 1}

            generated = json.loads(json.dumps(other.get_openapi_schema(path_prefix="")))
        validate(generated)
        component = generated["components"]["schemas"]["IdempotencyProblem"]
        assert component == render.openapi_schema  # type: ignore[attr-defined]
        responses = generated["paths"]["/x"]["post"]["responses"]
        assert set(responses["409"]["content"]) == {"application/vnd.shop.error+json"}

    @override_settings(IDEMPOTENCY={"REPLAYED_HEADER": "Idempotency-Replayed"})
    def test_the_replay_headers_are_named_as_configured(self):
        other = NinjaAPI(urls_namespace="tests-ninja-replayed")

        @other.post("/x")
        @idempotent()
        def create(request):
            return {}

        generated = other.get_openapi_schema(path_prefix="")
        headers = generated["paths"]["/x"]["post"]["responses"][200]["headers"]
        assert set(headers) == {"Idempotency-Replayed", "Idempotency-Replay"}
        assert headers["Idempotency-Replay"]["schema"]["enum"] == ["omitted"]


@pytest.mark.django_db(transaction=True)
class TestAsyncOperations:
    """Async operations run through ``aprotect``: the view's async ORM write shares the claim."""

    @pytest.fixture
    def aclient(self) -> AsyncClient:
        return AsyncClient()

    def post(self, aclient, path: str, auth, data: Any = ORDER, key: str | None = "a-1"):
        headers = {**auth, **({} if key is None else {"Idempotency-Key": key})}

        async def send():  # Django 4.2's AsyncClient.post is not itself a coroutine function
            return await aclient.post(
                "/ninja" + path, json.dumps(data), content_type="application/json", headers=headers
            )

        return async_to_sync(send)()

    def test_first_replay_and_reuse(self, aclient, auth):
        first = self.post(aclient, "/async/orders", auth)
        replay = self.post(aclient, "/async/orders", auth)
        reused = self.post(aclient, "/async/orders", auth, {**ORDER, "quantity": 5})

        order = Order.objects.get()
        assert (first.status_code, json.loads(first.content)) == (201, {"id": order.pk, **ORDER})
        assert (replay.status_code, replay.content, is_replay(replay)) == (201, first.content, True)
        assert (reused.status_code, problem_code(reused)) == (422, "idempotency_key_reused")
        assert IdempotencyRecord.objects.get().operation == "orders.create-async"

    def test_missing_key_and_anonymous(self, aclient, auth):
        missing = self.post(aclient, "/async/orders", auth, key=None)
        anonymous = self.post(aclient, "/async/orders", {})

        assert (missing.status_code, problem_code(missing)) == (400, "idempotency_key_missing")
        assert anonymous.status_code == 401
        assert Order.objects.count() == IdempotencyRecord.objects.count() == 0

    def test_a_raised_4xx_rolls_back_the_async_write_and_frees_the_key(self, aclient, auth):
        failed = self.post(aclient, "/async/orders?fail=404", auth)
        retried = self.post(aclient, "/async/orders", auth)

        assert failed.status_code == 404
        assert retried.status_code == 201 and not is_replay(retried)
        assert Order.objects.count() == 1

    def test_an_exception_rolls_back_the_async_write(self, aclient, auth):
        with pytest.raises(RuntimeError):
            self.post(aclient, "/async/orders?fail=crash", auth)

        assert Order.objects.count() == IdempotencyRecord.objects.count() == 0

    def test_lease_mode(self, aclient, auth):
        failed = self.post(aclient, "/async/lease?fail=404", auth)
        first = self.post(aclient, "/async/lease", auth)
        replay = self.post(aclient, "/async/lease", auth)

        assert failed.status_code == 404
        assert first.status_code == 201 and is_replay(replay)
        assert IdempotencyRecord.objects.get().status == Status.SUCCEEDED
        assert Order.objects.count() == 2  # lease mode keeps the 404 attempt's write

    def test_schema_documents_async_operations_too(self):
        operation = schema()["paths"]["/async/orders"]["post"]

        assert "Idempotency-Key" in [p["name"] for p in operation["parameters"]]
        assert "Idempotent-Replayed" in operation["responses"]["201"]["headers"]


WITHOUT_DRF = """
import json, sys, types
import django
django.setup()
from django.core.management import call_command
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import path
from ninja import NinjaAPI
from ninja.security import django_auth
from idempotency.ninja import idempotent

api = NinjaAPI(urls_namespace="nodrf", auth=django_auth)

@api.post("/things")
@idempotent()
def create_thing(request, name: str):
    return {"name": name}

urls = types.ModuleType("nodrf_ninja_urls")
urls.urlpatterns = [path("ninja/", api.urls)]
sys.modules["nodrf_ninja_urls"] = urls
call_command("migrate", verbosity=0)
client = Client()
client.force_login(User.objects.create_user("nodrf"))
with override_settings(ROOT_URLCONF="nodrf_ninja_urls"):
    first, again, missing = (
        client.post("/ninja/things?name=a", headers=headers)
        for headers in ({"Idempotency-Key": "k"}, {"Idempotency-Key": "k"}, {})
    )
    schema = api.get_openapi_schema(path_prefix="")
assert (first.status_code, again.status_code, again["Idempotent-Replayed"]) == (200, 200, "true")
assert json.loads(missing.content)["code"] == "idempotency_key_missing"
assert "409" in json.dumps(schema)
assert not [m for m, module in sys.modules.items() if m.startswith("rest_framework") and module]
print("ok")
"""


def test_a_ninja_project_without_drf():
    env = process_env(database=False, DJANGO_SETTINGS_MODULE="tests.nodrf.settings")
    env.pop("PREPARED_STATEMENTS", None)  # psycopg options; this process uses in-memory SQLite
    result = subprocess.run(
        python("-c", WITHOUT_DRF),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
