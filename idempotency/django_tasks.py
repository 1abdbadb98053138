"""``@idempotent_task``: a ``django.tasks`` task that runs once per key.

Put it under ``@task()``::

    @task()
    @idempotent_task(key=lambda payout_id, **_: payout_id)
    def pay_out(payout_id: str, amount: int) -> dict: ...

Every enqueue of the same intent, and every run again of one task result, has
one effect; each later run returns the first run's result (its JSON form, which
is what ``TaskResult.return_value`` shows for every run). Django 6 has the
framework built in (``django.tasks``); Django 5.2 takes the ``django-tasks``
backport (``pip install "django-idempotency[tasks]"``). Only this module and
``idempotency.django_tasks_jobs`` import it: ``import idempotency`` never needs it.

``requeue_lost_tasks`` puts the protected tasks that django-tasks-db left
``RUNNING`` when their worker died back in its queue.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import async_to_sync, sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone
from django.utils.module_loading import import_string

from idempotency import steps
from idempotency.functions import CallGuard
from idempotency.options import IdempotencyOptions, refuse_unknown

if TYPE_CHECKING:
    from django.tasks import Task, TaskContext
    from typing_extensions import Unpack

    from idempotency.options import OptionArgs
    from idempotency.protocol import Attempt
else:
    # The framework django-tasks-db and the other backends use: Django's own where it
    # has one (6.0+), else the backport. Both define the same classes.
    try:
        from django.tasks import Task, TaskContext
    except ImportError:
        try:
            from django_tasks.base import Task, TaskContext
        except ImportError as error:
            raise ImportError(
                "idempotency.django_tasks needs Django's tasks framework: Django 6 has it "
                "(django.tasks); on Django 5.2 install the backport with "
                'pip install "django-idempotency[tasks]".'
            ) from error

__all__ = ["IdempotentTaskContext", "WorkerLost", "idempotent_task", "requeue_lost_tasks"]

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("idempotency")

# django.tasks hands a task made with ``takes_context=True`` its context as the first
# argument, which must have this name.
CONTEXT = "context"


# Frozen as Django's own is (django-stubs declares it otherwise).
@dataclass(frozen=True, kw_only=True)
class IdempotentTaskContext(TaskContext):  # type: ignore[misc]
    """The context a protected ``takes_context=True`` task receives: django.tasks' own, and
    ``idempotency``, the running attempt (``context.idempotency.step_key("charge")``)."""

    idempotency: Attempt


def idempotent_task(function: Any = None, /, **options: Unpack[OptionArgs]) -> Callable[[F], F]:
    """Run the task once per (scope, key); later runs return the first run's result.

    Put it under ``@task()``. Takes the options of ``@idempotent_function``
    (``idempotency.options``); ``key``, a function of the task's arguments, is
    required; ``scope`` and the operation default to the task function's dotted
    path. A ``takes_context=True`` task's context is no part of the intent: the
    key, scope and fingerprint functions receive the other arguments, and the
    task receives an ``IdempotentTaskContext``. The result is returned as its JSON
    form (``DjangoJSONEncoder``), the same on the first run and on every later one.
    """
    if function is not None:
        raise TypeError(
            f"@idempotent_task takes its options by keyword, not {function!r}: write "
            "@idempotent_task(key=...) under @task(), with the parentheses."
        )
    refuse_unknown("idempotent_task", options)
    given = IdempotencyOptions(**options)
    if given.key is None:
        raise TypeError(
            "@idempotent_task needs key=, a function of the task's arguments that returns "
            "the key: @idempotent_task(key=lambda order_ref, **_: order_ref)."
        )

    def decorator(func: F) -> F:
        _refuse_a_task(func)
        name = given.operation or f"{func.__module__}.{func.__qualname__}"
        signature = inspect.signature(func)
        parameters = list(signature.parameters.values())
        takes_context = bool(parameters) and parameters[0].name == CONTEXT
        if takes_context:
            signature = signature.replace(parameters=parameters[1:])
        guard = CallGuard(
            name=name, signature=signature, options=replace(given, scope=given.scope or name)
        )

        def run(args: tuple[Any, ...], kwargs: dict[str, Any], call: Callable[..., Any]) -> Any:
            if not takes_context:
                return guard.run(lambda: call(*args, **kwargs), args, kwargs)
            context, rest = _context_of(name, args)
            work = lambda: call(_with_attempt(context), *rest, **kwargs)  # noqa: E731
            return guard.run(work, rest, kwargs)

        if inspect.iscoroutinefunction(func):
            # The protocol is synchronous and a connection belongs to a thread: it runs in
            # the sync thread, and drives the coroutine from there (as async views do).
            @wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                value = await sync_to_async(run, thread_sensitive=True)(
                    args, kwargs, async_to_sync(func)
                )
                return as_json(value)

            async_wrapper.idempotency_guard = guard  # type: ignore[attr-defined]
            return async_wrapper  # type: ignore[return-value]

        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return as_json(run(args, kwargs, func))

        # How requeue_lost_tasks tells a protected task (safe to run again) from another.
        wrapper.idempotency_guard = guard  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator


def as_json(value: Any) -> Any:
    """``value`` as a later run returns it: decoded from the JSON the record holds."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def _refuse_a_task(func: object) -> None:
    if isinstance(func, Task):
        raise TypeError(
            f"@idempotent_task(...) goes under @task(), not above it ({func.module_path}): "
            "above it, it gets the Task, not the function the worker calls. Write @task(), "
            "then @idempotent_task(...), then the function."
        )
    if not callable(func):
        raise TypeError(f"@idempotent_task(...) decorates a task function, not {func!r}.")


