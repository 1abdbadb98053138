from django.contrib import admin

from example_project.reports.models import Report


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = ["id", "owner", "seconds", "created_at"]
    readonly_fields = ["idempotency_scope", "idempotency_key", "created_at"]
