from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from idempotency.indexes import PartialIndex

# Imported by every entry point (the DRF mixin, @idempotent, the lazy names of
# ``idempotency``): without the app, Django would refuse the model below with a
# RuntimeError about app_label that names no fix, at URLconf import, where ``check``
# and ``migrate`` die before any check runs. Asked only once the registry knows its
# apps: before that, Django's own AppRegistryNotReady says what is wrong.
if apps.apps_ready and not apps.is_installed("idempotency"):
    raise ImproperlyConfigured(
        'django-idempotency is imported but "idempotency" is not in INSTALLED_APPS: add '
        '"idempotency" to INSTALLED_APPS in your settings, then run '
        "`python manage.py migrate idempotency` to create its table."
    )


class Status(models.TextChoices):
    """A record's state; the moves between them are ``idempotency.protocol.states.MOVES``."""

    PROCESSING = "PROCESSING", _("Processing")
    SUCCEEDED = "SUCCEEDED", _("Succeeded")
    FAILED_RETRYABLE = "FAILED_RETRYABLE", _("Failed (retryable)")
    FAILED_FINAL = "FAILED_FINAL", _("Failed (final)")
    NEEDS_REVIEW = "NEEDS_REVIEW", _("Needs review")


# The outcomes a repeat is answered with; they never change until the record expires.
REPLAYABLE = (Status.SUCCEEDED, Status.FAILED_FINAL)
# What can expire and be purged: never a record in flight or under review.
PURGEABLE = (Status.SUCCEEDED, Status.FAILED_FINAL, Status.FAILED_RETRYABLE)


class DigestField(models.BinaryField):
    """Sixteen bytes that no person reads (a fingerprint, a token), stored as bytes.

    ``bytea`` on PostgreSQL, ``BLOB`` on SQLite, ``longblob`` on MySQL and MariaDB
    (InnoDB keeps so short a value in the row, with a one-byte length): 17 bytes
    of a row where their hexadecimal text took 33 and 65. ``bytes`` in Python (psycopg 2
    hands back a ``memoryview``, which compares equal to the same bytes; the replay
    cache keeps ``bytes``). No converter: it would cost every read of a record a call.
    """

    LENGTH = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["max_length"] = self.LENGTH
        super().__init__(*args, **kwargs)


class IdempotencyRecordQuerySet(models.QuerySet["IdempotencyRecord"]):
    def expired_leases(self) -> IdempotencyRecordQuerySet:
        return self.filter(status=Status.PROCESSING, lease_until__lt=Now())

    def stuck(self) -> IdempotencyRecordQuerySet:
        return self.filter(
            models.Q(status=Status.PROCESSING, lease_until__lt=Now())
            # A NEEDS_REVIEW record never expires (its transition clears expires_at):
            # said here so that idempotency_expires_idx serves it, not a table scan.
            | models.Q(status=Status.NEEDS_REVIEW, expires_at__isnull=True)
        )

    def purgeable(self) -> IdempotencyRecordQuerySet:
        return self.filter(expires_at__lt=Now(), status__in=PURGEABLE)


class IdempotencyRecord(models.Model):
    scope = models.CharField(_("scope"), max_length=255)
    idem_key = models.CharField(_("idempotency key"), max_length=255)
    operation = models.CharField(_("operation"), max_length=255, blank=True)
    request_hash = DigestField(
        _("request hash"), help_text=_("The first 128 bits of the request's SHA-256 fingerprint.")
    )
    request_method = models.CharField(_("request method"), max_length=16, blank=True)
    request_path = models.CharField(_("request path"), max_length=2048, blank=True)
    status = models.CharField(
        _("status"), max_length=20, choices=Status.choices, default=Status.PROCESSING
    )
    owner_token = DigestField(
        _("owner token"),
        help_text=_("Random token of the attempt holding the record; fences its writes."),
    )
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    response_status = models.PositiveSmallIntegerField(_("response status"), null=True, blank=True)
    response_headers = models.JSONField(_("response headers"), default=list, blank=True)
    response_body = models.BinaryField(_("response body"), null=True, blank=True)
    resource_id = models.CharField(_("resource id"), max_length=255, blank=True)
    attempts = models.PositiveIntegerField(_("attempts"), default=1)
    recovery_attempts = models.PositiveIntegerField(_("recovery attempts"), default=0)
    version = models.PositiveIntegerField(_("version"), default=1)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)
    completed_at = models.DateTimeField(_("completed at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)

    objects = IdempotencyRecordQuerySet.as_manager()

    class Meta:
        verbose_name = _("idempotency record")
        verbose_name_plural = _("idempotency records")
        # Operators who may move stuck records through the state machine in the admin.
        permissions = [
            ("resolve_idempotencyrecord", _("Can resolve stuck idempotency records")),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "idem_key"], name="idempotency_scope_key_uniq"
            ),
        ]
        # The finish of an atomic-mode create changes no column these indexes read
        # (status is in none of them; lease_until stays NULL; the claim already set
        # expires_at): PostgreSQL applies it in place, a HOT update with no new entries.
        indexes = [
            # Serves the recovery scan: only rows holding a lease are indexed, and only
            # lease mode sets one (MySQL and MariaDB have no partial indexes: there
            # status leads the index).
            PartialIndex(
                fields=["lease_until"],
                where=models.Q(lease_until__isnull=False),
                fallback_fields=["status", "lease_until"],
                name="idempotency_leased_idx",
            ),
            # Serves purge (the range of expires_at before now, oldest first) and the
            # admin's stuck filter (the records nothing expires: expires_at IS NULL,
            # which only a full index holds). One index for both readers: each
            # costs every create an entry. The admin lists newest first by the
            # primary key, and purge --older-than reads along it too (docs/performance.md).
            models.Index(fields=["expires_at"], name="idempotency_expires_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.scope} / {self.idem_key} ({self.status})"


class IdempotencyStep(models.Model):
    """A request's calls to other idempotent APIs (``idempotency.steps``): its seed, its steps.

    One row per record holds the seed its step keys are derived from (``name`` is
    empty); one more row per step whose result was recorded. Rows belong to the
    request that wrote them, named by its record's ``created_at`` (``request_started``):
    a new request that replaces an expired record starts again with a new seed. A
    table of its own, so that the claim and the finish (the hot path) read and write
    no column for it, and a record's steps go with it when it is purged (CASCADE).
    """

    # The database deletes a record's steps with it (ON DELETE CASCADE, or a trigger on
    # SQLite: migration 0005), whichever statement deletes it: the PostgreSQL purge is
    # one raw DELETE, and an ORM-side cascade would add a query to every discard.
    record = models.ForeignKey(
        IdempotencyRecord,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="steps",
        verbose_name=_("record"),
    )
    request_started = models.DateTimeField(
        _("request started"), help_text=_("The record's created_at when this row was written.")
    )
    name = models.CharField(_("step"), max_length=255, blank=True)
    position = models.PositiveIntegerField(_("position"), null=True, blank=True)
    step_key = models.CharField(_("step key"), max_length=80, blank=True)
    seed = models.CharField(_("seed"), max_length=64, blank=True)
    result = models.TextField(_("recorded result (JSON)"), blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("idempotency step")
        verbose_name_plural = _("idempotency steps")
        constraints = [
            # One seed row (step_key "") and one row per step key for each record.
            models.UniqueConstraint(fields=["record", "step_key"], name="idempotency_step_uniq"),
        ]

    def __str__(self) -> str:
        if not self.name:
            return "seed"
        return self.name if self.position is None else f"{self.name}[{self.position}]"
