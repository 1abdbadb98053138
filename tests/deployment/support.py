"""What the tenant deployments' tests share: requests run together on threads of their own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

JOIN_TIMEOUT = 60.0


def together(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Start ``count`` threads at once, each on its own connections; their results, in order."""
    barrier = threading.Barrier(count, timeout=JOIN_TIMEOUT)
    results: list[Any] = [None] * count

    def runner(index: int) -> None:
        try:
            barrier.wait()
            results[index] = target(index)
        except BaseException as exc:  # reported by the test, not lost in the thread
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=runner, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a request hung"
    errors = [result for result in results if isinstance(result, BaseException)]
    assert not errors, errors
    return results
