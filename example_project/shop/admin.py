from django.contrib import admin

from example_project.shop.models import Order, Payment


class PaymentInline(admin.TabularInline):
    model = Payment
    extra = 0
    readonly_fields = ["provider", "trade_no", "amount", "received_at"]
    can_delete = False


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "owner", "sku", "quantity", "status", "created_at", "paid_at"]
    list_filter = ["status"]
    search_fields = ["sku", "owner__username"]
    inlines = [PaymentInline]


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    list_display = ["provider", "trade_no", "order", "amount", "received_at"]
    list_filter = ["provider"]
    search_fields = ["trade_no"]
