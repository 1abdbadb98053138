from django.contrib import admin
from django.urls import path

from tests.deployment import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.create_order),
    path("orders/leased/", views.create_order_leased),
    path("orders/elsewhere/", views.create_order_elsewhere),
    path("orders/in-b/", views.create_order_in_b),
]
