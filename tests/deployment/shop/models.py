"""A tenant's business data: one row per purchase, in the tenant's schema."""

from django.db import models


class Purchase(models.Model):
    sku = models.CharField(max_length=100)
    buyer_id = models.BigIntegerField()  # a user of the public schema: no foreign key across

    def __str__(self) -> str:
        return self.sku
