"""What the work's outcome is recorded as, and what a repeat is answered with.

A leaf module: the protocol (``core``), the state changes (``transitions``),
the resolvers and the adapters all speak these types, and import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
