"""The per-call options: one definition, taken and honoured by every entry point.

``APPLIES`` says which entry point takes which option; each entry point is
called here with every option it takes set to a value of its own, and what it
hands the protocol (the ``Operation``, the key, the outcome) is checked for
each. An option added to ``IdempotencyOptions`` fails ``test_every_option_is_checked``
until it has a row below.
"""

from __future__ import annotations

import itertools
from dataclasses import fields
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from ninja import NinjaAPI, Router, Schema
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from idempotency import IdempotencyOptions, drf, functions, http
from idempotency.celery import IdempotentTask
from idempotency.decorators import idempotent
from idempotency.django_tasks import idempotent_task
from idempotency.exceptions import KeyMissing
from idempotency.fingerprint import canonical, digest_of, fingerprint
from idempotency.functions import idempotent_function
from idempotency.models import Status
from idempotency.ninja import idempotent as ninja_idempotent
from idempotency.options import APPLIES, OPTION_NAMES, OptionArgs
from tests.support.factories import UserFactory


def resolver(record: Any) -> None:
    return None


def policy(response: Any) -> Status:
    policy.seen = response  # type: ignore[attr-defined]
    return Status.SUCCEEDED


def render(request: Any, error: Any, status: int) -> HttpResponse:
    render.seen = error.code  # type: ignore[attr-defined]
    return HttpResponse(status=status)


# For each option: the value every entry point is given, and how its effect is seen in
# what reached the protocol (``seen``: the Operation, the outcome, and the entry point).
VALUES: dict[str, Any] = {
    "operation": "tests.options.op",
    "header": "X-Op-Key",
    "required": True,
    "key": lambda *args, **kwargs: "from-key-function",
    "scope": lambda *args, **kwargs: "from-scope-function",
    "fingerprint": lambda *args, **kwargs: "material",
    "fields": ["a"],
    "exclude": ["b"],
    "mode": "lease",
    "lease_seconds": 17.0,
    "lock_timeout": 3.5,
    "outcome_policy": policy,
    "resolver": resolver,
    "wait_seconds": 2.5,
    "in_flight": "wait",
    "using": "default",
    "error_format": render,
}
BODY = {"a": 1, "b": 2}


def _check(name: str, seen: dict[str, Any]) -> bool:
    operation = seen["operation"]
    return {
        "operation": lambda: operation.name == VALUES["operation"],
        "header": lambda: operation.key == "from-header",
        "required": lambda: seen["missing_key_refused"],
        "key": lambda: operation.key == "from-key-function",
        "scope": lambda: operation.scope == "from-scope-function",
        "fingerprint": lambda: operation.request_hash == digest_of(fingerprint(seen["material"])),
        "fields": lambda: operation.request_hash == digest_of(seen["hash_of"]({"a": 1})),
        # with ``fields`` given too: ``exclude`` is seen on its own below
        "exclude": lambda: seen["hash_without_b"] == digest_of(seen["hash_of"]({"a": 1})),
        "mode": lambda: operation.mode == "lease",
        "lease_seconds": lambda: operation.lease_seconds == 17.0,
        "lock_timeout": lambda: operation.lock_timeout == 3.5,
        "outcome_policy": lambda: (
            seen["outcome"].status == Status.SUCCEEDED and getattr(policy, "seen", None) is not None
        ),
        "resolver": lambda: operation.resolver is resolver,
        "wait_seconds": lambda: operation.wait_seconds == 2.5,
        "in_flight": lambda: operation.in_flight == "wait",
        "using": lambda: operation.using == "default",
        "error_format": lambda: seen["rendered"] == "idempotency_key_missing",
    }[name]()


