from decimal import Decimal

from rest_framework import serializers

from example_project.shop.models import Order, Receipt


class OrderSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="order-detail")
    quantity = serializers.IntegerField(min_value=1, max_value=10_000)

    class Meta:
        model = Order
        fields = ["id", "url", "sku", "quantity", "status", "created_at", "paid_at"]
        read_only_fields = ["status", "created_at", "paid_at"]


class ReceiptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Receipt
        fields = ["id", "order", "issued_at"]
        read_only_fields = fields


class TradeSerializer(serializers.Serializer):
    """The fields that name a trade: they make the idempotency key and scope."""

    provider = serializers.SlugField(max_length=32)
    trade_no = serializers.CharField(max_length=128)


class PaymentCallbackSerializer(TradeSerializer):
    order_id = serializers.IntegerField(min_value=1, max_value=2**63 - 1)  # a bigint id
    amount = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=Decimal("0.01"))
