"""``manage.py idempotency_scheduler``: recovery and purge on a timer, without Celery beat or cron.

A long-running process, supervised like the web and worker processes (systemd,
a container, a Procfile line). It runs the passes itself rather than enqueueing
their tasks: a queue whose workers are down or busy would pile runs up (a queued
``django.tasks`` task never expires), and the requeue of lost tasks must not wait
for the workers it rescues. Several may run at once: each pass is safe to overlap.
"""

from __future__ import annotations

import logging
import signal
import time
from argparse import ArgumentParser
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from idempotency.management._common import add_database_argument, chosen_database, records
from idempotency.recovery import recover_everywhere, total
from idempotency.retention import scheduled_purge

logger = logging.getLogger("idempotency")


class Command(BaseCommand):
    help = (
        "Run recovery every --recover-every seconds and purge every --purge-every seconds "
        "until stopped (SIGTERM or Ctrl-C end it after the pass under way); with "
        "--requeue-lost-after, also put django-tasks-db's protected tasks left RUNNING by a "
        "dead worker back in their queue. --once: one round, then exit (for cron)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--recover-every", type=float, default=60.0, metavar="SECONDS")
        parser.add_argument("--purge-every", type=float, default=3600.0, metavar="SECONDS")
        parser.add_argument(
            "--requeue-lost-after",
            type=float,
            metavar="SECONDS",
            help="With django-tasks-db: at each recovery, requeue the protected tasks RUNNING "
            "for longer than this (longer than the longest run and lease of your tasks).",
        )
        parser.add_argument("--once", action="store_true", help="One round of each, then exit.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        database = chosen_database(options["database"])
        stale_after = options["requeue_lost_after"]
        for option in ("recover_every", "purge_every", "requeue_lost_after"):
            if options[option] is not None and not options[option] > 0:
                name = "--" + option.replace("_", "-")
                raise CommandError(f"{name} should be a positive number of seconds.")
        if stale_after is not None:
            from idempotency.django_tasks import requeue_lost_tasks  # needs django.tasks

        def recover() -> str:
            report = total(report for _, report in recover_everywhere(database=database))
            said = f"recovered {records(report.examined)}"
            if stale_after is not None:
                said += f"; requeued {requeue_lost_tasks(stale_after)} lost tasks"
            return said

        def purge() -> str:
            purged, steps = scheduled_purge(database=database)
            gone = f" and {steps:,} steps whose record was gone" if steps else ""
            return f"purged {records(purged)}{gone}"

        passes: list[tuple[str, float, Callable[[], str]]] = [
            ("recovery", options["recover_every"], recover),
            ("purge", options["purge_every"], purge),
        ]
        self.stopping = False
        if not options["once"]:
            for number in (signal.SIGTERM, signal.SIGINT):
                signal.signal(number, self.stop)
        due = dict.fromkeys((name for name, _, _ in passes), 0.0)
        while not self.stopping:
            for name, every, run in passes:
                if self.stopping or time.monotonic() < due[name]:
                    continue
                due[name] = time.monotonic() + every
                self.run_pass(name, run, options["verbosity"])
            if options["once"]:
                return
            time.sleep(max(0.0, min(min(due.values()) - time.monotonic(), 1.0)))

    def run_pass(self, name: str, run: Callable[[], str], verbosity: int) -> None:
        close_old_connections()  # one a database restart broke is replaced, as a request's is
        try:
            said = run()
        except Exception:
            # The next round tries again: one failed pass must not end the scheduler.
            logger.exception(
                "The %s pass failed.", name, extra={"event": "idempotency.pass_failed"}
            )
            return
        if verbosity > 0:
            self.stdout.write(said[0].upper() + said[1:] + ".")

    def stop(self, number: int, frame: Any) -> None:
        self.stopping = True
