"""Deprecated: an operator's resolution is in ``idempotency.recovery``."""

import warnings

from idempotency.recovery import (
    NOT_RESOLVABLE,
    Change,
    ResolutionReport,
    mark_records,
    run_resolvers,
)

warnings.warn(
    "idempotency.resolution is deprecated and goes in the next release: import "
    "mark_records and run_resolvers from idempotency (or idempotency.recovery).",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["NOT_RESOLVABLE", "Change", "ResolutionReport", "mark_records", "run_resolvers"]
