from django.urls import path
from rest_framework.routers import SimpleRouter

from example_project.shop import views

router = SimpleRouter()
router.register("orders", views.OrderViewSet, basename="order")

urlpatterns = [
    *router.urls,
    path("payments/callback/", views.payment_callback, name="payment-callback"),
]
