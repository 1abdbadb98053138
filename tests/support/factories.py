"""factory-boy factories: users and idempotency records in the states tests talk about.

Each trait is a scenario: ``IdempotencyRecordFactory(in_flight=True)`` is a
request still running under a live lease, ``expired_lease=True`` one whose
worker died, ``succeeded=True`` one whose response is stored for replay.
"""

from __future__ import annotations

import json
from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone
from factory.django import DjangoModelFactory

from idempotency.fingerprint import digest_of, fingerprint
from idempotency.models import IdempotencyRecord, Status
from idempotency.protocol.operation import new_owner_token


def _ago(seconds: float) -> object:
    return factory.LazyFunction(lambda: timezone.now() - timedelta(seconds=seconds))


def _from_now(seconds: float) -> object:
    return factory.LazyFunction(lambda: timezone.now() + timedelta(seconds=seconds))


class UserFactory(DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.com")
    password = factory.django.Password("secret")


class IdempotencyRecordFactory(DjangoModelFactory):
    """A record; without a trait, a ``PROCESSING`` claim as atomic mode holds it."""

    class Meta:
        model = IdempotencyRecord

    scope = factory.Sequence(lambda n: f"user:{n}:tests.operation")
    idem_key = factory.Sequence(lambda n: f"key-{n}")
    operation = "tests.operation"
    request_hash = factory.Sequence(lambda n: digest_of(fingerprint([f"request-{n}"])))
    request_method = "POST"
    request_path = "/orders/"
    status = Status.PROCESSING
    owner_token = factory.LazyFunction(new_owner_token)

    class Params:
        # A lease-mode request still running: its owner is presumed alive.
        in_flight = factory.Trait(status=Status.PROCESSING, lease_until=_from_now(60))
        # A lease-mode request whose worker died: recovery's business.
        expired_lease = factory.Trait(
            status=Status.PROCESSING,
            lease_until=_ago(60),
            created_at=_ago(120),
        )
        succeeded = factory.Trait(
            status=Status.SUCCEEDED,
            response_status=201,
            response_headers=[["Content-Type", "application/json"], ["Location", "/orders/7/"]],
            response_body=json.dumps({"id": 7, "sku": "stored"}).encode(),
            resource_id="7",
            completed_at=factory.LazyFunction(timezone.now),
            expires_at=_from_now(24 * 3600),
        )
        failed_retryable = factory.Trait(
            status=Status.FAILED_RETRYABLE,
            expires_at=_from_now(24 * 3600),
        )
        failed_final = factory.Trait(
            status=Status.FAILED_FINAL,
            response_status=402,
            response_headers=[["Content-Type", "application/json"]],
            response_body=json.dumps({"error": "insufficient_funds"}).encode(),
            completed_at=factory.LazyFunction(timezone.now),
            expires_at=_from_now(24 * 3600),
        )
        needs_review = factory.Trait(
            status=Status.NEEDS_REVIEW,
            lease_until=None,
            recovery_attempts=5,
        )
        # Succeeded long ago; its retention window has passed, so purge may take it.
        expired = factory.Trait(
            succeeded=True,
            created_at=_ago(3 * 24 * 3600),
            completed_at=_ago(3 * 24 * 3600),
            expires_at=_ago(2 * 24 * 3600),
        )

    @classmethod
    def _create(cls, model_class, *args, **kwargs):  # type: ignore[no-untyped-def]
        # created_at is auto_now_add: set a past value with an UPDATE after the insert.
        created_at = kwargs.pop("created_at", None)
        record = super()._create(model_class, *args, **kwargs)
        if created_at is not None:
            model_class.objects.filter(pk=record.pk).update(created_at=created_at)
            record.created_at = created_at
        return record
