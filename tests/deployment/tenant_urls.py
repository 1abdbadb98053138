from django.contrib import admin
from django.urls import path

from tests.deployment import tenant_views as views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("purchases/", views.create_purchase),
    path("purchases/leased/", views.create_purchase_leased),
    path("purchases/shared-scope/", views.create_purchase_shared_scope),
    path("purchases/shared-scope/leased/", views.create_purchase_shared_scope_leased),
]
