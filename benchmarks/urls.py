"""The example project's URLs plus the benchmark twins under ``/bench/orders/<twin>/``."""

from django.urls import path

from benchmarks.views import (
    LeaseOrderCreate,
    OrderCreate,
    PlacedOrderCreate,
    ProtectedOrderCreate,
    ProtectedPlacedOrderCreate,
    SlowLeaseOrderCreate,
    TransactionalOrderCreate,
    WaitingSlowLeaseOrderCreate,
    WrittenOnceOrderCreate,
    alternative_views,
)
from example_project.urls import urlpatterns as example_urlpatterns

TWINS = {
    "plain": OrderCreate.as_view({"post": "create"}),
    "plain-atomic": TransactionalOrderCreate.as_view({"post": "create"}),
    "protected": ProtectedOrderCreate.as_view({"post": "create"}),
    "written-once": WrittenOnceOrderCreate.as_view({"post": "create"}),
    "lease": LeaseOrderCreate.as_view({"post": "create"}),
    "placed": PlacedOrderCreate.as_view({"post": "create"}),
    "placed-protected": ProtectedPlacedOrderCreate.as_view({"post": "create"}),
    "lease-2s": SlowLeaseOrderCreate.as_view({"post": "create"}),
    "lease-2s-wait": WaitingSlowLeaseOrderCreate.as_view({"post": "create"}),
    **alternative_views(),
}

urlpatterns = [
    *example_urlpatterns,
    *(path(f"bench/orders/{slug}/", view, name=f"bench-{slug}") for slug, view in TWINS.items()),
]
