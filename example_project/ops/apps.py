from django.apps import AppConfig


class OpsConfig(AppConfig):
    """Operations tooling of the example project: the on-call operator account."""

    name = "example_project.ops"
    label = "ops"
