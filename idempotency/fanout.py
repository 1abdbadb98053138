"""Deprecated: ``recover_everywhere`` is in ``idempotency.recovery``, ``purge_everywhere`` in
``idempotency.retention``."""

import warnings

from idempotency.recovery import recover_everywhere, total
from idempotency.retention import purge_everywhere

warnings.warn(
    "idempotency.fanout is deprecated and goes in the next release: use "
    "idempotency.recovery.recover_everywhere and idempotency.retention.purge_everywhere.",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["purge_everywhere", "recover_everywhere", "total"]
