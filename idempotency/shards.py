"""Which databases and schemas hold records, and the namespace of the records' connection.

A project that splits its data by tenant keeps each tenant's records beside its
writes: a database per tenant behind a router, or a PostgreSQL schema per tenant
(django-tenants, which switches a connection's ``search_path`` and says so in
``connection.schema_name``). Nothing kept outside the database (the replay
cache's keys, the ``LISTEN`` channels) may then be shared between two
namespaces, and recovery and purge must visit each of them: this module names
them. It knows django-tenants only by the attributes its connections and
settings carry, and imports it only where those say it is in use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from importlib import import_module
from typing import Any, TypeVar

from django.conf import settings
from django.db import connections, router

from idempotency.conf import idempotency_settings
from idempotency.models import IdempotencyRecord
from idempotency.progress import OnProgress, Progress
from idempotency.stores import records_database, schema

__all__ = [
    "Shard",
    "namespace",
    "record_databases",
    "in_every_shard",
    "schema",
    "shards",
]


def namespace(alias: str) -> str:
    """What tells the records' connection apart: the alias, and its schema where it has one.

    Only the alias where there is no schema, so that what was keyed by the
    alias before (replay cache entries) keeps its key.
    """
    current = schema(alias)
    return alias if current is None else f"{alias}/{current}"


@dataclass(frozen=True)
class Shard:
    """One place records live: a database alias, and a schema in it where there are schemas."""

    alias: str
    schema: str | None = None

    @property
    def label(self) -> str:
        return self.alias if self.schema is None else f"{self.alias}/{self.schema}"

    @contextmanager
    def active(self) -> Iterator[None]:
        """The alias' connection switched to this shard's schema, and back afterwards."""
        connection: Any = connections[self.alias]
        if self.schema is None or connection.schema_name == self.schema:
            yield
            return
        previous = connection.tenant
        connection.set_schema(self.schema)
        try:
            yield
        finally:
            connection.set_tenant(previous)


def record_databases(database: str | None = None) -> list[str]:
    """The aliases that hold records, for recovery and purge.

    ``database`` alone if given; else ``SHARDS``; else ``DATABASE``; else, with
    database routers, every alias they let the app migrate to (a router per
    tenant database says so in ``allow_migrate``); else the records' one alias.
    """
    if database is not None:
        return [database]
    if idempotency_settings.SHARDS:
        return list(idempotency_settings.SHARDS)
    if idempotency_settings.DATABASE or not settings.DATABASE_ROUTERS:
        return [records_database()]
    allowed = [
        alias
        for alias in connections
        if not _mirror(alias) and router.allow_migrate_model(alias, IdempotencyRecord)
    ]
    return allowed or [records_database()]


def shards(database: str | None = None) -> list[Shard]:
    """Every shard of ``record_databases(database)``: each schema that holds records, each alias."""
    return [
        Shard(alias, name)
        for alias in record_databases(database)
        for name in _schemas(alias) or (None,)
    ]


def _mirror(alias: str) -> bool:
    # A test database that mirrors another one is that one (Django's TEST["MIRROR"]).
    return bool(connections.settings[alias].get("TEST", {}).get("MIRROR"))


def _schemas(alias: str) -> list[str]:
    """The schemas of ``alias`` holding records under django-tenants; none without schemas.

    On a tenant's schema (``tenant_command``, ``all_tenants_command``, a task
    run for one tenant) that schema only; on the public schema, every schema
    that has the app: the public one if it is in ``SHARED_APPS``, each tenant's
    if it is in ``TENANT_APPS``.
    """
    current = schema(alias)
    if current is None:
        return []
    utils = import_module("django_tenants.utils")
    public = utils.get_public_schema_name()
    if current != public:
        return [current]
    names = [public] if _lists_app("SHARED_APPS") else []
    if _lists_app("TENANT_APPS"):
        tenants = utils.get_tenant_model().objects.using(alias).exclude(schema_name=public)
        names += list(tenants.order_by("schema_name").values_list("schema_name", flat=True))
    return names


def _lists_app(setting: str) -> bool:
    return any(
        entry == "idempotency" or entry.startswith("idempotency.apps.")
        for entry in getattr(settings, setting, ())
    )


T = TypeVar("T")


def in_every_shard(
    service: Callable[..., T],
    database: str | None,
    progress: OnProgress | None,
    options: dict[str, Any],
) -> list[tuple[Shard, T]]:
    """``service`` (a recovery or purge pass) run in each shard in turn, switched to it.

    ``progress`` gets each shard's ``Progress``, with the shard's label where there are several.
    """
    visited, done = shards(database), []
    for shard in visited:
        with shard.active():
            report = _labelled(progress, shard, visited)
            done.append((shard, service(database=shard.alias, progress=report, **options)))
    return done


def _labelled(progress: OnProgress | None, shard: Shard, visited: list[Shard]) -> OnProgress | None:
    if progress is None or len(visited) == 1:
        return progress

    def told(current: Progress) -> None:
        progress(replace(current, shard=shard.label))

    return told
