from django.apps import AppConfig


class PrometheusConfig(AppConfig):
    name = "idempotency.contrib.prometheus"
    label = "idempotency_prometheus"
    verbose_name = "Idempotency metrics for Prometheus"

    def ready(self) -> None:
        from idempotency.contrib.prometheus import enable

        enable()
