"""A small DRF API that uses django-idempotency: orders and a signed payment callback."""
