"""READ_FIRST: answer a repeat from a plain read, before any transaction opens.

Reading first saves a replay the claim's transaction (``BEGIN``, the claim,
``COMMIT``: three round trips for one) and costs a first request one read
more; ``ReplayShare`` tells, per operation, when that pays ("auto").
"""

from __future__ import annotations

from idempotency.conf import idempotency_settings
from idempotency.models import IdempotencyRecord
from idempotency.operation import Operation


class ReplayShare:
    """The share of replays among an operation's requests, in this process (READ_FIRST "auto").

    An exponentially weighted mean over about the last ``1 / WEIGHT`` requests
    of each operation. Reading first pays once replays are about a third of
    the requests (``THRESHOLD``); below that first requests pay nothing.
    Updated without a lock: a lost update only nudges a heuristic.
    """

    WEIGHT = 1 / 32
    THRESHOLD = 1 / 3
    # Operation names come from code, so they are few; a project that makes them
    # up per request must not grow this dict without bound.
    MAX_OPERATIONS = 1024

    def __init__(self) -> None:
        self._shares: dict[str, float] = {}

    def seen(self, name: str, *, replayed: bool) -> None:
        share = self._shares.get(name)
        if share is None:
            if len(self._shares) >= self.MAX_OPERATIONS:
                self._shares = {}
            share = 0.0
        self._shares[name] = share + ((1.0 if replayed else 0.0) - share) * self.WEIGHT

    def high(self, name: str) -> bool:
        return self._shares.get(name, 0.0) >= self.THRESHOLD


replay_share = ReplayShare()


def read_first(operation: Operation) -> IdempotencyRecord | None:
    """Atomic mode: a final record of this very request, read before any transaction opens.

    Only a ``SUCCEEDED`` or ``FAILED_FINAL`` record (they never change) whose
    request hash matches is answered from the read; anything else (no
    record, one in flight or retryable, another body: 422) takes the claim's
    path as without it, so the unique constraint and the row lock still
    decide every first request and every conflict.
    """
    policy = idempotency_settings.READ_FIRST
    if policy == "never" or (policy == "auto" and not replay_share.high(operation.name)):
        return None
    record = operation.store.read_final(operation.scope, operation.key)
    if record is None or record.request_hash != operation.request_hash:
        return None
    return record
