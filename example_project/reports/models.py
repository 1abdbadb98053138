from __future__ import annotations

from django.conf import settings
from django.db import models


class Report(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reports"
    )
    seconds = models.FloatField(help_text="How long the report took to generate.")
    # The idempotency scope and key of the request that made it: the resolver
    # finds the report by them after a crash, and the constraint makes a second
    # report for one key impossible even if everything else failed.
    idempotency_scope = models.CharField(max_length=255)
    idempotency_key = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_scope", "idempotency_key"],
                name="reports_report_one_per_key",
            )
        ]

    def __str__(self) -> str:
        return f"Report #{self.pk} ({self.seconds:g} s)"