def _context_of(name: str, args: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    if not args or not isinstance(args[0], TaskContext):
        raise TypeError(
            f"{name}: its first parameter is named 'context', which django.tasks gives a "
            "task's context, but the call passed none: give the task @task(takes_context=True), "
            "or name the parameter otherwise."
        )
    return args[0], args[1:]


def _with_attempt(context: Any) -> IdempotentTaskContext:
    return IdempotentTaskContext(task_result=context.task_result, idempotency=steps.current())  # type: ignore[arg-type]


# --- django-tasks-db: tasks left RUNNING by a worker that died --------------------------


class WorkerLost(Exception):
    """The worker running this task was lost (killed, or its machine gone) mid-run.

    ``requeue_lost_tasks`` records it as the lost run's error and enqueues the same
    call again; its message names the new run's id.
    """


def requeue_lost_tasks(stale_after: timedelta | float, *, backend: str | None = None) -> int:
    """Run again the protected tasks a dead worker left ``RUNNING``; returns how many.

    django-tasks-db (``db_worker``) marks a task ``RUNNING`` when a worker takes it
    and nothing ever changes it if that worker dies: the task stays in limbo
    (django-tasks issue 46). For each task protected by ``@idempotent_task`` that
    has run for longer than ``stale_after`` (a ``timedelta`` or seconds), the same
    call (task, arguments, queue, priority) is enqueued again and the lost run is
    marked ``FAILED`` with ``WorkerLost``, which names the new run, in one
    transaction: the record decides what the new run does (the first run's result,
    a takeover of its expired lease, or a run of its own). Both writes are
    django-tasks-db's own (``Task.enqueue``, ``DBTaskResult.set_failed``). Tasks that
    are not protected are left as they are: whether their effect happened is for
    their owner to find out.
    """
    from django.db import router, transaction
    from django_tasks_db.compat import DEFAULT_TASK_BACKEND_ALIAS, TaskResultStatus
    from django_tasks_db.models import DBTaskResult

    if not isinstance(stale_after, timedelta):
        stale_after = timedelta(seconds=stale_after)
    lost = DBTaskResult.objects.filter(
        status=TaskResultStatus.RUNNING,
        backend_name=backend or DEFAULT_TASK_BACKEND_ALIAS,
        started_at__lt=timezone.now() - stale_after,
    )
    database = router.db_for_write(DBTaskResult)
    requeued = 0
    for pk, path in lost.values_list("pk", "task_path"):
        if not _protected(path):
            continue
        with transaction.atomic(using=database):
            # Still lost, and nobody else's to requeue: not one that finished meanwhile.
            run = lost.select_for_update(skip_locked=True).filter(pk=pk).first()
            if run is None:
                continue
            again = run.task.enqueue(*run.args_kwargs["args"], **run.args_kwargs["kwargs"])
            run.set_failed(WorkerLost(f"Its worker was lost mid-run; run again as {again.id}."))
        logger.warning(
            "Requeued task %s (%s) as %s: RUNNING since %s, its worker presumed dead.",
            pk,
            path,
            again.id,
            run.started_at,
            extra={"event": "idempotency.task_requeued", "task_path": path},
        )
        requeued += 1
    return requeued


def _protected(path: str) -> bool:
    try:
        found = import_string(path)
    except ImportError:
        return False
    return hasattr(getattr(found, "func", None), "idempotency_guard")
