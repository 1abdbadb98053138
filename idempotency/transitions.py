"""Deprecated: the record's moves are ``idempotency.protocol.states``."""

import warnings

from idempotency.protocol.states import can_transition, postpone, transition

warnings.warn(
    "idempotency.transitions is deprecated and goes in the next release: use "
    "idempotency.protocol.states (transition, postpone, can_transition).",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["can_transition", "postpone", "transition"]
