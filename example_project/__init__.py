"""A small DRF API that uses django-idempotency: orders, a signed payment callback, reports."""

# Load the Celery app with Django, so that ``shared_task``s bind to it. Celery is
# optional for the web process: without it installed, there is simply no app.
try:
    from example_project.celery import app as celery_app
except ModuleNotFoundError as missing:  # pragma: no cover - depends on the install
    if missing.name != "celery":
        raise
    celery_app = None

__all__ = ["celery_app"]
