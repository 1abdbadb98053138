"""Where the records live, and the store that talks to that database.

``store_for(alias)`` is the one place that asks which database an alias is:
everything else asks the store.
"""

from __future__ import annotations

from functools import cache
from importlib import import_module
from importlib.util import find_spec
from typing import Any

from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, connections, router

from idempotency.conf import idempotency_settings
from idempotency.models import IdempotencyRecord
from idempotency.stores.base import (
    Candidate,
    Contention,
    Found,
    Store,
    schema,
    transaction_pooled,
)
from idempotency.stores.generic import GenericStore

__all__ = [
    "Candidate",
    "Contention",
    "Found",
    "GenericStore",
    "Store",
    "records_database",
    "schema",
    "store_for",
    "transaction_pooled",
]

# A vendor's own store, by ``connection.vendor``; any other database gets GenericStore.
VENDOR_STORES = {
    "postgresql": "idempotency.stores.postgres.PostgresStore",
    "mysql": "idempotency.stores.mysql.MySQLStore",
}


def records_database(
    using: str | None = None, *, record: IdempotencyRecord | None = None, scope: str | None = None
) -> str:
    """The alias holding the records: ``using``, else ``DATABASE``, else the router's choice.

    Always the alias writes go to (``router.db_for_write``), never the one a
    router sends reads to: every read of the protocol decides something (claim,
    replay, wait, recovery, purge, an operator's action), and a replica that
    lags would answer with a state the primary has already left. With
    ``record`` and no router, the database ``record`` was read from. The router
    is asked on every request, so one that picks a tenant's database (from a
    context variable its middleware set) puts the record beside the tenant's
    writes; it gets the request's ``scope`` as a hint too, for routers that
    shard by it.
    """
    chosen = using or idempotency_settings.DATABASE
    if chosen:
        return chosen
    hints: dict[str, object] = {"instance": record}
    if scope is not None:
        hints["scope"] = scope
    return router.db_for_write(IdempotencyRecord, **hints) or DEFAULT_DB_ALIAS


@cache
def store_for(alias: str) -> Store:
    """The store for ``alias``, made on first use and kept."""
    return _store_class(connections[alias].vendor)(alias)


def _store_class(vendor: str) -> type[Store]:
    path = VENDOR_STORES.get(vendor)
    if path is None:
        return GenericStore
    module, _, name = path.rpartition(".")
    if find_spec(module) is None:  # a vendor whose store this version does not ship
        return GenericStore
    store: type[Store] = getattr(import_module(module), name)
    return store


def _forget_stores(*, setting: str, **kwargs: Any) -> None:
    if setting == "DATABASES":
        store_for.cache_clear()


setting_changed.connect(_forget_stores)
