"""The ``idempotency`` logger: one record per signal, with scope and operation.

Connected in ``IdempotencyConfig.ready``, so logs and metrics always see the same
events. Each record carries ``extra`` fields (``event``, ``scope``, ``operation``
and the event's own facts) for structured formatters. The client's key is
logged only at DEBUG: keys can be provider transaction ids or other values a
project would rather not ship to its log store.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from idempotency import signals
from idempotency.models import IdempotencyRecord
from idempotency.outcomes import Recovered
from idempotency.signals import operation_name

logger = logging.getLogger("idempotency")


def _scope(operation: Any, record: IdempotencyRecord | None) -> str:
    scope = getattr(operation, "scope", None) or getattr(record, "scope", "")
    return str(scope)


def _key(operation: Any, record: IdempotencyRecord | None) -> str:
    return str(getattr(operation, "key", None) or getattr(record, "idem_key", ""))


def _log(
    level: int,
    event: str,
    operation: Any = None,
    record: IdempotencyRecord | None = None,
    exc_info: BaseException | None = None,
    **facts: Any,
) -> None:
    if not logger.isEnabledFor(level):
        return
    extra = {
        "event": f"idempotency.{event}",
        "scope": _scope(operation, record),
        "operation": operation_name(operation) or getattr(record, "operation", ""),
        **facts,
    }
    details = " ".join(f"{name}={value}" for name, value in extra.items() if name != "event")
    logger.log(level, "idempotency %s %s", event, details, extra=extra, exc_info=exc_info)
    if logger.isEnabledFor(logging.DEBUG):
        key = _key(operation, record)
        logger.debug("idempotency %s key=%r", event, key, extra={**extra, "key": key})


def on_claimed(sender: Any, record: IdempotencyRecord, operation: Any, **kwargs: Any) -> None:
    reclaimed, replaced = bool(kwargs.get("reclaimed")), bool(kwargs.get("replaced"))
    _log(logging.INFO, "claimed", operation, record, reclaimed=reclaimed, replaced=replaced)


def on_replayed(sender: Any, record: IdempotencyRecord, operation: Any, **kwargs: Any) -> None:
    _log(logging.INFO, "replayed", operation, record, status=record.status)


def on_key_in_use(sender: Any, operation: Any, **kwargs: Any) -> None:
    _log(logging.INFO, "in_use", operation, retry_after=kwargs.get("retry_after"))


def on_key_under_review(
    sender: Any, record: IdempotencyRecord, operation: Any, **kwargs: Any
) -> None:
    # A client waits on an operator: the record (its scope in this line) is the one to settle.
    _log(logging.WARNING, "under_review", operation, record)


def on_key_reused(sender: Any, record: IdempotencyRecord, operation: Any, **kwargs: Any) -> None:
    # A client sent another request under a used key: a client bug worth seeing.
    _log(logging.WARNING, "key_reused", operation, record)


def on_completed(sender: Any, record: IdempotencyRecord, operation: Any, **kwargs: Any) -> None:
    _log(logging.INFO, "completed", operation, record, status=str(kwargs.get("status", "")))


def on_database_unavailable(sender: Any, operation: Any, **kwargs: Any) -> None:
    error = kwargs.get("error")
    _log(
        logging.ERROR,
        "database_unavailable",
        operation,
        exc_info=error if isinstance(error, BaseException) else None,
        error=type(error).__name__,
        retry_after=kwargs.get("retry_after"),
    )


def on_recovered(sender: Any, record: IdempotencyRecord, **kwargs: Any) -> None:
    outcome = str(kwargs.get("outcome", ""))
    # Anything but a clean resolution needs a person.
    settled = outcome in (Recovered.SUCCEEDED, Recovered.RELEASED)
    level = logging.INFO if settled else logging.WARNING
    _log(level, "recovered", kwargs.get("operation"), record, outcome=outcome)


def on_purged(sender: Any, **kwargs: Any) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    count, dry_run = kwargs.get("count", 0), bool(kwargs.get("dry_run", False))
    extra = {"event": "idempotency.purged", "count": count, "dry_run": dry_run}
    logger.info("idempotency purged count=%s dry_run=%s", count, dry_run, extra=extra)


def on_unkeyed(sender: Any, operation: str, request: Any, **kwargs: Any) -> None:
    # INFO, not WARNING: while REQUIRE_KEY is False an unkeyed request is allowed; the
    # line is how a rollout sees which endpoints and callers still send none (docs/rollout.md).
    if not logger.isEnabledFor(logging.INFO):
        return
    method, path = str(getattr(request, "method", "")), str(getattr(request, "path", ""))
    extra = {"event": "idempotency.unkeyed", "operation": operation, "method": method, "path": path}
    logger.info(
        "idempotency unkeyed operation=%s method=%s path=%s", operation, method, path, extra=extra
    )


def connect() -> None:
    signals.connect_receivers(sys.modules[__name__], "idempotency.logs")
