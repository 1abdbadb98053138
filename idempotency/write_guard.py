"""Deprecated: the guard is ``idempotency.protocol.write_guard``."""

import warnings

from idempotency.protocol.write_guard import CrossDatabaseWrite, writes_only_to

warnings.warn(
    "idempotency.write_guard is deprecated and goes in the next release: use "
    "idempotency.protocol.write_guard.",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["CrossDatabaseWrite", "writes_only_to"]
