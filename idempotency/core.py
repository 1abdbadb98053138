"""Deprecated: the protocol is ``idempotency.protocol`` (``from idempotency import execute``)."""

import warnings

from idempotency.conf import IN_FLIGHT, MODES, InFlight, Mode
from idempotency.outcomes import Outcome, StoredResponse
from idempotency.protocol import Attempt, Operation, bounded_scope
from idempotency.protocol.execute import database_unavailable, execute

warnings.warn(
    "idempotency.core is deprecated and goes in the next release: import execute, Operation "
    "and Attempt from idempotency (or idempotency.protocol).",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "IN_FLIGHT",
    "MODES",
    "Attempt",
    "InFlight",
    "Mode",
    "Operation",
    "Outcome",
    "StoredResponse",
    "bounded_scope",
    "database_unavailable",
    "execute",
]
