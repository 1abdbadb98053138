from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt

from tests.nodrf import views

urlpatterns = [
    path("orders/", csrf_exempt(views.order)),
    path("async/", include("tests.testapp.async_views")),
]
