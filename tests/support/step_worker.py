"""A process that runs ``tests.support.step_work.pay`` and hangs after the charge until killed.

``python -m tests.support.step_worker <provider-url> <order> <amount> <recorded|keyed>``;
prints ``charged`` once the provider has answered.
"""

from __future__ import annotations

import sys


def main(url: str, order: str, amount: int, recorded: bool) -> None:
    import django

    django.setup()
    from tests.support import step_work

    step_work.PROVIDER["url"] = url
    step_work.HANG["after_charge"] = True
    step_work.pay(order, amount, recorded)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "recorded")
