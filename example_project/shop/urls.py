from django.urls import path
from rest_framework.routers import SimpleRouter

from example_project.shop import views

router = SimpleRouter()
router.register("orders", views.OrderViewSet, basename="order")

urlpatterns = [
    *router.urls,
    path("payments/callback/", views.payment_callback, name="payment-callback"),
    # Without the slash too: Django cannot redirect a POST to the slashed URL
    # (APPEND_SLASH raises in DEBUG and loses the body otherwise).
    path("orders", views.OrderViewSet.as_view({"get": "list", "post": "create"})),
    path("payments/callback", views.payment_callback),
]
