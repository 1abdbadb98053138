from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = _("Idempotency")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from idempotency import (
            checks,  # noqa: F401  (registers the system checks)
            logs,
            tracing,
        )

        logs.connect()
        tracing.connect()
        _register_framework_adapters()


def _register_framework_adapters() -> None:
    """Each adapter registers itself on import; a framework that is not installed is skipped."""
    try:
        import idempotency.drf  # noqa: F401
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] != "rest_framework":
            raise
