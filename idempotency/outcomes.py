"""What the work's outcome is recorded as, and what a repeat is answered with.

A leaf module: the protocol, the resolvers and the adapters all speak these
types, and import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from idempotency.models import Status


@dataclass(frozen=True)
class StoredResponse:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | None = None


@dataclass(frozen=True)
class Outcome:
    status: Status
    response: StoredResponse | None = None
    resource_id: str = ""


class Recovered(str, Enum):
    """What recovery did to a record: the ``outcome`` of ``signals.record_recovered``."""

    SUCCEEDED = "succeeded"
    RELEASED = "released"
    NEEDS_REVIEW = "needs_review"
    UNKNOWN = "unknown"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value
