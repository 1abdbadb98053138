from django.apps import AppConfig


class ReportsConfig(AppConfig):
    name = "example_project.reports"
    label = "reports"
    default_auto_field = "django.db.models.BigAutoField"
