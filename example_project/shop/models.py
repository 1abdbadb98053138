from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone


class Order(models.Model):
    class Status(models.TextChoices):
        PENDING = "PENDING", "Pending"
        PAID = "PAID", "Paid"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="shop_orders"
    )
    sku = models.CharField(max_length=64)
    quantity = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    paid_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"#{self.pk} {self.sku} x{self.quantity} ({self.status})"

    def mark_paid(self) -> None:
        """Pay the order once; later payments leave the first ``paid_at`` alone."""
        if self.status == self.Status.PAID:
            return
        self.status = self.Status.PAID
        self.paid_at = timezone.now()
        self.save(update_fields=["status", "paid_at"])


class Payment(models.Model):
    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="payments")
    provider = models.CharField(max_length=32)
    trade_no = models.CharField(max_length=128)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # The business-level guard behind the idempotency record: one row per trade,
            # even after the record has been purged and the provider re-sends.
            models.UniqueConstraint(
                fields=["provider", "trade_no"], name="shop_payment_one_per_trade"
            )
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.trade_no} {self.amount}"


class Receipt(models.Model):
    """An order's receipt, issued by the ``issue_receipt`` task: one per order."""

    # One-to-one: the business-level guard behind the task's record, as for payments. A
    # receipt asked for again after the record was purged finds this row, not a second one.
    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="receipt")
    issued_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Receipt {self.pk} of order #{self.order_id}"
