"""A lease-mode function that charges a provider through a step: the crash tests' work.

Imported once Django is set up (the test process, or ``tests.support.step_worker``).
``PROVIDER["url"]`` is the fake provider's (tests.support.fake_provider); with
``HANG["after_charge"]`` the work stops after the provider answered, before the
record is finished, until the process is killed.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from idempotency import idempotent_function
from idempotency.steps import current

OPERATION = "tests.steps.pay"
LEASE_SECONDS = 1.0
PROVIDER = {"url": ""}
HANG = {"after_charge": False}


@idempotent_function(
    scope="tests.steps",
    key=lambda order, **_: order,
    mode="lease",
    lease_seconds=LEASE_SECONDS,
    operation=OPERATION,
)
def pay(order: str, amount: int, recorded: bool) -> str:
    attempt = current()

    def charge(key: str) -> dict[str, Any]:
        answer = httpx.post(
            f"{PROVIDER['url']}/charges",
            json={"amount": amount, "currency": "eur"},
            headers={"Idempotency-Key": key},
        )
        answer.raise_for_status()
        return dict(answer.json())

    # Recorded, a later attempt gets the charge back without calling the provider; keyed
    # only, it calls again with the same key and the provider answers the first charge.
    charged = attempt.step("charge", charge) if recorded else charge(attempt.step_key("charge"))
    if HANG["after_charge"]:
        print("charged", flush=True)
        time.sleep(60)  # killed here: the provider answered, the record is not finished
    return str(charged["id"])
