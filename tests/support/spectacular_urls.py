from django.urls import include, path
from rest_framework.routers import SimpleRouter

from tests.testapp import schema_views, views
from tests.testapp.lease_views import LeaseOrderCreateView

router = SimpleRouter()
router.register("orders", views.OrderViewSet, basename="order")
router.register("optional-orders", views.OptionalKeyOrderViewSet, basename="optional-order")
router.register("ref-orders", schema_views.KeyFromBodyOrderViewSet, basename="ref-order")
router.register("payable-orders", schema_views.PayableOrderViewSet, basename="payable-order")

urlpatterns = [
    path("", include(router.urls)),
    path("lease-orders/", LeaseOrderCreateView.as_view()),
    path("refunds/", schema_views.RefundView.as_view()),
    path("transfers/", schema_views.transfer),
    path("webhook/", views.webhook),
]
