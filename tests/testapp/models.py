from django.conf import settings
from django.db import models


class Order(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    sku = models.CharField(max_length=64)
    quantity = models.PositiveIntegerField()
    paid = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.sku} x{self.quantity}"
