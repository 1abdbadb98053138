"""The operations a project declares, by name: what ``OPERATION_RETENTION`` and
``RESOLVERS`` may name.

Each entry point declares the operation its records are kept under when it is
defined: ``@idempotent`` (plain Django and DRF function views, view methods) and
django-ninja's when they decorate, ``@idempotent_function`` and ``@idempotent_task``
likewise (their guard), a DRF view
class when it is made (its ``idempotency_operation``, or ``create`` and ``post``
for ``IdempotentCreateMixin``) and when its URL is made (``as_view()``: the
actions it serves), an ``IdempotentTask`` when Celery binds it (its name), and
whatever registers a resolver for a name (``resolvers.register``). So
the names are known once the URLconf and the task modules are imported, which
is what check ``idempotency.W009`` does before it compares the settings with them.

A name a view makes up per request (an overridden ``get_idempotency_operation``)
or an ``Operation(name=...)`` given to ``execute()`` is declared by nobody.
"""

from __future__ import annotations

_declared: set[str] = set()


def declare(name: str) -> None:
    """Make ``name`` known as an operation of the project (entry points call it)."""
    if name:
        _declared.add(name)


def declared() -> frozenset[str]:
    """Every operation name declared in this process so far."""
    return frozenset(_declared)
