"""``IdempotentTask``: a Celery task base class that runs each task once per key.

A duplicate that arrives while the first run still holds the key is retried by
Celery later; a key reused with other arguments, or one whose first run waits for
an operator (``KeyUnderReview``), fails once, without retries; every other repeat
gets the first run's result. Only this module and
``idempotency.tasks`` import Celery: ``import idempotency`` never needs it.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from celery import Task
from django.core.exceptions import ImproperlyConfigured

from idempotency import steps
from idempotency.exceptions import DatabaseUnavailable, KeyInUse, KeyReused, KeyUnderReview
from idempotency.functions import CallGuard
from idempotency.operations import declare
from idempotency.options import options_from_attributes
from idempotency.resolvers import register

if TYPE_CHECKING:
    from idempotency.protocol import Attempt


class IdempotentTask(Task):
    """Use as ``@shared_task(base=IdempotentTask, idempotency_key=...)``.

    Its options are those of ``@idempotent_function`` (``idempotency.options``),
    as task options named ``idempotency_<option>``; the operation is the task's
    name, and so is the scope unless ``idempotency_scope`` says otherwise.
    """

    # Celery logs an expected error at INFO, without a traceback: the
    # ``idempotency`` logger's one warning (``key_reused``, ``under_review``) is the report.
    # Neither is retried: no wait mends them (a record under review waits for an operator).
    throws: tuple[type[BaseException], ...] = (KeyReused, KeyUnderReview)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _refuse_shadowing(cls)
        for ours in (KeyReused, KeyUnderReview):  # a task's own ``throws`` adds to ours
            if not any(issubclass(ours, expected) for expected in cls.throws):
                cls.throws = (*cls.throws, ours)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        # Runs when the worker loads the task: a missing key or an unknown option fails
        # at start-up, and recovery, in any worker, finds the resolver under its name.
        super().on_bound(app)
        if not cls.name:
            return
        options = options_from_attributes("IdempotentTask", cls)
        if options.key is None:
            raise ImproperlyConfigured(
                f"Task {cls.name} uses IdempotentTask: give it idempotency_key=, a function "
                "of the task's arguments that returns the key."
            )
        declare(cls.name)
        if options.resolver is not None:
            register(cls.name, options.resolver)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = super().__call__
        try:
            return self._idempotency.run(lambda: run(*args, **kwargs), args, kwargs)
        except (KeyInUse, DatabaseUnavailable) as error:
            # The first run holds the key, or the database failed and nothing was
            # recorded: ask again when it may be done, at most ``max_retries`` times;
            # past that Celery fails the task with this error.
            raise self.retry(countdown=error.retry_after, exc=error) from error

    @property
    def idempotency(self) -> Attempt:
        """The running attempt (``bind=True`` tasks: ``self.idempotency.step_key("charge")``)."""
        return cast("Attempt", steps.current())

    @cached_property
    def _idempotency(self) -> CallGuard:
        options = options_from_attributes("IdempotentTask", type(self), operation=self.name)
        return CallGuard(
            name=self.name,
            signature=inspect.signature(self.run),
            options=replace(options, scope=options.scope or self.name),
        )


def _refuse_shadowing(task: type) -> None:
    """Refuse a base ahead of ``IdempotentTask`` whose ``__call__`` would run the task itself.

    ``class T(ContextTask, IdempotentTask)`` with the common ``ContextTask.__call__``
    that calls ``self.run(...)`` inside an application context never reaches ours:
    every delivery would run. Put first, ``IdempotentTask`` wraps whatever the other
    ``__call__`` does, cooperative or not, so every base ahead of it is refused.
    """
    mro = task.__mro__
    ahead = mro[: mro.index(IdempotentTask)]
    shadowing = [k for k in ahead if "__call__" in vars(k) and not issubclass(k, IdempotentTask)]
    if shadowing:
        raise ImproperlyConfigured(
            f"{task.__module__}.{task.__qualname__}: {shadowing[0].__qualname__}.__call__ comes "
            "before IdempotentTask.__call__ among its bases, so a delivery could run the task "
            f"unprotected. Put IdempotentTask first: class {task.__name__}(IdempotentTask, "
            f"{shadowing[0].__name__})."
        )
