"""A primary/replica router as projects write them: reads from the replica, writes to the primary.

Sessions, users and content types are read from the primary, as such routers
usually pin them (a login must not depend on the replica's lag); every other
model, the idempotency records included, is read from ``replica``.
"""

from __future__ import annotations

from typing import Any

PINNED = frozenset({"sessions", "auth", "contenttypes", "admin"})


class PrimaryReplicaRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "default" if model._meta.app_label in PINNED else "replica"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == "default"
