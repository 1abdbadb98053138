from django.contrib import admin
from django.urls import include, path

from example_project import views

urlpatterns = [
    path("", views.api_root, name="api-root"),
    path("api/", include("example_project.shop.urls")),
    path("api/", include("example_project.reports.urls")),
    path("api-auth/", include("rest_framework.urls")),
    path("admin/", admin.site.urls),
]
