"""The end of an attempt: its outcome stored (``finish``), or its key given back (``release``).

Both are fenced by the attempt's owner token: an attempt that lost its lease
stores nothing (``LeaseLost``). Either wakes the duplicates waiting for the key.
"""

from __future__ import annotations

import time
from typing import Any

from idempotency import replay_cache, signals, waiting
from idempotency.exceptions import LeaseLost
from idempotency.models import IdempotencyRecord, Status
from idempotency.operation import Attempt, Operation
from idempotency.outcomes import Outcome
from idempotency.retention import retention_for


def finish(attempt: Attempt, outcome: Outcome) -> None:
    operation, response = attempt.operation, outcome.response
    values: dict[str, Any] = {
        "status": str(outcome.status),
        "response_status": response.status if response else None,
        "response_headers": [list(pair) for pair in response.headers] if response else [],
        "response_body": response.body if response else None,
        "resource_id": (outcome.resource_id or attempt.resource_id)[:255],
    }
    window = retention_for(operation.name, outcome.status)
    if not operation.store.finish(attempt.record.pk, attempt.owner_token, values, window):
        raise LeaseLost()
    replay_cache.remember_outcome(
        operation, attempt.record.pk, outcome, window, values["resource_id"], attempt.started
    )
    if operation.mode == "lease":
        waiting.durations.add(operation.name, time.monotonic() - attempt.started)
        _announce(operation)
    _completed(attempt, outcome.status)


def release(attempt: Attempt, *, delete: bool) -> None:
    """Give the key back: ``delete`` the record (nothing happened), or leave it retryable."""
    store, pk, token = attempt.operation.store, attempt.record.pk, attempt.owner_token
    if delete:
        if store.discard(pk, token):
            _announce(attempt.operation)
        return
    window = retention_for(attempt.operation.name, Status.FAILED_RETRYABLE)
    if store.release(pk, token, window):
        _announce(attempt.operation)
        _completed(attempt, Status.FAILED_RETRYABLE)


def _completed(attempt: Attempt, status: Status) -> None:
    signals.record_completed.send(
        IdempotencyRecord, record=attempt.record, operation=attempt.operation, status=status
    )


def _announce(operation: Operation) -> None:
    """Wake the duplicates waiting for this key's outcome, if any may wait."""
    if operation.wait_for > 0:
        operation.store.notify_waiters(operation.scope, operation.key)
