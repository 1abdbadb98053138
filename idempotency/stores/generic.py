"""The ORM store: SQLite, and any database without a store of its own.

Every statement is the ORM's. There is no one-statement claim: every claim
takes the locked path. On SQLite, writes are serialised by the database
(``select_for_update`` is a no-op there) and a writer that waits past the
connection's ``timeout`` gets "database is locked": that is the bounded wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError
from django.db.models import BooleanField, DurationField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Now

from idempotency.models import (
    PURGEABLE,
    REPLAYABLE,
    IdempotencyRecord,
    IdempotencyRecordQuerySet,
    Status,
)
from idempotency.stores.base import Candidate, Contention, Store, pauses

# SQLite's answer to a writer that waited out the connection's timeout.
_SQLITE_BUSY = ("database is locked", "database table is locked")


class GenericStore(Store):
    """Every method in the ORM: the store of any database, and the one to subclass."""

    def statements(self) -> AbstractContextManager[None]:
        return nullcontext()  # the ORM makes a cursor per statement

    def claim(
        self,
        candidate: Candidate,
        *,
        lease: timedelta | None,
        lock_timeout: float,
        expires_in: timedelta | None = None,
    ) -> IdempotencyRecord | None:
        return None  # no one-statement claim in the ORM: the locked path is the claim

    def unsaved(self, candidate: Candidate) -> IdempotencyRecord:
        """``candidate``'s record, unsaved, for the stores that insert it through the ORM."""
        return IdempotencyRecord(
            scope=candidate.scope,
            idem_key=candidate.idem_key,
            operation=candidate.operation,
            request_hash=candidate.request_hash,
            request_method=candidate.request_method,
            request_path=candidate.request_path,
            owner_token=candidate.owner_token,
            status=Status.PROCESSING,
        )

    def read_final(self, scope: str, key: str) -> IdempotencyRecord | None:
        found = self.records().filter(scope=scope, idem_key=key, status__in=REPLAYABLE)
        found = found.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=Now()))[:1]
        return next(iter(found), None)

    def insert_or_lock(self, candidate: Candidate) -> IdempotencyRecord | None:
        self.records().bulk_create([self.unsaved(candidate)], ignore_conflicts=True)
        return self.locked().filter(scope=candidate.scope, idem_key=candidate.idem_key).first()

    def lock(self, pk: int) -> IdempotencyRecord:
        return self.locked().get(pk=pk)

    def reclaim(
        self,
        record: IdempotencyRecord,
        token: str,
        *,
        lease: timedelta | None,
        fresh: Candidate | None = None,
    ) -> IdempotencyRecord | None:
        records = self.records().filter(pk=record.pk)
        values: dict[str, Any] = {"attempts": F("attempts") + 1}
        if fresh is not None:
            records = records.filter(expired_at_now())
            values = renewed(fresh)
        landed = records.update(
            **values,
            status=Status.PROCESSING,
            owner_token=token,
            lease_until=None if lease is None else Now() + Value(lease),
            version=F("version") + 1,
            completed_at=None,
            expires_at=None,
            updated_at=Now(),
        )
        if not landed:
            return None
        # The row as written, without reading it back: the values that are plain
        # (the database's clock set the rest; they are kept as read).
        record.owner_token, record.status = token, Status.PROCESSING
        if fresh is not None:
            for name, value in values.items():
                if name != "created_at":
                    setattr(record, name, value)
        record.expires_at = record.completed_at = None
        return record

    @contextmanager
    def bounded_lock_wait(self, seconds: float) -> Iterator[None]:
        yield  # no per-transaction setting: the connection's own timeout bounds the wait

    def contention(self, error: DatabaseError) -> Contention | None:
        return "busy" if any(message in str(error) for message in _SQLITE_BUSY) else None

    def renew(self, pk: int, token: str, lease: timedelta) -> bool:
        return bool(self.owned(pk, token).update(lease_until=Now() + Value(lease)))

    def finish(
        self, pk: int, token: str, values: dict[str, Any], expires_in: timedelta | None
    ) -> bool:
        return bool(
            self.owned(pk, token).update(
                **values,
                lease_until=None,
                completed_at=Now(),
                expires_at=_expiry(expires_in),
                updated_at=Now(),
                version=F("version") + 1,
            )
        )

    def insert_finished(
        self,
        candidate: Candidate,
        values: dict[str, Any],
        expires_in: timedelta | None,
        *,
        lock_timeout: float,
    ) -> IdempotencyRecord | None:
        record = self.unsaved(candidate)
        for name, value in values.items():
            setattr(record, name, value)
        record.completed_at, record.expires_at = Now(), _expiry(expires_in)
        with self.bounded_lock_wait(lock_timeout):
            try:
                record.save(using=self.alias, force_insert=True)
            except IntegrityError:
                # The unique index: a committed record holds the key. (A database whose
                # failed statement aborts the transaction has a store of its own.)
                return None
        record.completed_at = record.expires_at = None  # the database's clock: not read back
        return record

    def release(self, pk: int, token: str, expires_in: timedelta | None) -> bool:
        return bool(
            self.owned(pk, token).update(
                status=Status.FAILED_RETRYABLE,
                lease_until=None,
                expires_at=_expiry(expires_in),
                updated_at=Now(),
                version=F("version") + 1,
            )
        )

    def discard(self, pk: int, token: str) -> bool:
        deleted, _ = self.owned(pk, token).delete()
        return bool(deleted)

    def wait_for_outcome(self, scope: str, key: str, seconds: float) -> None:
        """Poll: one indexed read after 50 ms, 100 ms, 200 ms... then one a second at most."""
        deadline = time.monotonic() + seconds
        for pause in pauses(0.05, 1.0):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(pause, left))
            if not self.in_flight(scope, key):
                return

    def notify_waiters(self, scope: str, key: str) -> None:
        pass  # nobody can hear it: waiting requests poll

    def delete_batch(self, batch: IdempotencyRecordQuerySet, ordering: str) -> tuple[int, Any]:
        if self.connection.features.allow_sliced_subqueries_with_in:
            deleted, _ = self.records().filter(pk__in=batch.values("pk")).delete()
            return deleted, None
        # MySQL and MariaDB take no LIMIT in an IN subquery: lock the batch's rows
        # first (skipping held ones), then delete them by primary key.
        rows = list(batch.values_list("pk", ordering))
        if not rows:
            return 0, None
        deleted, _ = self.records().filter(pk__in=[pk for pk, _ in rows]).delete()
        return deleted, rows[-1][1]  # the batch is in purge order: the last is the largest

    def in_flight(self, scope: str, key: str) -> bool:
        """A live attempt holds the key: ``PROCESSING``, its lease not run out."""
        return (
            self.records()
            .filter(scope=scope, idem_key=key, status=Status.PROCESSING)
            .filter(Q(lease_until__isnull=True) | Q(lease_until__gt=Now()))
            .exists()
        )

    # For subclasses: the querysets the statements above are made of.

    def records(self) -> IdempotencyRecordQuerySet:
        return IdempotencyRecord.objects.using(self.alias)

    def owned(self, pk: int, token: str) -> IdempotencyRecordQuerySet:
        """The record, only while ``token`` still holds it (fencing)."""
        return self.records().filter(pk=pk, owner_token=token, status=Status.PROCESSING)

    def locked(self) -> IdempotencyRecordQuerySet:
        """Records locked for this transaction, with their remaining lease by the database clock."""
        return (
            self.records()
            .select_for_update()
            .annotate(
                lease_remaining=ExpressionWrapper(
                    F("lease_until") - Now(), output_field=DurationField()
                ),
                expired=ExpressionWrapper(expired_at_now(), output_field=BooleanField()),
            )
        )


def expired_at_now() -> Q:
    """A record whose window has passed by the database clock: for a claim, its key is new.

    Only records that can expire (``PURGEABLE``): ``PROCESSING`` (whose atomic-mode
    claim may carry a success's expiry already) and ``NEEDS_REVIEW`` never are.
    """
    return Q(status__in=PURGEABLE, expires_at__lte=Now())


def renewed(fresh: Candidate) -> dict[str, Any]:
    """The columns that make an expired record ``fresh``'s first attempt, as a new one would be."""
    return {
        "operation": fresh.operation,
        "request_hash": fresh.request_hash,
        "request_method": fresh.request_method,
        "request_path": fresh.request_path,
        "response_status": None,
        "response_headers": [],
        "response_body": None,
        "resource_id": "",
        "attempts": 1,
        "recovery_attempts": 0,
        "created_at": Now(),
    }


def _expiry(window: timedelta | None) -> Any:
    return None if window is None else Now() + Value(window)
