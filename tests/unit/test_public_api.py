"""What a user calls has a docstring: ``help()`` and the API reference show it."""

from __future__ import annotations

import inspect
import typing

import pytest

import idempotency


@pytest.mark.parametrize("name", sorted(set(idempotency.__all__)))
def test_every_public_name_says_what_it_is(name):
    value = getattr(idempotency, name)
    if typing.get_origin(value) is not None:
        return  # a type alias (Resolver): docs/api-reference.md says what it is
    if not (inspect.isclass(value) or callable(value)):
        pytest.fail(f"idempotency.{name} is neither a class nor a function")
    # The class's or function's own docstring, not one it inherits.
    assert vars(value).get("__doc__") if inspect.isclass(value) else value.__doc__, name


def test_a_view_without_a_docstring_is_not_described_by_the_mixins():
    from rest_framework import viewsets

    class Plain(idempotency.IdempotentCreateMixin, viewsets.ModelViewSet):
        pass

    assert "Idempotent" not in (inspect.getdoc(Plain) or "")
    assert "create" in inspect.getdoc(idempotency.IdempotentCreateMixin)
