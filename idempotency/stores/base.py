"""The interface between the idempotency protocol and the database holding the records.

The protocol decides what happens to a key; a store only talks to the database.
One store is made per database alias (``idempotency.stores.store_for``) and
kept: a store may compose and cache its statements once.

The contract every store keeps:

- One store serves every thread: it keeps no connection, cursor or
  per-request state (``self.connection`` looks the thread's connection up
  each time), only what is the same for the whole alias (composed SQL), and
  the cursor ``statements`` opened, for the context that is inside it.
- Every method works on ``self.alias``, inside the caller's transaction when
  there is one. None opens, commits or rolls back a transaction, except where
  its docstring says so.
- A record's owner is the attempt whose ``owner_token`` it holds. Every write
  made for an owner (``renew``, ``finish``, ``release``, ``discard``) is
  conditional on ``owner_token = token AND status = 'PROCESSING'`` (fencing)
  and returns whether it landed; a write that did not land changed nothing.
- Lease lengths and retention windows are ``timedelta``s added to the
  database's clock, never to this process's.
- Records a store returns are model instances made by the ORM (a queryset,
  ``.raw()``, ``Model.from_db`` or ``record_from_db``), bound to ``self.alias``;
  where the protocol must know what the database's clock says of one (its
  expiry, its lease), it comes as a ``Found``.
- The store is the one writer of ``IdempotencyRecord`` and ``IdempotencyStep``:
  every insert, update and delete of either table is a method here, and a
  record's steps never outlive it (whichever method deletes or replaces it).
- Errors are Django's (``django.db.DatabaseError`` and subclasses); a store
  does not turn them into ``KeyInUse``: ``contention`` tells the protocol what
  an error means, and the protocol decides what to answer (it claims again
  after a "retry" only in a transaction it opened itself, at most
  ``CLAIM_RETRIES`` times; inside the caller's transaction, or past that, 409).

A subclass adds a vendor's faster or safer statements; ``GenericStore``
(``idempotency.stores.generic``) is the ORM version of every method and the
one to subclass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from idempotency.conf import idempotency_settings
from idempotency.models import IdempotencyRecord, IdempotencyRecordQuerySet

# What a database error met while claiming means (``Store.contention``):
# "busy": the wait on the record's current holder ran past its bound, answer 409;
# "retry": the database gave up this transaction (a deadlock or serialization
# failure) and a new transaction may claim again.
Contention = Literal["busy", "retry"]

# The stores build records with it (its home is idempotency.compat).
__all__ = [
    "Candidate",
    "Contention",
    "Found",
    "Purged",
    "Store",
    "pauses",
    "schema",
    "transaction_pooled",
]


def schema(alias: str) -> str | None:
    """The schema the connection of ``alias`` is switched to (django-tenants), else ``None``."""
    name = getattr(connections[alias], "schema_name", None)
    return None if name is None else str(name)


def pauses(first: float, longest: float) -> Iterator[float]:
    """``first``, twice that, and so on up to ``longest``: the pauses of a bounded poll."""
    pause = first
    while True:
        yield pause
        pause = min(pause * 2, longest)


class Purged(NamedTuple):
    """What one purge batch did (``Store.delete_batch``)."""

    deleted: int
    last: Any  # the largest value of the batch's ordering among the deleted rows, or None
    picked: int  # rows the batch chose; deleted can be fewer where rows changed under it
    # (scope, idem_key) of the deleted rows, when the caller asked for them (a replay cache)
    keys: tuple[tuple[str, str], ...] = ()


class Found(NamedTuple):
    """A record holding a key, with what the database's clock says of it when it was read.

    ``expired``: the record is finished or retryable (``PURGEABLE``) and its
    ``expires_at`` has passed, so a claim takes the key as new.
    ``lease_remaining``: ``lease_until`` minus the database's clock (negative once
    the lease ran out), or ``None`` where the record holds no lease or the store
    did not read it (a record the claim inserted: it is this request's own).
    """

    record: IdempotencyRecord
    expired: bool = False
    lease_remaining: timedelta | None = None


class Candidate(NamedTuple):
    """The record a claim would insert: what the request fills in, and its owner's token.

    Every other column starts at the model's default (``status``
    ``PROCESSING``, one attempt, version 1) or, for the timestamps, at the
    database clock. Not a model instance: the claim's hot path makes the one
    instance it returns from the row the database answers with. A named tuple:
    made on every claim, it costs a fifth of a frozen dataclass.
    """

    scope: str
    idem_key: str
    operation: str
    request_hash: bytes
    request_method: str
    request_path: str
    owner_token: bytes


def transaction_pooled(alias: str) -> bool:
    """Whether ``alias`` reaches its database through a pooler in transaction mode (PgBouncer).

    ``TRANSACTION_POOLING`` says so; left at ``None``, the alias' own
    ``DISABLE_SERVER_SIDE_CURSORS`` does (what Django asks of a connection
    behind such a pooler). Each transaction may then run on another server
    connection: nothing that outlives a transaction (``LISTEN``, a session
    setting) may be relied on.
    """
    pooling = idempotency_settings.TRANSACTION_POOLING
    if pooling is not None:
        return pooling
    return bool(connections[alias].settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"))


class Store(ABC):
    """How one database alias claims, finishes, recovers and purges records."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    @property
    def db_system(self) -> str:
        """The database's name in telemetry (OpenTelemetry's ``db.system``): Django's vendor."""
        return self.connection.vendor

    @abstractmethod
    def statements(self) -> AbstractContextManager[None]:
        """While inside, the store's statements on this context's connection may share a cursor.

        The protocol wraps an atomic-mode attempt in it (claim, work, finish), so a
        store that can keep one cursor open for them need not make one per
        statement. ``GenericStore`` shares nothing.
        """

    # The claim

    @abstractmethod
    def claim(
        self,
        candidate: Candidate,
        *,
        lease: timedelta | None,
        lock_timeout: float,
        expires_in: timedelta | None = None,
    ) -> Found | None:
        """Insert ``candidate``, or read the committed record holding its key.

        ``candidate`` carries a fresh ``owner_token``; with ``lease`` the
        record is inserted with its lease taken (``lease_until`` = database
        clock + ``lease``). With ``expires_in`` (atomic mode: the window of a
        success) it is inserted with the expiry a success will keep, so that
        the finish need not change it (a store may ignore it: ``finish`` sets
        the expiry anyway). The insert
        waits at most ``lock_timeout`` seconds on a concurrent insert of the
        same key, and leaves the connection's own lock wait setting as it found it.

        Returns the inserted record (its ``owner_token`` is the candidate's)
        or the committed record holding the key (another token: read, not
        locked, its ``expired`` judged; its lease need not be). Returns ``None``
        when the store has no such statement (``GenericStore``) or the statement
        could not see the record holding the key (one committed after it
        started): the protocol then takes the locked path (``bounded_lock_wait``
        around ``insert_or_lock``). Outside a transaction the insert commits by itself.
        """

    @abstractmethod
    def read_final(self, scope: str, key: str) -> IdempotencyRecord | None:
        """The record holding (scope, key) if final (``SUCCEEDED``, ``FAILED_FINAL``) and live.

        One indexed read, no lock, in whatever transaction (or autocommit) the
        connection is in: a final record never changes, so it can be answered
        as read. ``None`` when there is no such record, it is not final, or its
        ``expires_at`` has passed by the database's clock (the key is new again).
        """

    @abstractmethod
    def insert_or_lock(self, candidate: Candidate) -> Found | None:
        """Insert ``candidate`` unless its key is taken, then lock the row holding the key.

        Runs inside a transaction (the protocol opens it). The unique constraint on
        (scope, idem_key) is the arbiter: of concurrent inserts exactly one
        lands; the others wait for it (as bounded by ``bounded_lock_wait``) and
        lock the winner's row. Returns that row, locked until the transaction
        ends, as ``lock`` finds it, or ``None`` when it vanished between the
        insert and the lock (purged: the protocol may try again).
        """

    @abstractmethod
    def lock(self, pk: int) -> Found:
        """The record ``pk``, locked until the transaction ends, its expiry and lease judged."""

    @abstractmethod
    def reclaim(
        self,
        record: IdempotencyRecord,
        token: bytes,
        *,
        lease: timedelta | None,
        fresh: Candidate | None = None,
    ) -> IdempotencyRecord | None:
        """Hand the locked ``record`` to the owner ``token`` as ``PROCESSING`` again.

        One more attempt, a new version, no outcome and no expiry; with
        ``lease`` a fresh lease. The caller holds the row's lock (it settled
        the record from ``insert_or_lock`` or ``lock``).

        With ``fresh`` (an expired record: the key is new again) the record
        becomes ``fresh``'s: its request, a first attempt, created now, no
        outcome, and the earlier request's steps deleted. That write is fenced
        as well: it lands only while the record is still expired by the
        database clock.

        Returns the record as the write left it (its ``created_at`` and lease
        as they were read: the database's clock set them), or ``None`` if the
        write did not land.
        """

    @abstractmethod
    def bounded_lock_wait(self, seconds: float) -> AbstractContextManager[None]:
        """While inside, a wait on a row lock gives up after ``seconds`` with a "busy" error.

        The caller's previous setting is put back on leaving. Where the
        database itself undoes the setting with the failed statement's
        rollback (PostgreSQL's transaction-local settings), a store may leave
        that to it when the body raises; a setting that outlives a rollback
        (a session variable) must be put back then too.
        """

    @abstractmethod
    def contention(self, error: DatabaseError) -> Contention | None:
        """What ``error``, raised while claiming, means for the key; ``None``: a real error."""

    # The owner's writes (fenced by ``token``)

    @abstractmethod
    def unsaved(self, candidate: Candidate) -> IdempotencyRecord:
        """``candidate``'s record, unsaved: what an attempt holds before its record is written."""

    @abstractmethod
    def insert_finished(
        self,
        candidate: Candidate,
        values: dict[str, Any],
        expires_in: timedelta | None,
        *,
        lock_timeout: float,
    ) -> IdempotencyRecord | None:
        """Insert ``candidate``'s record already finished (``values``, as ``finish`` takes them).

        The record written once, at the end of an atomic attempt's transaction
        (``IN_FLIGHT = "run"``). The insert waits at most ``lock_timeout`` seconds on
        a concurrent uncommitted insert of the same key (a "busy" error past it):
        the record, or ``None`` when a committed record holds the key (the caller
        rolls its transaction back). Its ``completed_at`` and ``expires_at`` are the
        database's clock and are not read back.
        """

    @abstractmethod
    def renew(self, pk: int, token: bytes, lease: timedelta) -> bool:
        """Set the lease to end ``lease`` from now, by the database clock."""

    @abstractmethod
    def finish(
        self, pk: int, token: bytes, values: dict[str, Any], expires_in: timedelta | None
    ) -> bool:
        """Record the outcome: ``values`` by field name, no lease, completed now.

        ``values`` holds ``status``, ``response_status``, ``response_headers``,
        ``response_body`` and ``resource_id`` (Python values, as the model's
        fields take them). ``expires_in`` is the retention window (``None``:
        kept until an operator acts). ``version`` goes up by one.
        """

    @abstractmethod
    def release(self, pk: int, token: bytes, expires_in: timedelta | None) -> bool:
        """Leave the record ``FAILED_RETRYABLE``: the same request may claim it again."""

    @abstractmethod
    def discard(self, pk: int, token: bytes) -> bool:
        """Delete the record and its steps: nothing was recorded and the key is free again."""

    # Duplicates that wait for an in-flight attempt's outcome

    @abstractmethod
    def wait_for_outcome(self, scope: str, key: str, seconds: float) -> None:
        """Return once (scope, key)'s record may no longer be in flight, or after ``seconds``.

        In flight means ``PROCESSING`` with a live lease. Called outside any
        transaction (the protocol never waits inside one); it opens none and holds
        no lock while it waits, and never loops faster than a bounded poll.
        Returning early is harmless: the protocol claims again and waits again if
        the attempt still runs.
        """

    @abstractmethod
    def notify_waiters(self, scope: str, key: str) -> None:
        """Tell the requests waiting on (scope, key) that its record changed, if they can hear.

        Called after a finish or a release, for operations whose duplicates may wait.
        """

    def clock_offset(self) -> tuple[str, int] | None:
        """``(time zone, seconds off UTC)`` of the session's clock, where the database
        keeps datetimes in the session's time zone; ``None`` where it cannot be off."""
        return None

    # Purge

    @abstractmethod
    def delete_batch(
        self, batch: IdempotencyRecordQuerySet, ordering: str, *, keys: bool = False
    ) -> Purged:
        """Delete the rows of ``batch`` and their steps: purge's next batch, not yet evaluated.

        ``batch`` is locked and sliced (``select_for_update(skip_locked=True)``,
        ordered by the field named ``ordering``, at most the batch size), so
        rows a running request holds are skipped. Runs inside a transaction
        (``retention`` opens one per batch). Returns how many rows went, the
        largest ``ordering`` value among them, or ``None`` for it where the
        store does not track it (the next batch then scans from the start
        again, which is only slower), and how many rows the batch chose: fewer
        than its size only when no more were there, so that a row changed
        under the batch (not deleted) does not end the purge early. With
        ``keys``, also the deleted rows' (scope, key) pairs (for a replay cache).
        """

    @abstractmethod
    def delete_records(self, pks: Sequence[int]) -> int:
        """Delete the records ``pks`` and their steps, whatever their state: how many went.

        An operator's delete (the admin's). Records and steps go together or not at all.
        """

    @abstractmethod
    def delete_orphan_steps(self, limit: int) -> int:
        """Delete at most ``limit`` steps whose record is gone: how many went.

        Only an earlier release (or a hand-made ``DELETE``) could leave such steps;
        the purge sweeps them in batches of ``limit`` until a batch comes back short.
        """

    @abstractmethod
    def count_orphan_steps(self) -> int:
        """How many steps have no record (what ``delete_orphan_steps`` would take)."""

    # The moves made outside an attempt: recovery's and an operator's (``protocol.states``)

    @abstractmethod
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
        """Move ``seen`` to ``status`` under the new owner ``token``, if nothing moved it since.

        Fenced on the ``status`` and ``version`` it was read with, and a
        ``PROCESSING`` record only once its lease ran out by the database's clock
        (a live owner is never overtaken; the new token fences it off). The record
        holds no lease after it, expires ``expires_in`` from now (``None``: never),
        is completed now when ``status`` is final (``REPLAYABLE``), gets
        ``columns`` (an outcome's: ``resource_id``, ``response_*``) and, when
        ``recovered``, one more recovery attempt; ``version`` goes up by one.
        Returns the record as written, read back, or ``None`` if the write did not land.
        """

    @abstractmethod
    def postpone(self, seen: IdempotencyRecord, lease: timedelta) -> IdempotencyRecord | None:
        """Leave ``seen`` in flight with its owner, its lease ending ``lease`` from now.

        Recovery's answer to "unknown": one more recovery attempt; fenced as ``settle``.
        """

    # Calls to other idempotent APIs (``idempotency.steps``): a request's seed, its steps

    @abstractmethod
    def seed(self, pk: int, token: bytes | None = None) -> str | None:
        """The seed of the request record ``pk`` holds now, if one was written.

        With ``token``, only while that owner holds the record in flight (fenced).
        """

    @abstractmethod
    def seeded_at(self, pk: int) -> datetime | None:
        """When the seed of the request record ``pk`` holds now was written, if it was."""

    @abstractmethod
    def plant_seed(self, pk: int, token: bytes, seed: str) -> str | None:
        """Write ``seed`` for the request ``token`` holds, unless it has one: the seed it keeps.

        Opens and commits a transaction of its own, the record locked: a seed must
        be committed before a key derived from it reaches a provider. ``None`` when
        ``token`` no longer holds the record in flight.
        """

    @abstractmethod
    def recorded_step(self, pk: int, step_key: str) -> str | None:
        """The result (JSON text) recorded for ``step_key`` under record ``pk``, or ``None``."""

    @abstractmethod
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
        """Record a step's ``result`` while ``token`` holds the record in flight.

        In a transaction of its own, the record locked. A step recorded already
        keeps its first result. ``False`` when ``token`` no longer holds the record.
        """
