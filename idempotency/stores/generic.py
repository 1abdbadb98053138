"""The ORM store: SQLite, and any database without a store of its own.

Every statement is the ORM's. There is no one-statement claim: every claim
takes the locked path. On SQLite, writes are serialised by the database
(``select_for_update`` is a no-op there) and a writer that waits past the
connection's ``timeout`` gets "database is locked": that is the bounded wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import (
    BooleanField,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Value,
)
from django.db.models.functions import Now

from idempotency.models import (
    PURGEABLE,
    REPLAYABLE,
    IdempotencyRecord,
    IdempotencyRecordQuerySet,
    IdempotencyStep,
    Status,
)
from idempotency.stores.base import Candidate, Contention, Found, Purged, Store, pauses
from idempotency.stores.step_cascade import cascades

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
    ) -> Found | None:
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

    def insert_or_lock(self, candidate: Candidate) -> Found | None:
        self.records().bulk_create([self.unsaved(candidate)], ignore_conflicts=True)
        return self.holding(candidate)

    def lock(self, pk: int) -> Found:
        return found(self.locked().get(pk=pk))

    def reclaim(
        self,
        record: IdempotencyRecord,
        token: bytes,
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
        if fresh is not None:
            # The earlier request's steps: its seed and results are not the new request's.
            self.steps().filter(record_id=record.pk).delete()
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

    def renew(self, pk: int, token: bytes, lease: timedelta) -> bool:
        return bool(self.owned(pk, token).update(lease_until=Now() + Value(lease)))

    def finish(
        self, pk: int, token: bytes, values: dict[str, Any], expires_in: timedelta | None
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

    def release(self, pk: int, token: bytes, expires_in: timedelta | None) -> bool:
        return bool(
            self.owned(pk, token).update(
                status=Status.FAILED_RETRYABLE,
                lease_until=None,
                expires_at=_expiry(expires_in),
                updated_at=Now(),
                version=F("version") + 1,
            )
        )

    def discard(self, pk: int, token: bytes) -> bool:
        if cascades(self.connection):
            deleted, _ = self.owned(pk, token).delete()
            return bool(deleted)
        with transaction.atomic(using=self.alias):
            deleted, _ = self.owned(pk, token).delete()
            if deleted:
                self.steps().filter(record_id=pk).delete()
        return bool(deleted)

    def delete_records(self, pks: Sequence[int]) -> int:
        with transaction.atomic(using=self.alias):
            deleted, _ = self.records().filter(pk__in=pks).delete()
            if not cascades(self.connection):
                self.steps().filter(record_id__in=pks).delete()
        return deleted

    def delete_orphan_steps(self, limit: int) -> int:
        # Chosen first, then deleted by primary key: MySQL and MariaDB take no LIMIT
        # in an IN subquery. A step whose record is gone never gets one back.
        pks = list(self.orphan_steps().order_by("pk").values_list("pk", flat=True)[:limit])
        if not pks:
            return 0
        deleted, _ = self.steps().filter(pk__in=pks).delete()
        return deleted

    def count_orphan_steps(self) -> int:
        return self.orphan_steps().count()

    # Recovery's and an operator's moves

    def settle(
        self,
        seen: IdempotencyRecord,
        status: str,
        token: bytes,
        *,
        expires_in: timedelta | None,
        columns: dict[str, Any],
        recovered: bool,
    ) -> IdempotencyRecord | None:
        values: dict[str, Any] = {
            **columns,
            "status": status,
            "owner_token": token,
            "lease_until": None,
            "expires_at": _expiry(expires_in),
        }
        if status in REPLAYABLE:
            values["completed_at"] = Now()
        if recovered:
            values["recovery_attempts"] = F("recovery_attempts") + 1
        return self._moved(seen, values)

    def postpone(self, seen: IdempotencyRecord, lease: timedelta) -> IdempotencyRecord | None:
        return self._moved(
            seen,
            {
                "lease_until": Now() + Value(lease),
                "recovery_attempts": F("recovery_attempts") + 1,
            },
        )

    def _moved(self, seen: IdempotencyRecord, values: dict[str, Any]) -> IdempotencyRecord | None:
        guard = Q(pk=seen.pk, status=seen.status, version=seen.version)
        if seen.status == Status.PROCESSING:
            guard &= Q(lease_until__lt=Now()) | Q(lease_until__isnull=True)
        records = self.records()
        if not records.filter(guard).update(**values, updated_at=Now(), version=F("version") + 1):
            return None
        return records.get(pk=seen.pk)

    # Steps

    def seed(self, pk: int, token: bytes | None = None) -> str | None:
        seeds = self.current_seed(pk)
        if token is not None:
            seeds = seeds.filter(record__owner_token=token, record__status=Status.PROCESSING)
        return seeds.values_list("seed", flat=True).first()

    def seeded_at(self, pk: int) -> datetime | None:
        return self.current_seed(pk).values_list("created_at", flat=True).first()

    def current_seed(self, pk: int) -> QuerySet[IdempotencyStep]:
        """The seed row of the request record ``pk`` holds now (its ``created_at``)."""
        return self.steps().filter(
            record_id=pk, step_key="", request_started=F("record__created_at")
        )

    def plant_seed(self, pk: int, token: bytes, seed: str) -> str | None:
        with transaction.atomic(using=self.alias):
            started = self._request_started(pk, token)
            if started is None:
                return None
            rows = self.steps().filter(record_id=pk)
            kept = rows.filter(step_key="", request_started=started)
            planted = kept.values_list("seed", flat=True).first()
            if planted is not None:
                return planted
            # Rows under this record that no replacement deleted (written by an earlier
            # release, which kept them until this point): not this request's.
            rows.delete()
            self.steps().create(record_id=pk, request_started=started, seed=seed)
        return seed

    def recorded_step(self, pk: int, step_key: str) -> str | None:
        rows = self.steps().filter(record_id=pk, step_key=step_key)
        return rows.values_list("result", flat=True).first()

    def record_step(
        self,
        pk: int,
        token: bytes,
        *,
        name: str,
        position: int | None,
        step_key: str,
        result: str,
    ) -> bool:
        with transaction.atomic(using=self.alias):
            started = self._request_started(pk, token)
            if started is None:
                return False
            try:
                with transaction.atomic(using=self.alias):
                    self.steps().create(
                        record_id=pk,
                        request_started=started,
                        name=name,
                        position=position,
                        step_key=step_key,
                        result=result,
                    )
            except IntegrityError:
                pass  # recorded already by this attempt (a step taken twice): the first stays
        return True

    def _request_started(self, pk: int, token: bytes) -> Any:
        """The ``created_at`` of the request ``token`` holds in flight, its record locked."""
        owned = self.owned(pk, token).select_for_update()
        return owned.values_list("created_at", flat=True).first()

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

    def delete_batch(
        self, batch: IdempotencyRecordQuerySet, ordering: str, *, keys: bool = False
    ) -> Purged:
        one_statement = self.connection.features.allow_sliced_subqueries_with_in
        if one_statement and cascades(self.connection) and not keys:
            # One statement: what it chose is what it deleted (the database deletes the steps).
            deleted, _ = self.records().filter(pk__in=batch.values("pk")).delete()
            return Purged(deleted, None, deleted)
        # MySQL and MariaDB take no LIMIT in an IN subquery: lock the batch's rows
        # first (skipping held ones), then delete them by primary key. Measured on
        # MariaDB 10.11 this beat DELETE ... ORDER BY expires_at LIMIT n (which would
        # wait on a held row, too) and one unbatched DELETE (docs/retention.md).
        rows = list(batch.values_list("pk", ordering, "scope", "idem_key"))
        if not rows:
            return Purged(0, None, 0)
        deleted = self.delete_records([row[0] for row in rows])
        pairs = tuple((row[2], row[3]) for row in rows) if keys else ()
        # The batch is in purge order: the last is the largest.
        return Purged(deleted, rows[-1][1], len(rows), pairs)

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

    def steps(self) -> QuerySet[IdempotencyStep]:
        return IdempotencyStep.objects.using(self.alias)

    def orphan_steps(self) -> QuerySet[IdempotencyStep]:
        """Steps whose record is gone."""
        return self.steps().filter(~Exists(self.records().filter(pk=OuterRef("record_id"))))

    def holding(self, candidate: Candidate) -> Found | None:
        """The row holding ``candidate``'s key, locked, or ``None``."""
        records = self.locked().filter(scope=candidate.scope, idem_key=candidate.idem_key)
        record = records.first()
        return None if record is None else found(record)

    def owned(self, pk: int, token: bytes) -> IdempotencyRecordQuerySet:
        """The record, only while ``token`` still holds it (fencing)."""
        return self.records().filter(pk=pk, owner_token=token, status=Status.PROCESSING)

    def locked(self) -> IdempotencyRecordQuerySet:
        """Records locked for this transaction, with their remaining lease by the database clock."""
        return (
            self.records()
            .select_for_update()
            .annotate(
                **{
                    _LEASE_REMAINING: ExpressionWrapper(
                        F("lease_until") - Now(), output_field=DurationField()
                    ),
                    _EXPIRED: ExpressionWrapper(expired_at_now(), output_field=BooleanField()),
                }
            )
        )


# What ``locked`` reads of the database's clock, taken off each record by ``found``.
_LEASE_REMAINING = "idempotency_lease_remaining"
_EXPIRED = "idempotency_expired"


def found(record: IdempotencyRecord) -> Found:
    """A record ``locked`` read, with what the database's clock said of it."""
    judged = record.__dict__
    return Found(record, bool(judged.pop(_EXPIRED)), judged.pop(_LEASE_REMAINING))


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
