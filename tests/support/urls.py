from django.contrib import admin
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.routers import SimpleRouter

from tests.testapp import views

router = SimpleRouter()
router.register("orders", views.OrderViewSet, basename="order")
router.register("optional-orders", views.OptionalKeyOrderViewSet, basename="optional-order")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include(router.urls)),
    path("charge/", views.charge),
    path("webhook/", views.webhook),
    path("plain/", csrf_exempt(views.plain_view)),
    path("big/", views.big),
    path("flaky/", views.flaky),
    path("lease/", include("tests.testapp.lease_views")),
    path("async/", include("tests.testapp.async_views")),
    path("drf/", include("tests.testapp.drf_views")),
    path("outage/", include("tests.testapp.outage_views")),
    path("background/", include("tests.testapp.background")),
]
