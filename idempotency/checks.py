"""System checks of the deployment around the ``IDEMPOTENCY`` setting.

The setting's own values are validated by ``idempotency.settings_checks``
(ids ``idempotency.E001``...), which the protocol also runs on first use. What
is checked here depends on the rest of the deployment: the records' database
(its ``ATOMIC_REQUESTS``, its session clock, a pooler in front of it), the
views of the URLconf, the replay cache. Only system checks import this module.
"""

from __future__ import annotations

import difflib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import import_module
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Info, Tags, Warning, register
from django.db import DatabaseError
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils.module_loading import module_has_submodule

from idempotency.compat import non_atomic_aliases
from idempotency.conf import DEFAULTS, idempotency_settings
from idempotency.operations import declared
from idempotency.settings_checks import closest, settings_messages
from idempotency.shards import record_databases
from idempotency.stores import clusters, records_database, store_for, transaction_pooled
from idempotency.unmigrated import missing_per_shard

logger = logging.getLogger("idempotency")


@register(Tags.compatibility)
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """The setting's values, then (once they are valid) what they mean for this deployment."""
    messages = [*_misspelled_setting_names(), *_exception_handler_without_error_format()]
    messages += settings_messages(getattr(settings, "IDEMPOTENCY", {}))
    if any(message.is_serious() for message in messages):
        return messages
    return [
        *messages,
        *_lease_mode_under_atomic_requests(),
        *_replay_cache(),
        *_pooling(),
        *_retryable_shorter_than_step_keys(),
    ]


SETTING = "IDEMPOTENCY"


def _misspelled_setting_names() -> list[CheckMessage]:
    # Django ignores a setting nobody reads: IDEMPOTENTCY = {...} would silently leave
    # every default in force (keys required, atomic mode), whatever it says.
    return [_misspelled(name) for name in dir(settings) if _looks_like_ours(name)]


# Names of the library's own that a settings module holds by import, as docs/operations-tasks.md
# shows (``from idempotency.beat import IDEMPOTENCY_BEAT_SCHEDULE``): no misspelling.
_IMPORTED_NAMES = frozenset({"IDEMPOTENCY_BEAT_SCHEDULE"})


def _looks_like_ours(name: str) -> bool:
    if name == SETTING or name in _IMPORTED_NAMES or not name.isupper():
        return False
    return "IDEMPOT" in name or bool(difflib.get_close_matches(name, [SETTING], cutoff=0.8))


def _misspelled(name: str) -> CheckMessage:
    # IDEMPOTENCY_HEADER = ...: one flat setting of the dict's, written as Django's own are.
    suffix = name.partition("_")[2] if name.startswith("IDEMPOT") else ""
    # Close only: IDEMPOTENCY_SETTINGS or _CONFIG name the dict itself, not a key of it.
    keys = difflib.get_close_matches(suffix, list(DEFAULTS), n=1, cutoff=0.85)
    key = keys[0] if keys else None
    if key is not None:
        fix = f"Move it into the dict: IDEMPOTENCY = {{{key!r}: ...}}."
    else:
        fix = f"Rename it to {SETTING} (a dict: {SETTING} = {{...}})."
    ours = hasattr(settings, SETTING)
    return Warning(
        f"The setting {name} is not read by django-idempotency, which reads {SETTING} only: "
        f"what {name} says is never applied"
        + ("." if ours else f", and with no {SETTING} every default is in force."),
        hint=f"{fix} If {name} is another app's setting, add 'idempotency.W008' to "
        "SILENCED_SYSTEM_CHECKS.",
        id="idempotency.W008",
    )


# DRF's own handler, and the library's (DRF's plus the 503 of an outage): a project that
# names one of them has not chosen an error shape of its own.
_DEFAULT_HANDLERS = frozenset(
    {"rest_framework.views.exception_handler", "idempotency.drf.exception_handler"}
)


