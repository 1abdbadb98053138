from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "tests.deployment.shop"
    label = "tenant_shop"
    default_auto_field = "django.db.models.BigAutoField"
