"""An opt-in cache of finished outcomes, so that a replay skips the database (``REPLAY_CACHE``).

The database stays the source of truth; the cache only remembers what it
already holds for good:

- only ``SUCCEEDED`` and ``FAILED_FINAL`` outcomes, which never change, and
  only once their transaction has committed (``PROCESSING`` and
  ``FAILED_RETRYABLE`` are never cached);
- an entry lives no longer than its record's retention window, and says when
  that window ends: past it (or within ``EDGE_SECONDS`` of it, where this
  process's clock and the database's may disagree) the cache does not answer
  and the claim decides, by the database's clock, that the key is new;
- the cache key is a digest of the records' namespace (the database alias, and
  the schema its connection is switched to under django-tenants: never shared
  between tenants, whatever the scope says), the scope and the key, and
  the entry repeats the scope, the key and the request hash: a lookup answers
  only the same caller's same request, anything else (another scope, a
  different body: 422) goes to the database as without the cache;
- whatever deletes or moves a record through this app forgets its entry: the
  admin, purge, ``transitions.transition``. The admin and transitions leave a
  short-lived tombstone, and entries are only ever added (``cache.add``), so a
  request that read the record just before an operator deleted it cannot put
  it back. A cache error is logged and the database answers.

This module knows nothing of HTTP; the protocol (``execute``) asks it before claiming.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Protocol

from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache, InvalidCacheBackendError
from django.db import transaction

from idempotency.conf import idempotency_settings
from idempotency.models import REPLAYABLE, IdempotencyRecord
from idempotency.shards import namespace
from idempotency.stores import records_database


class Operation(Protocol):
    """What the cache reads of an operation: where its record lives and what it asks."""

    @property
    def scope(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def request_hash(self) -> bytes: ...
    @property
    def name(self) -> str: ...
    @property
    def database(self) -> str: ...


logger = logging.getLogger("idempotency")

PREFIX = "idempotency:replay:2:"
# Longer than any request takes from reading a record to caching it.
TOMBSTONE_SECONDS = 300
# The last seconds of a record's window belong to the database: its clock says when it ends.
EDGE_SECONDS = 1.0
_TOMBSTONE = {"forgotten": True}


def cache_key(database: str, scope: str, key: str) -> str:
    digest = hashlib.sha256("\0".join((namespace(database), scope, key)).encode()).hexdigest()
    return PREFIX + digest


def lookup(operation: Operation) -> IdempotencyRecord | None:
    """The finished record of this very request, if the cache holds it; else ``None``."""
    cache = _cache()
    if cache is None:
        return None
    try:
        entry = cache.get(cache_key(operation.database, operation.scope, operation.key))
    except Exception:  # the cache is down: the database answers
        logger.warning("idempotency replay cache unavailable", exc_info=True)
        return None
    if not _answers(entry, operation):
        return None
    return _record(entry, operation.database)


def remember(operation: Operation, record: IdempotencyRecord) -> None:
    """Cache a finished record read from the database, once what read it has committed."""
    if record.status not in REPLAYABLE or _cache() is None:
        return
    ends = None if record.expires_at is None else record.expires_at.timestamp()
    _remember(operation, _entry(record, ends))


def remember_outcome(
    operation: Operation,
    record_id: int,
    columns: dict[str, Any],
    window: timedelta | None,
    since: float | None = None,
) -> None:
    """Cache the outcome an attempt just recorded (its ``columns``), once its transaction commits.

    ``since`` (``time.monotonic()``) is when the attempt claimed the record: the
    window may count from the claim (PostgreSQL's atomic mode), never from later.
    """
    if columns["status"] not in REPLAYABLE or _cache() is None:
        return
    record = IdempotencyRecord(
        pk=record_id,
        scope=operation.scope,
        idem_key=operation.key,
        operation=operation.name[:255],
        request_hash=operation.request_hash,
        **columns,
    )
    ends = None
    if window is not None:
        ends = time.time() - (0.0 if since is None else time.monotonic() - since)
        ends += window.total_seconds()
    _remember(operation, _entry(record, ends))


def _remember(operation: Operation, entry: dict[str, Any]) -> None:
    ends = entry["expires"]
    seconds = None if ends is None else ends - EDGE_SECONDS - time.time()
    if seconds is not None and seconds <= 0:
        return  # the database answers the window's last moments
    transaction.on_commit(lambda: _store(operation, entry, seconds), using=operation.database)


def forget(pairs: Iterable[tuple[str, str]], using: str, *, tombstone: bool = True) -> None:
    """Drop the entries of these ``(scope, key)`` pairs; call it when records are deleted.

    With ``tombstone`` (the default) nothing can cache the pairs again for a
    few minutes. Purge does without: it deletes expired records, which no
    request caches any more.
    """
    cache = _cache()
    if cache is None:
        return
    keys = [cache_key(using, scope, key) for scope, key in pairs]
    if not keys:
        return
    try:
        if tombstone:
            cache.set_many(dict.fromkeys(keys, _TOMBSTONE), TOMBSTONE_SECONDS)
        else:
            cache.delete_many(keys)
    except Exception:
        # A stale entry could now replay a deleted record until its window ends.
        logger.error("idempotency replay cache: entries not forgotten", exc_info=True)


def forget_records(records: Iterable[IdempotencyRecord], using: str | None = None) -> None:
    for database, pairs in _by_database(records, using).items():
        forget(pairs, database)


def _by_database(
    records: Iterable[IdempotencyRecord], using: str | None
) -> dict[str, list[tuple[str, str]]]:
    grouped: dict[str, list[tuple[str, str]]] = {}
    for record in records:
        # The alias the entry was cached under: the records' database, even for a
        # record read from a replica through a router.
        database = records_database(using, record=record)
        grouped.setdefault(database, []).append((record.scope, record.idem_key))
    return grouped


def _cache() -> BaseCache | None:
    alias = idempotency_settings.REPLAY_CACHE
    if alias is None:
        return None
    try:
        return caches[alias]
    except InvalidCacheBackendError:  # idempotency.E029 says so at start-up
        logger.error("idempotency REPLAY_CACHE names no cache of CACHES: %r", alias)
        return None


_FIELDS = (
    "pk",
    "scope",
    "idem_key",
    "operation",
    "request_hash",
    "status",
    "response_status",
    "response_headers",
    "response_body",
    "resource_id",
)


def _entry(record: IdempotencyRecord, ends: float | None) -> dict[str, Any]:
    entry = {name: getattr(record, name) for name in _FIELDS}
    # bytes, never a driver's memoryview (psycopg 2's), which would not pickle.
    body = entry["response_body"]
    entry["response_body"] = None if body is None else bytes(body)
    entry["request_hash"] = bytes(entry["request_hash"])
    entry["status"] = str(entry["status"])
    entry["expires"] = ends  # seconds since the epoch; None: kept until an operator acts
    return entry


def _store(operation: Operation, entry: dict[str, Any], seconds: float | None) -> None:
    cache = _cache()
    if cache is None:
        return
    timeout: float | object = DEFAULT_TIMEOUT if seconds is None else seconds
    try:
        # add, never set: a tombstone left by an operator's change must win.
        cache.add(
            cache_key(operation.database, operation.scope, operation.key),
            entry,
            timeout,  # type: ignore[arg-type]
        )
    except Exception:
        logger.warning("idempotency replay cache unavailable", exc_info=True)


def _answers(entry: object, operation: Operation) -> bool:
    return (
        isinstance(entry, dict)
        and entry.get("scope") == operation.scope
        and entry.get("idem_key") == operation.key
        and entry.get("request_hash") == operation.request_hash
        and entry.get("status") in REPLAYABLE
        and _live(entry.get("expires"))
    )


def _live(ends: object) -> bool:
    """Whether an entry's window still has more than its last ``EDGE_SECONDS`` to run.

    Checked on every lookup, not left to the cache's timeout alone, which a
    backend may round. An entry cached before entries said when they end has
    ``None`` here too: its timeout was bounded by the window already.
    """
    if ends is None:
        return True
    return isinstance(ends, int | float) and time.time() < ends - EDGE_SECONDS


def _record(entry: dict[str, Any], database: str) -> IdempotencyRecord:
    """The record as the ORM loads one (bound to ``database``), from the entry's fields."""
    fields = IdempotencyRecord(**{name: entry[name] for name in _FIELDS})
    names = [field.attname for field in IdempotencyRecord._meta.concrete_fields]
    return IdempotencyRecord.from_db(database, names, [getattr(fields, name) for name in names])
