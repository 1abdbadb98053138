"""``IdempotentTask``: a Celery task base class that runs each task once per key.

A duplicate that arrives while the first run still holds the key is retried by
Celery later; a key reused with other arguments fails once, without retries;
every other repeat gets the first run's result. Only this module and
``idempotency.tasks`` import Celery: ``import idempotency`` never needs it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection
from functools import cached_property
from typing import Any

from celery import Task
from django.core.exceptions import ImproperlyConfigured

from idempotency.core import InFlight, Mode
from idempotency.exceptions import DatabaseUnavailable, KeyInUse, KeyReused
from idempotency.functions import ArgsTo, CallGuard
from idempotency.resolvers import ResolverSpec, register


class IdempotentTask(Task):
    """Use as ``@shared_task(base=IdempotentTask, idempotency_key=...)``.

    The ``idempotency_*`` task options are those of ``@idempotent_function``;
    the operation is the task's name, and so is the scope unless
    ``idempotency_scope`` says otherwise.
    """

    idempotency_key: ArgsTo | None = None
    idempotency_scope: str | ArgsTo | None = None
    idempotency_fingerprint: Callable[..., Any] | None = None
    idempotency_fields: Collection[str] | None = None
    idempotency_exclude: Collection[str] = ()
    idempotency_mode: Mode | None = None
    idempotency_lease_seconds: float | None = None
    idempotency_lock_timeout: float | None = None
    idempotency_in_flight: InFlight | None = None
    idempotency_resolver: ResolverSpec | None = None

    # Celery logs an expected error at INFO, without a traceback: the
    # ``idempotency`` logger's one warning (``key_reused``) is the report.
    throws: tuple[type[BaseException], ...] = (KeyReused,)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not any(issubclass(KeyReused, expected) for expected in cls.throws):
            cls.throws = (*cls.throws, KeyReused)  # a task's own ``throws`` adds to ours

    @classmethod
    def on_bound(cls, app: Any) -> None:
        # Runs when the worker loads the task: a missing key fails at start-up, and
        # recovery, in any worker, finds the resolver under the task's name.
        super().on_bound(app)
        if cls.name and _option(cls, "idempotency_key") is None:
            raise ImproperlyConfigured(
                f"Task {cls.name} uses IdempotentTask: give it idempotency_key=, a function "
                "of the task's arguments that returns the key."
            )
        resolver = _option(cls, "idempotency_resolver")
        if cls.name and resolver is not None:
            register(cls.name, resolver)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = super().__call__
        try:
            return self._idempotency.run(lambda: run(*args, **kwargs), args, kwargs)
        except (KeyInUse, DatabaseUnavailable) as error:
            # The first run holds the key, or the database failed and nothing was
            # recorded: ask again when it may be done, at most ``max_retries`` times;
            # past that Celery fails the task with this error.
            raise self.retry(countdown=error.retry_after, exc=error) from error

    @cached_property
    def _idempotency(self) -> CallGuard:
        return CallGuard(
            name=self.name,
            scope=_option(self, "idempotency_scope") or self.name,
            key=_option(self, "idempotency_key"),
            signature=inspect.signature(self.run),
            fingerprint=_option(self, "idempotency_fingerprint"),
            fields=self.idempotency_fields,
            exclude=self.idempotency_exclude,
            mode=self.idempotency_mode,
            lease_seconds=self.idempotency_lease_seconds,
            lock_timeout=self.idempotency_lock_timeout,
            in_flight=self.idempotency_in_flight,
            resolver=_option(self, "idempotency_resolver"),
        )


def _option(task: Any, name: str) -> Any:
    # Task options become class attributes: read a function as given, not as a method.
    value = inspect.getattr_static(task, name)
    return value.__func__ if isinstance(value, staticmethod) else value