def _exception_handler_without_error_format() -> list[CheckMessage]:
    # A project with its own handler has chosen how its API's errors look; problem+json
    # answers from this library would be a second shape, unless that is a choice too.
    user = getattr(settings, SETTING, None)
    if isinstance(user, Mapping) and "ERROR_FORMAT" in user:
        return []  # chosen, "problem" included
    framework = getattr(settings, "REST_FRAMEWORK", None)
    handler = framework.get("EXCEPTION_HANDLER") if isinstance(framework, Mapping) else None
    if handler is None or _dotted_path(handler) in _DEFAULT_HANDLERS:
        return []
    return [
        Info(
            f"REST_FRAMEWORK['EXCEPTION_HANDLER'] is {_dotted_path(handler)!r}, but "
            "django-idempotency answers its errors (400 without a key, 409, 422, 503) as "
            "application/problem+json, not through it: two error shapes in one API.",
            hint="Set IDEMPOTENCY['ERROR_FORMAT'] = 'drf' to have your handler render them "
            "too, or IDEMPOTENCY['ERROR_FORMAT'] = 'problem' to keep problem+json as a "
            "choice (docs/drf.md, 'One error shape for the API').",
            id="idempotency.I001",
        )
    ]


def _dotted_path(handler: object) -> str:
    if isinstance(handler, str):
        return handler
    module, name = getattr(handler, "__module__", ""), getattr(handler, "__qualname__", "")
    return f"{module}.{name}" if module and name else repr(handler)