class Protocol:
    """Stands in for ``core.execute``: keeps what an entry point hands it."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, operation: Any, work: Any, decide: Any, replay: Any) -> Any:
        result = HttpResponse(status=201) if operation.method else {"ok": True}
        self.calls.append(
            {"operation": operation, "outcome": decide(result, _Attempt()) if decide else None}
        )
        return result


class _Attempt:
    resource_id = ""


@pytest.fixture
def protocol(monkeypatch: pytest.MonkeyPatch) -> Protocol:
    recorder = Protocol()
    monkeypatch.setattr(http, "execute", recorder)
    monkeypatch.setattr(functions, "execute", recorder)
    return recorder


def http_hash(data: dict[str, Any], path: str) -> str:
    return fingerprint(["POST", path, "[]", canonical(data)])


def function_hash(data: dict[str, Any]) -> str:
    return fingerprint([canonical(data)])


# --- the entry points, each called with ``options`` -------------------------------------


def call_django(options: dict[str, Any], headers: dict[str, str]) -> None:
    @idempotent(**options)
    def view(request: Any) -> HttpResponse:
        return HttpResponse(status=201)

    request = RequestFactory().post("/o/", BODY, content_type="application/json", headers=headers)
    request.user = UserFactory.build(pk=1)
    response = view(request)
    if response.status_code == 400:
        raise KeyMissing()


class Payload(Schema):
    a: int
    b: int


def call_ninja(options: dict[str, Any], headers: dict[str, str]) -> None:
    router = Router()

    @router.post("/o/")
    @ninja_idempotent(**options)
    def create(request: Any, payload: Payload) -> Any:
        return {"ok": True}

    api = NinjaAPI(urls_namespace=f"options-{next(_APIS)}")
    api.add_router("", router)
    match = next(found for pattern in api.urls[0] if (found := pattern.resolve("o/")))
    request = RequestFactory().post("/o/", BODY, content_type="application/json", headers=headers)
    if match.func(request, *match.args, **match.kwargs).status_code == 400:
        raise KeyMissing()


_APIS = itertools.count()


def call_drf(options: dict[str, Any], headers: dict[str, str]) -> None:
    attributes = {f"idempotency_{name}": value for name, value in options.items()}
    attributes["post"] = lambda self, request: self.run_idempotently(
        request, lambda: Response({"ok": True}, status=201)
    )
    view = type("OptionsView", (drf.IdempotentMixin, APIView), attributes).as_view()
    request = APIRequestFactory().post("/o/", BODY, format="json", headers=headers)
    force_authenticate(request, user=UserFactory.build(pk=1))
    if view(request).status_code == 400:
        raise KeyMissing()


def call_function(options: dict[str, Any], headers: dict[str, str]) -> None:
    @idempotent_function(**options)
    def handle(a: int, b: int) -> dict[str, bool]:
        return {"ok": True}

    handle(**BODY)


def call_task(options: dict[str, Any], headers: dict[str, str]) -> None:
    attributes = {
        f"idempotency_{name}": staticmethod(value) if callable(value) else value
        for name, value in options.items()
    }
    attributes.update(name="tests.options_task", run=lambda self, a, b: {"ok": True})
    task = type("OptionsTask", (IdempotentTask,), attributes)()
    task(**BODY)


def call_django_task(options: dict[str, Any], headers: dict[str, str]) -> None:
    @idempotent_task(**options)
    def handle(a: int, b: int) -> dict[str, bool]:
        return {"ok": True}

    handle(**BODY)


ENTRY_POINTS = {
    "idempotent": (call_django, lambda data: http_hash(data, "/o/")),
    "ninja": (call_ninja, lambda data: http_hash(data, "/o/")),
    # The mixin's fingerprint is its get_idempotency_fingerprint hook's, hashed once more.
    "IdempotentMixin": (call_drf, lambda data: fingerprint([http_hash(data, "/o/")])),
    "idempotent_function": (call_function, function_hash),
    "IdempotentTask": (call_task, function_hash),
    "idempotent_task": (call_django_task, function_hash),
}


def test_every_option_is_checked() -> None:
    assert set(VALUES) == set(OPTION_NAMES)
    assert set(APPLIES) == set(ENTRY_POINTS)


def test_the_keyword_arguments_are_the_options() -> None:
    # The two declarations of ``idempotency.options``, name by name and type by type.
    declared = {field.name: field.type for field in fields(IdempotencyOptions)}
    arguments = OptionArgs.__annotations__.items()
    assert {name: getattr(kind, "__forward_arg__", kind) for name, kind in arguments} == declared


@pytest.mark.django_db
@pytest.mark.parametrize("entry_point", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("name", OPTION_NAMES)
def test_each_entry_point_honours_each_option_it_takes(
    protocol: Protocol, entry_point: str, name: str
) -> None:
    call, hash_of = ENTRY_POINTS[entry_point]
    if name not in APPLIES[entry_point]:
        with pytest.raises(TypeError, match=f"takes no (idempotency_)?{name}"):
            call({name: VALUES[name]}, {})
        return
    # Every option it takes at once, except those that hide another's effect.
    hidden = {"key": {"header"}, "fingerprint": {"fields", "exclude"}, "fields": {"exclude"}}
    given = {
        option: VALUES[option]
        for option in APPLIES[entry_point]
        if option == name or option not in hidden.get(name, set()) | {"key", "fingerprint"}
    }
    if "key" in APPLIES[entry_point] and "key" not in given and "header" not in given:
        given["key"] = VALUES["key"]
    if name == "exclude":
        given.pop("fields", None)
    headers = {"X-Op-Key": "from-header", "Idempotency-Key": "from-default-header"}
    call(given, headers)
    seen: dict[str, Any] = {**protocol.calls[-1], "hash_of": hash_of, "material": ["material"]}
    if entry_point in ("idempotent_function", "IdempotentTask", "idempotent_task"):
        seen["material"] = [canonical("material")]
    if name == "exclude":
        seen["hash_without_b"] = seen["operation"].request_hash
    if name == "error_format":
        render.seen = None  # type: ignore[attr-defined]
        with pytest.raises(KeyMissing):  # no key: the error the renderer renders
            call(given, {})
        seen["rendered"] = getattr(render, "seen", None)
    if name == "required":
        try:
            call(given, {})
        except KeyMissing:
            seen["missing_key_refused"] = True
        else:
            seen["missing_key_refused"] = False
    assert _check(name, seen), (entry_point, name, seen)
