from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from example_project import views
from example_project.partners.views import partner_order
from example_project.shop.api import api as ninja_api

urlpatterns = [
    path("", views.api_root, name="api-root"),
    path("api/", include("example_project.shop.urls")),
    path("api/", include("example_project.reports.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("ninja/", ninja_api.urls),
    path("partner/orders/", partner_order, name="partner-orders"),
    path("api-auth/", include("rest_framework.urls")),
    path("admin/", admin.site.urls),
]
