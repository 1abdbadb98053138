"""Errors of the idempotency protocol. They know nothing of HTTP; ``http.py`` maps them."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.db import OperationalError


class IdempotencyError(Exception):
    """The protocol's errors: each has a stable ``code``, a ``title`` and a ``detail``."""

    code = "idempotency_error"
    title = "Idempotency error"
    default_detail = "The request could not be processed idempotently."

    def __init__(self, detail: str | None = None) -> None:
        self.detail = detail or self.default_detail
        super().__init__(self.detail)


class KeyMissing(IdempotencyError):
    """The view requires an idempotency key and the request carries none (400)."""

    code = "idempotency_key_missing"
    title = "Idempotency key missing"
    default_detail = "This operation requires an idempotency key."


class KeyInvalid(IdempotencyError):
    """The key is malformed: empty, too long, or not visible ASCII (400)."""

    code = "idempotency_key_invalid"
    title = "Idempotency key invalid"
    default_detail = "The idempotency key is malformed."


class KeyInUse(IdempotencyError):
    """Another attempt holds the key right now (409, with ``retry_after`` seconds)."""

    code = "idempotency_key_in_use"
    title = "Idempotency key in use"
    default_detail = "A request with this idempotency key is still being processed; retry later."

    def __init__(self, detail: str | None = None, *, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = max(1, int(retry_after))


class KeyUnderReview(IdempotencyError):
    """The first attempt's outcome is unknown and waits for an operator (409, no ``retry_after``).

    Not a ``KeyInUse``: nothing is running, so no wait of a client's tells; the key
    answers again once an operator (the admin, ``resolve_record``) has settled it.
    """

    code = "idempotency_key_under_review"
    title = "Idempotency key under review"
    default_detail = (
        "The first request with this idempotency key was interrupted and its outcome is "
        "unknown; an operator is reviewing it. Retrying will get this answer until they "
        "have resolved it."
    )


class KeyReused(IdempotencyError):
    """The key was first used for another request: another body or route (422)."""

    code = "idempotency_key_reused"
    title = "Idempotency key reused"
    default_detail = "This idempotency key was already used with a different request."


class RequestInvalid(IdempotencyError):
    """The request (or a function's arguments) cannot be fingerprinted: nested too deeply."""

    code = "idempotency_request_invalid"
    title = "Request invalid"
    default_detail = "The request body cannot be read as data: it is nested too deeply."


class ScopeUnavailable(IdempotencyError):
    """The request has no caller to scope its key to, e.g. anonymous (403)."""

    code = "idempotency_scope_unavailable"
    title = "Idempotency scope unavailable"
    default_detail = (
        "Idempotent requests must come from a known caller, and this request has none: "
        "authenticate it (log in and send the session cookie with its CSRF token, or use the "
        "API's authentication, such as a token), or give the view a scope function "
        "(scope= or the SCOPE_FUNCTION setting) that names the caller."
    )


class LeaseLost(IdempotencyError):
    """A stale owner tried to write a record it no longer holds; nothing was changed."""

    code = "idempotency_lease_lost"
    title = "Idempotency lease lost"
    default_detail = "The record is no longer held by this attempt; its outcome was not written."


class TransitionNotAllowed(IdempotencyError):
    """The record's state machine refuses this move, or the record changed meanwhile."""

    code = "idempotency_transition_not_allowed"
    title = "Transition not allowed"
    default_detail = "The record's state does not allow this transition."


class DatabaseUnavailable(IdempotencyError, OperationalError):
    """The database failed under the request (connection lost, server restart, a timeout).

    Raised before the request's outcome was committed: in atomic mode the claim
    rolled back with the work; in lease mode the record is released, or stays
    claimable once its lease ends. A failure at the commit itself is
    ``OutcomeUnknown``. The client retries with the same key after
    ``retry_after`` seconds. Still an ``OperationalError`` (raised from the
    original), so code that retries on one (``autoretry_for``) keeps doing so.
    """

    code = "database_unavailable"
    title = "Database unavailable"
    default_detail = "The database is unavailable. Retry with the same idempotency key."

    def __init__(self, detail: str | None = None, *, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = max(1, int(retry_after))


class OutcomeUnknown(DatabaseUnavailable):
    """The connection was lost while the outcome was being committed (503, ``retry_after``).

    The database may have committed it and lost only its acknowledgement (a
    primary that died at ``COMMIT``, a failover), or not: nobody can tell from
    here. A retry with the same key is answered with the recorded outcome if
    there is one, and runs if there is none; a retry under a new key could
    carry the request out twice. A ``DatabaseUnavailable`` too, so everything
    that retries one retries this.
    """

    code = "outcome_unknown"
    title = "Outcome unknown"
    default_detail = (
        "The connection to the database was lost while this request's outcome was being "
        "committed: it may or may not have been recorded. Retry with the same idempotency key "
        "to get the recorded outcome, or to run the request if there is none; never with a "
        "new key."
    )


class CrossDatabaseWrite(ImproperlyConfigured):
    """An atomic-mode attempt wrote to a database that does not hold its record."""
