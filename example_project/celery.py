"""The example project's Celery app: broker from ``CELERY_BROKER_URL``, idempotency beat.

Run a worker and beat from the repository root::

    .venv/bin/celery -A example_project worker --loglevel=INFO
    .venv/bin/celery -A example_project beat --loglevel=INFO

``IDEMPOTENCY_RECOVER_EVERY`` / ``IDEMPOTENCY_PURGE_EVERY`` (seconds) change how
often beat runs recovery (default 60) and purge (default 3600).
"""

from __future__ import annotations

import os

from celery import Celery

from idempotency.beat import beat_schedule

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
# CELERY_* settings (CELERY_BROKER_URL, default redis://127.0.0.1:6379/0).
app.config_from_object("django.conf:settings", namespace="CELERY")
# Finds idempotency.tasks (and any app's tasks module) once Django is set up.
app.autodiscover_tasks()
app.conf.beat_schedule = beat_schedule(
    recover_every=float(os.environ.get("IDEMPOTENCY_RECOVER_EVERY", 60)),
    purge_every=float(os.environ.get("IDEMPOTENCY_PURGE_EVERY", 3600)),
)
