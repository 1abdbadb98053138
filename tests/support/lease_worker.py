"""A process that claims a lease-mode operation and hangs in its work until it is killed.

``python -m tests.support.lease_worker <user_id> <key> <effect-first|effect-last>``; prints
``working`` once it is inside the work (after the effect, with ``effect-first``).
"""

from __future__ import annotations

import sys
import time

from idempotency.fingerprint import fingerprint

OPERATION = "tests.killed"
REQUEST_HASH = fingerprint(["POST", "/reports/", '{"seconds":60}'])
LEASE_SECONDS = 1.0


def scope(user_id: int) -> str:
    return f"user:{user_id}:{OPERATION}"


def main(user_id: int, key: str, effect_first: bool) -> None:
    import django

    django.setup()
    from idempotency.protocol import Operation
    from idempotency.protocol.execute import execute
    from tests.testapp.lease_views import sku_for
    from tests.testapp.models import Order

    operation = Operation(
        scope=scope(user_id),
        key=key,
        request_hash=REQUEST_HASH,
        name=OPERATION,
        mode="lease",
        lease_seconds=LEASE_SECONDS,
    )

    def work(attempt: object) -> None:
        if effect_first:
            Order.objects.create(owner_id=user_id, sku=sku_for(key), quantity=1)
        print("working", flush=True)
        time.sleep(60)  # killed here
        if not effect_first:
            Order.objects.create(owner_id=user_id, sku=sku_for(key), quantity=1)

    execute(operation, work, decide=lambda value, attempt: None, replay=lambda record: None)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "effect-first")