@register(Tags.urls)
def check_views(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    return _lease_views_under_atomic_requests()


# What a setting that names operations loses for a name no operation has.
_NAMING_SETTINGS = {
    "OPERATION_RETENTION": "its windows never apply: the records keep RETENTION's",
    "RESOLVERS": "no record is ever given that resolver: lost leases go to review",
}


@register(Tags.urls)
def check_operation_names(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Each operation ``OPERATION_RETENTION`` and ``RESOLVERS`` name is one the project declares.

    A typo there is silent otherwise: the default windows apply, no resolver is asked.
    """
    user = getattr(settings, SETTING, None)
    if not isinstance(user, Mapping) or any(m.is_serious() for m in settings_messages(user)):
        return []  # check_settings reports what is wrong with the dict itself
    named = [(setting, name) for setting in _NAMING_SETTINGS for name in user.get(setting, {})]
    if not named:
        return []
    try:
        get_resolver().url_patterns  # noqa: B018 - importing the views declares theirs
    except Exception:
        return []  # Django's own URL checks report a URLconf that does not import
    if any(name not in declared() for _, name in named):
        _load_task_modules()  # only then: tasks are the last place a name can come from
    known = declared()
    return [
        _unknown_operation(setting, name, known) for setting, name in named if name not in known
    ]


# The task frameworks a project that has tasks has loaded by now: Celery (its celery.py,
# imported from the project's __init__), Django's tasks (6.0+) or their backport.
_TASK_FRAMEWORKS = ("celery", "django.tasks", "django_tasks")


def _load_task_modules() -> None:
    # Tasks are declared once their modules are imported: each app's tasks module, as
    # Celery's Django autodiscovery imports it (this app's own holds no operation). Celery
    # makes the tasks themselves when its app is finalized.
    if not any(name in sys.modules for name in _TASK_FRAMEWORKS):
        return
    for config in apps.get_app_configs():
        if config.name == "idempotency" or not module_has_submodule(config.module, "tasks"):
            continue
        try:
            import_module(f"{config.name}.tasks")
        except Exception:
            logger.warning("idempotency.W009 could not import %s.tasks", config.name, exc_info=True)
    if "celery" in sys.modules:
        try:
            from celery import current_app

            current_app.tasks  # noqa: B018 - finalizing binds each IdempotentTask: it declares
        except Exception:
            logger.warning("idempotency.W009 could not finalize the Celery app", exc_info=True)


def _unknown_operation(setting: str, name: str, known: frozenset[str]) -> CheckMessage:
    meant = closest(name, known)
    hint = f"Did you mean {meant!r}? " if meant is not None else ""
    return Warning(
        f"IDEMPOTENCY[{setting!r}] names the operation {name!r}, which no view, function or "
        f"task of the project declares: {_NAMING_SETTINGS[setting]}.",
        hint=hint
        + "An operation is named by its operation= option (idempotency_operation on a DRF "
        "view), else <module>.<function> for a view or function, <module>.<Class>.<action> "
        "for a DRF view, and the task's name for a task (docs/checks.md). A name made at "
        "run time (get_idempotency_operation, Operation(name=...)): add 'idempotency.W009' "
        "to SILENCED_SYSTEM_CHECKS.",
        id="idempotency.W009",
    )


@register(Tags.database)
def check_database(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """Run by ``migrate`` and ``check --database``: these checks ask the database."""
    asked = set(databases or ())
    messages = [
        message for alias in record_databases() if alias in asked for message in _migrated(alias)
    ]
    alias = records_database()
    if alias in asked:
        messages += _session_time_zone(alias)
        messages += _cluster(alias)
    return messages


def _atomic_requests(alias: str) -> bool:
    return bool(settings.DATABASES.get(alias, {}).get("ATOMIC_REQUESTS"))


def _lease_mode_under_atomic_requests() -> list[CheckMessage]:
    # The request's transaction would hold the claim until the response: lease mode
    # would silently become atomic mode, its lease and fencing of no use.
    alias = records_database()
    if idempotency_settings.MODE != "lease" or not _atomic_requests(alias):
        return []
    return [
        Warning(
            f"IDEMPOTENCY['MODE'] is 'lease' but DATABASES[{alias!r}]['ATOMIC_REQUESTS'] is "
            "True: each claim would commit only with its request, as in atomic mode.",
            hint="Decorate the protected views with @transaction.non_atomic_requests (a "
            "lease-mode request in a request transaction raises ImproperlyConfigured), "
            "or leave MODE at 'atomic'.",
            id="idempotency.W001",
        )
    ]


def _lease_views_under_atomic_requests() -> list[CheckMessage]:
    # What W001 says of a global MODE, for each view that sets mode="lease" itself:
    # its first request would raise ImproperlyConfigured (a 500).
    alias = records_database()
    if not _atomic_requests(alias):
        return []
    messages: list[CheckMessage] = []
    try:
        patterns = get_resolver().url_patterns
    except Exception:
        return []  # Django's own URL checks report a URLconf that does not import
    for route, callback in _url_callbacks(patterns, ""):
        if alias in non_atomic_aliases(callback):
            continue
        for name in _lease_handlers(callback):
            messages.append(
                Error(
                    f"{name} (URL {route or '/'}) runs in lease mode, but "
                    f"DATABASES[{alias!r}]['ATOMIC_REQUESTS'] is True: its claim would only "
                    "commit with the whole request, and each request raises "
                    "ImproperlyConfigured.",
                    hint="Decorate the view with @transaction.non_atomic_requests (outermost, "
                    "above @api_view or on the viewset's as_view()), or use atomic mode.",
                    id="idempotency.E031",
                )
            )
    return messages


def _url_callbacks(
    patterns: Sequence[URLPattern | URLResolver], prefix: str
) -> Iterator[tuple[str, Callable[..., Any]]]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _url_callbacks(pattern.url_patterns, route)
        else:
            yield route, pattern.callback


def _lease_handlers(callback: Callable[..., Any]) -> Iterator[str]:
    """The names of the lease-mode handlers a URL's view function serves."""
    candidates: list[Any] = [callback]
    view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if view_class is not None:
        candidates += [getattr(view_class, method, None) for method in ("post", "put", "patch")]
        candidates += [getattr(view_class, action, None) for action in _actions(callback)]
        if getattr(view_class, "idempotency_mode", None) == "lease":
            yield view_class.__qualname__
    for candidate in list(candidates):
        # What a wrapper closes over: DRF's @api_view handler calls the function given,
        # a django-ninja path view holds its operations.
        for cell in getattr(candidate, "__closure__", None) or ():
            inner = cell.cell_contents
            candidates.append(inner)
            candidates += [
                getattr(op, "view_func", None) for op in getattr(inner, "operations", ())
            ]
    for handler in candidates:
        options = getattr(handler, "idempotency_options", None)
        if getattr(options, "mode", None) == "lease":
            yield getattr(handler, "__qualname__", repr(handler))


def _actions(callback: Callable[..., Any]) -> list[str]:
    actions = getattr(callback, "actions", None)  # a DRF viewset's {method: action}
    return [str(action) for action in actions.values()] if isinstance(actions, dict) else []


def _migrated(alias: str) -> list[CheckMessage]:
    # A Warning, not an Error: ``migrate`` runs this check first, and an error would stop the
    # very command that mends it.
    try:
        missing = missing_per_shard(alias)
    except DatabaseError:
        return []  # Django's own checks report a database that cannot be reached
    return [
        Warning(
            f"The idempotency records table of DATABASES[{alias!r}]"
            + (f", schema {shard.schema!r}," if shard.schema else "")
            + f" is not migrated ({what}): each protected request there is a server error.",
            hint=f"Run `manage.py migrate idempotency --database {alias}`"
            + (" (django-tenants: migrate_schemas)." if shard.schema else "."),
            id="idempotency.W007",
        )
        for shard, what in missing.items()
    ]


def _session_time_zone(alias: str) -> list[CheckMessage]:
    try:
        clock = store_for(alias).clock_offset()
    except DatabaseError:
        return []  # Django's own checks report a database that cannot be reached
    if clock is None or not clock[1]:
        return []
    zone, offset = clock
    return [
        Warning(
            f"The session time zone of DATABASES[{alias!r}] is {zone!r}, {offset} seconds off "
            "UTC: lease ends and the purge's cut-off, computed by the database clock, would be "
            "off by as much (leases seen as expired, fresh records purged).",
            hint="Add 'init_command': \"SET time_zone = '+00:00'\" to the alias's OPTIONS "
            "(docs/databases.md).",
            id="idempotency.W003",
        )
    ]


def _cluster(alias: str) -> list[CheckMessage]:
    """What the cluster the records' database is part of cannot keep (docs/high-availability.md)."""
    try:
        replication = clusters.replication(alias)
        galera = clusters.galera(alias)
    except DatabaseError:
        return []  # Django's own checks report a database that cannot be reached
    messages: list[CheckMessage] = []
    if replication and replication.standbys and not replication.synchronous and _lease_mode():
        messages.append(_asynchronous_standbys(alias, replication.standbys))
    if galera and galera.size > 1:
        messages.append(_several_writers(alias, galera))
    return messages


def _lease_mode() -> bool:
    """Lease mode is used: the default ``MODE``, or a view of the URLconf that sets it."""
    if idempotency_settings.MODE == "lease":
        return True
    try:
        patterns = get_resolver().url_patterns
    except Exception:
        return False  # Django's own URL checks report a URLconf that does not import
    return any(next(_lease_handlers(view), None) for _, view in _url_callbacks(patterns, ""))


def _asynchronous_standbys(alias: str, standbys: int) -> CheckMessage:
    # Atomic mode loses a record with its business writes, and the retry makes them again;
    # lease mode's work has effects outside the database, which a lost claim or step runs again.
    return Warning(
        f"DATABASES[{alias!r}] is a PostgreSQL primary streaming to {standbys} "
        f"standby{'s' if standbys != 1 else ''}, none synchronous: a failover can lose "
        "commits it acknowledged. Lease-mode work whose claim, recorded steps or outcome were "
        "lost runs again on the retry, and what it did outside the database (a provider's "
        "charge) happens twice, under other step keys if the attempt's were lost with it.",
        hint="Commit synchronously: Patroni's synchronous_mode (and synchronous_mode_strict, "
        "to lose nothing when no standby is left), or synchronous_standby_names; or keep "
        "what must not run twice in atomic mode (docs/high-availability.md).",
        id="idempotency.W011",
    )


def _several_writers(alias: str, galera: clusters.Galera) -> CheckMessage:
    seen = (
        f" This node has seen {galera.conflicts} certification failures or aborts by other "
        "nodes' writes: they are written to."
        if galera.conflicts
        else ""
    )
    return Warning(
        f"DATABASES[{alias!r}] is a node of a Galera cluster of {galera.size} nodes. If "
        "servers write records through more than one node, duplicates sent to different "
        "nodes each claim the key (row locks and the claim's GET_LOCK turn hold on one node "
        "only) and each run the view; the cluster commits one, and what a view does outside "
        f"the database happens again.{seen}",
        hint="Send every server's writes to one node (a proxy with one writer, or a "
        "connection string naming one node), then add 'idempotency.W012' to "
        "SILENCED_SYSTEM_CHECKS to say so (docs/high-availability.md).",
        id="idempotency.W012",
    )


# Caches whose entries live in one process: an operator's change, made in
# another process, could not reach them.
_PROCESS_LOCAL_CACHES = (
    "django.core.cache.backends.locmem.LocMemCache",
    "django.core.cache.backends.dummy.DummyCache",
)


def _retryable_shorter_than_step_keys() -> list[CheckMessage]:
    # A step key lives as long as its record: a retryable record that expires before the
    # provider forgets its keys is replaced by the next retry, with a new seed, so the
    # provider gets new keys and does the work again while it would have answered the old.
    window = idempotency_settings.STEP_KEY_WINDOW
    if window is None:
        return []
    windows = {"['RETENTION']": idempotency_settings.RETENTION}
    windows.update(
        (f"['OPERATION_RETENTION'][{operation!r}]", overrides)
        for operation, overrides in idempotency_settings.OPERATION_RETENTION.items()
    )
    return [
        Warning(
            f"IDEMPOTENCY{name}['FAILED_RETRYABLE'] is {kept:g} seconds, shorter than "
            f"STEP_KEY_WINDOW ({window:g} seconds): a retry after that gets new step keys, "
            "and a provider that still remembers the old ones (Stripe: for 24 hours) does the "
            "work again.",
            hint=f"Keep retryable records at least {window:g} seconds, or set STEP_KEY_WINDOW "
            "to your providers' shortest idempotency window (None if no operation sends "
            "step keys; docs/downstream.md, 'How long a step key lives').",
            id="idempotency.W010",
        )
        for name, overrides in windows.items()
        if (kept := overrides.get("FAILED_RETRYABLE")) is not None and kept < window
    ]


def _replay_cache() -> list[CheckMessage]:
    alias = idempotency_settings.REPLAY_CACHE
    backend = settings.CACHES[alias].get("BACKEND", "") if alias is not None else ""
    if backend not in _PROCESS_LOCAL_CACHES:
        return []
    return [
        Warning(
            f"IDEMPOTENCY['REPLAY_CACHE'] should name a cache shared by every process, "
            f"not {backend}.",
            hint="An operator's change in one process could not reach the others' "
            "entries: use Redis, Memcached or the database cache.",
            id="idempotency.W002",
        )
    ]


def _pooling() -> list[CheckMessage]:
    """Behind a pooler in transaction mode, what must not outlive a transaction."""
    alias = records_database()
    if not transaction_pooled(alias):
        return []
    database = settings.DATABASES.get(alias, {})
    messages: list[CheckMessage] = []
    if not database.get("DISABLE_SERVER_SIDE_CURSORS"):
        messages.append(_server_side_cursors(alias))
    options = database.get("OPTIONS") or {}
    if options.get("server_side_binding") is True and options.get("prepare_threshold") is not None:
        messages.append(_prepared_statements(alias, options["prepare_threshold"]))
    return messages


def _server_side_cursors(alias: str) -> CheckMessage:
    return Warning(
        f"IDEMPOTENCY['TRANSACTION_POOLING'] is True but DATABASES[{alias!r}]"
        "['DISABLE_SERVER_SIDE_CURSORS'] is not: behind a pooler in transaction mode, "
        "QuerySet.iterator() would open a cursor on a server connection the next "
        "transaction may not get.",
        hint=f"Set DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] = True.",
        id="idempotency.W005",
    )


def _prepared_statements(alias: str, threshold: object) -> CheckMessage:
    return Warning(
        f"DATABASES[{alias!r}] prepares statements (server_side_binding with "
        f"prepare_threshold {threshold!r}) behind a pooler in transaction mode: a "
        "statement prepared on one server connection is unknown to the next.",
        hint="Remove prepare_threshold from OPTIONS (Django's default: nothing is "
        "prepared), or run PgBouncer 1.21 or later with max_prepared_statements > 0.",
        id="idempotency.W006",
    )
