"""PostgreSQL: a duplicate waits for the first attempt's outcome with ``LISTEN``/``NOTIFY``.

``PostgresStore`` takes these from ``PostgresNotifications``; without a driver
that waits for a notification, or behind a transaction pooler, it polls as
``GenericStore`` does.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from typing import Any

from django.db import DatabaseError

from idempotency.stores.base import pauses, schema, transaction_pooled
from idempotency.stores.generic import GenericStore


class PostgresNotifications(GenericStore):
    def wait_for_outcome(self, scope: str, key: str, seconds: float) -> None:
        """``LISTEN`` on the key's channel, on the request's own connection, out of any transaction.

        Listening first and then reading the record once means an outcome
        committed in between is not missed. Whatever sends no notification
        (recovery, an operator, a lease running out) is caught by a read
        after 1, 2, 4, 4... seconds. ``UNLISTEN`` afterwards: the connection
        may be persistent or pooled, and goes to the next request listening
        to nothing.

        Behind a pooler in transaction mode (``transaction_pooled``) it polls
        instead, as ``GenericStore`` does: there the ``LISTEN`` would stay on
        whichever server connection ran it, go on to other clients, and no
        notification would reach this one.
        """
        if transaction_pooled(self.alias):
            super().wait_for_outcome(scope, key, seconds)
            return
        connection = self.connection
        connection.ensure_connection()
        raw: Any = connection.connection
        if not _hears_notifications(raw):
            super().wait_for_outcome(scope, key, seconds)
            return
        name = channel(scope, key, schema(self.alias))
        deadline = time.monotonic() + seconds
        with connection.cursor() as cursor:
            cursor.execute(f'LISTEN "{name}"')
        try:
            for pause in pauses(1.0, 4.0):
                left = deadline - time.monotonic()
                if left <= 0 or not self.in_flight(scope, key):
                    return
                with connection.wrap_database_errors:
                    heard = list(raw.notifies(timeout=min(pause, left), stop_after=1))
                if any(notification.channel == name for notification in heard):
                    return
        finally:
            self._unlisten(name)

    def notify_waiters(self, scope: str, key: str) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [channel(scope, key, schema(self.alias))])

    def _unlisten(self, name: str) -> None:
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(f'UNLISTEN "{name}"')
        except DatabaseError:
            self.connection.close()  # never hand a listening connection to the next request


def channel(scope: str, key: str, schema: str | None = None) -> str:
    """The notification channel of one key: a digest of its scope and key, never the key itself.

    Anyone allowed to connect may ``LISTEN`` and see channel names; keys may be
    sensitive (an order number, a provider's reference). Channels are per
    database; a schema per tenant (django-tenants) shares one, so the schema
    of the records' connection is part of the digest there.
    """
    named = f"{scope}\n{key}" if schema is None else f"{schema}\n{scope}\n{key}"
    digest = hashlib.sha256(named.encode()).hexdigest()
    return f"idempotency_{digest[:48]}"  # an identifier: at most 63 characters


def _hears_notifications(raw: Any) -> bool:
    """psycopg 3.2+ waits for a notification with a timeout; older drivers poll instead."""
    notifies = getattr(raw, "notifies", None)
    return callable(notifies) and "timeout" in inspect.signature(notifies).parameters
