"""Temporary: the waiting statements, until they become store methods."""

from __future__ import annotations

import hashlib
import inspect
import time
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import Q
from django.db.models.functions import Now

from idempotency.models import IdempotencyRecord, Status
from idempotency.waiting import pauses


def in_flight(alias: str, scope: str, key: str) -> bool:
    """A live attempt holds the key: ``PROCESSING`` with a lease that has not run out."""
    return (
        IdempotencyRecord.objects.using(alias)
        .filter(scope=scope, idem_key=key, status=Status.PROCESSING)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__gt=Now()))
        .exists()
    )


def generic_wait(alias: str, scope: str, key: str, seconds: float) -> None:
    """Poll: an indexed read after 50 ms, 100 ms, 200 ms... at most one a second."""
    deadline = time.monotonic() + seconds
    for pause in pauses(0.05, 1.0):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(pause, left))
        if not in_flight(alias, scope, key):
            return


def channel(scope: str, key: str) -> str:
    """The notification channel of one key: a digest of scope and key, never the key itself."""
    digest = hashlib.sha256(f"{scope}\n{key}".encode()).hexdigest()
    return f"idempotency_{digest[:48]}"


def pg_wait(alias: str, scope: str, key: str, seconds: float) -> None:
    connection = connections[alias]
    connection.ensure_connection()
    raw: Any = connection.connection
    if not _hears_notifications(raw):
        generic_wait(alias, scope, key, seconds)
        return
    name = channel(scope, key)
    deadline = time.monotonic() + seconds
    with connection.cursor() as cursor:
        cursor.execute(f'LISTEN "{name}"')
    try:
        # Listening first, then looking: an outcome committed in between is not missed.
        for pause in pauses(1.0, 4.0):
            if not in_flight(alias, scope, key):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with connection.wrap_database_errors:
                heard = list(raw.notifies(timeout=min(pause, left), stop_after=1))
            if any(notification.channel == name for notification in heard):
                return
    finally:
        _unlisten(alias, name)


def _unlisten(alias: str, name: str) -> None:
    connection = connections[alias]
    try:
        with connection.cursor() as cursor:
            cursor.execute(f'UNLISTEN "{name}"')
    except DatabaseError:
        connection.close()  # never hand a listening connection to the next request


def _hears_notifications(raw: Any) -> bool:
    """psycopg 3.2+: ``notifies(timeout=...)``; psycopg 2 and older 3.x poll instead."""
    notifies = getattr(raw, "notifies", None)
    return callable(notifies) and "timeout" in inspect.signature(notifies).parameters


def pg_notify(alias: str, scope: str, key: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [channel(scope, key)])


def wait_for_outcome(alias: str, scope: str, key: str, seconds: float) -> None:
    if connections[alias].vendor == "postgresql":
        pg_wait(alias, scope, key, seconds)
    else:
        generic_wait(alias, scope, key, seconds)


def notify_waiters(alias: str, scope: str, key: str) -> None:
    if connections[alias].vendor == "postgresql":
        pg_notify(alias, scope, key)
