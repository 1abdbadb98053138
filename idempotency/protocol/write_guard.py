"""An atomic-mode attempt writes to one database: the one that holds its record.

The claim, the business writes and the recorded outcome commit together only
when they are in one transaction, so on one database. A view that writes to
another alias (a tenant's database the router did not pick for the record, a
second database of its own) commits that write on its own: a retry after a
crash runs it again, and the guarantee is silently gone. While an attempt
runs, every other alias of the request's thread refuses writes with
``CrossDatabaseWrite``, which says what to set. It is on under ``DEBUG`` and
Django's test environment (``WRITE_GUARD = None``), always with ``True``,
never with ``False``: each statement on the other aliases is looked at.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

from django.conf import settings
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from idempotency.conf import idempotency_settings

__all__ = ["CrossDatabaseWrite", "writes_only_to"]

_WRITE = re.compile(r"\s*(?:INSERT|UPDATE|DELETE|MERGE|REPLACE|TRUNCATE|COPY)\b", re.IGNORECASE)


class CrossDatabaseWrite(ImproperlyConfigured):
    """An atomic-mode attempt wrote to a database that does not hold its record."""


def writes_only_to(database: str) -> AbstractContextManager[None]:
    """While the attempt runs, refuse writes on every alias but ``database`` (when guarded)."""
    if len(connections.settings) < 2 or not _guarded():
        return nullcontext()
    return _refuse_others(database)


@contextmanager
def _refuse_others(database: str) -> Iterator[None]:
    with ExitStack() as stack:
        for alias in connections:
            if alias != database:
                stack.enter_context(connections[alias].execute_wrapper(_refusal(alias, database)))
        yield


def _refusal(alias: str, database: str) -> Callable[..., Any]:
    def refuse(execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any) -> Any:
        if isinstance(sql, str) and _WRITE.match(sql):
            raise CrossDatabaseWrite(
                f"An atomic-mode idempotent attempt whose record is on database {database!r} "
                f"wrote to {alias!r}: that write would commit on its own, outside the "
                f"attempt's transaction, and run again on a retry. Put the record where the "
                f"writes go: route IdempotencyRecord like the view's models (the router's "
                f"db_for_write), or pass using={alias!r} to the view's protection "
                f"(@idempotent(using=...), Operation(using=...)), or IDEMPOTENCY['DATABASE']; "
                f"or use mode='lease'. IDEMPOTENCY['WRITE_GUARD'] = False turns this check off."
            )
        return execute(sql, params, many, context)

    return refuse


def _guarded() -> bool:
    chosen = idempotency_settings.WRITE_GUARD
    if chosen is not None:
        return chosen
    return bool(settings.DEBUG) or _testing()


def _testing() -> bool:
    """Django's test environment is set up (its runner, pytest-django): DEBUG is off there.

    ``setup_test_environment`` installs the locmem outbox, ``django.core.mail.outbox``
    (documented in Django's testing tools); nothing else marks it publicly.
    """
    return hasattr(mail, "outbox")
