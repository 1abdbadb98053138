"""Deprecated: the guard is in ``idempotency.protocol.execute`` (``writes_only_to``)."""

import warnings

from idempotency.exceptions import CrossDatabaseWrite
from idempotency.protocol.execute import writes_only_to

warnings.warn(
    "idempotency.write_guard is deprecated and goes in the next release: use "
    "idempotency.protocol.execute.",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["CrossDatabaseWrite", "writes_only_to"]
