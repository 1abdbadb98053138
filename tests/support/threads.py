"""Calls in threads of their own, each on its own database connection (closed when it ends).

Django's connections are per thread: a call in another thread is another session,
as a concurrent request is. What each call answered, or the exception it raised,
comes back to the test to judge; a call that hangs fails the test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection

JOIN_TIMEOUT = 30.0


class Call(threading.Thread):
    """One call on its own connection: its ``answer``, or the ``error`` it raised."""

    def __init__(self, target: Callable[[], Any], barrier: threading.Barrier | None = None):
        super().__init__(daemon=True)
        self.target, self.barrier = target, barrier
        self.answer: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.barrier is not None:
                self.barrier.wait()
            self.answer = self.target()
        except BaseException as exc:  # the test judges it, not the thread
            self.error = exc
        finally:
            connection.close()

    def done(self) -> Call:
        done(self)
        return self

    def result(self) -> Any:
        """What the call returned, once it has; the exception it raised, raised."""
        if self.done().error is not None:
            raise self.error  # type: ignore[misc]
        return self.answer


def done(thread: threading.Thread) -> None:
    """Wait for ``thread``; it must not hang."""
    thread.join(JOIN_TIMEOUT)
    assert not thread.is_alive(), "a request hung"


def in_thread(target: Callable[[], Any]) -> Call:
    """``target()`` started in a thread of its own; ``.done()`` waits for it."""
    call = Call(target)
    call.start()
    return call


def run_in_thread(target: Callable[[], Any]) -> Any:
    """What ``target()`` returns when run in a thread of its own (its exception, raised)."""
    return in_thread(target).result()


def run_in_threads(
    count: int, target: Callable[[int], Any], *, allowing_errors: bool = False
) -> list[Any]:
    """``target(i)`` for each of ``count`` threads, started together: each one's answer.

    An exception a call raised fails the test, unless ``allowing_errors``: then it is
    that call's answer, for the test to assert.
    """
    barrier = threading.Barrier(count, timeout=JOIN_TIMEOUT)
    calls = [Call(lambda i=i: target(i), barrier) for i in range(count)]
    for call in calls:
        call.start()
    for call in calls:
        done(call)
    errors = [call.error for call in calls if call.error is not None]
    if not allowing_errors:
        assert not errors, errors
    return [call.answer if call.error is None else call.error for call in calls]
