"""Lazy access to the ``IDEMPOTENCY = {...}`` settings dict.

Every property reads ``django.conf.settings`` on access, so ``override_settings``
works and nothing is read at import time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

DEFAULTS: dict[str, Any] = {
    "HEADER": "Idempotency-Key",
    "MAX_KEY_LENGTH": 255,
    "REQUIRE_KEY": True,
    "MODE": "atomic",
    "LOCK_TIMEOUT": 2.0,
    "RETRY_AFTER": 1,
    "WAIT_SECONDS": 0.0,
    "IN_FLIGHT": "wait",
    "MAX_WAITERS": 8,
    "LEASE_SECONDS": 60.0,
    "MAX_RESPONSE_BYTES": 256 * 1024,
    "MAX_BODY_DEPTH": 100,
    "REPLAY_HEADERS": [
        "Content-Type",
        "Content-Language",
        "Location",
        "Link",
        "ETag",
        "Last-Modified",
    ],
    "SCOPE_FUNCTION": "idempotency.http.default_scope",
    "FINGERPRINT_FUNCTION": "idempotency.http.default_fingerprint",
    "OUTCOME_POLICY": "idempotency.http.default_outcome_policy",
    "ERROR_FORMAT": "problem",
    "DATABASE": None,
    "TRANSACTION_POOLING": None,
    "RESOLVERS": {},
    "MAX_RESOLVE_ATTEMPTS": 5,
    "RESOLVE_RETRY_SECONDS": 60.0,
    "RELEASE_EXPIRED_WITHOUT_RESOLVER": False,
    "RECOVERY_BATCH_SIZE": 100,
    "PURGE_BATCH_SIZE": 1000,
    "RETENTION": {
        "SUCCEEDED": 24 * 3600,
        "FAILED_FINAL": 24 * 3600,
        "FAILED_RETRYABLE": 24 * 3600,
    },
    "OPERATION_RETENTION": {},
    "REPLAY_CACHE": None,
}

# Headers that carry a session or a credential: never stored, never replayed,
# whatever REPLAY_HEADERS says.
FORBIDDEN_REPLAY_HEADERS = frozenset(
    {
        "set-cookie",
        "cookie",
        "authorization",
        "proxy-authorization",
        "www-authenticate",
        "proxy-authenticate",
        "x-csrftoken",
        "idempotent-replayed",
    }
)


# RFC 9110 section 5.1: a field name is a token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def is_header_name(value: object) -> bool:
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None


class Settings:
    def _get(self, name: str) -> Any:
        user = getattr(django_settings, "IDEMPOTENCY", None) or {}
        return user.get(name, DEFAULTS[name])

    @property
    def HEADER(self) -> str:
        return str(self._get("HEADER"))

    @property
    def MAX_KEY_LENGTH(self) -> int:
        return int(self._get("MAX_KEY_LENGTH"))

    @property
    def REQUIRE_KEY(self) -> bool:
        return bool(self._get("REQUIRE_KEY"))

    @property
    def MODE(self) -> str:
        return str(self._get("MODE"))

    @property
    def LOCK_TIMEOUT(self) -> float:
        return float(self._get("LOCK_TIMEOUT"))

    @property
    def RETRY_AFTER(self) -> int:
        return int(self._get("RETRY_AFTER"))

    @property
    def WAIT_SECONDS(self) -> float:
        return float(self._get("WAIT_SECONDS"))

    @property
    def IN_FLIGHT(self) -> str:
        return str(self._get("IN_FLIGHT"))

    @property
    def MAX_WAITERS(self) -> int:
        return int(self._get("MAX_WAITERS"))

    @property
    def LEASE_SECONDS(self) -> float:
        return float(self._get("LEASE_SECONDS"))

    @property
    def MAX_RESPONSE_BYTES(self) -> int:
        return int(self._get("MAX_RESPONSE_BYTES"))

    @property
    def MAX_BODY_DEPTH(self) -> int:
        return int(self._get("MAX_BODY_DEPTH"))

    @property
    def REPLAY_HEADERS(self) -> frozenset[str]:
        names: Sequence[str] = self._get("REPLAY_HEADERS")
        return frozenset(name.lower() for name in names) - FORBIDDEN_REPLAY_HEADERS

    @property
    def SCOPE_FUNCTION(self) -> Callable[..., Any]:
        return load_callable(self._get("SCOPE_FUNCTION"), "SCOPE_FUNCTION")

    @property
    def FINGERPRINT_FUNCTION(self) -> Callable[..., Any]:
        return load_callable(self._get("FINGERPRINT_FUNCTION"), "FINGERPRINT_FUNCTION")

    @property
    def OUTCOME_POLICY(self) -> Callable[..., Any]:
        return load_callable(self._get("OUTCOME_POLICY"), "OUTCOME_POLICY")

    @property
    def ERROR_FORMAT(self) -> str:
        return str(self._get("ERROR_FORMAT"))

    @property
    def DATABASE(self) -> str | None:
        value = self._get("DATABASE")
        return None if value is None else str(value)

    @property
    def TRANSACTION_POOLING(self) -> bool | None:
        value = self._get("TRANSACTION_POOLING")
        return None if value is None else bool(value)

    @property
    def RESOLVERS(self) -> dict[str, str]:
        return dict(self._get("RESOLVERS"))

    @property
    def MAX_RESOLVE_ATTEMPTS(self) -> int:
        return int(self._get("MAX_RESOLVE_ATTEMPTS"))

    @property
    def RESOLVE_RETRY_SECONDS(self) -> float:
        return float(self._get("RESOLVE_RETRY_SECONDS"))

    @property
    def RELEASE_EXPIRED_WITHOUT_RESOLVER(self) -> bool:
        return bool(self._get("RELEASE_EXPIRED_WITHOUT_RESOLVER"))

    @property
    def RECOVERY_BATCH_SIZE(self) -> int:
        return int(self._get("RECOVERY_BATCH_SIZE"))

    @property
    def PURGE_BATCH_SIZE(self) -> int:
        return int(self._get("PURGE_BATCH_SIZE"))

    @property
    def RETENTION(self) -> dict[str, float]:
        merged = dict(DEFAULTS["RETENTION"])
        merged.update(self._get("RETENTION"))
        return merged

    @property
    def OPERATION_RETENTION(self) -> dict[str, dict[str, float]]:
        return dict(self._get("OPERATION_RETENTION"))

    @property
    def REPLAY_CACHE(self) -> str | None:
        value = self._get("REPLAY_CACHE")
        return None if value is None else str(value)


def load_callable(value: Any, setting: str) -> Callable[..., Any]:
    if callable(value):
        return value
    return _import(str(value), setting)


@lru_cache(maxsize=64)
def _import(path: str, setting: str) -> Callable[..., Any]:
    try:
        return import_string(path)  # type: ignore[no-any-return]
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"IDEMPOTENCY[{setting!r}] = {path!r} could not be imported: {exc}"
        ) from exc


idempotency_settings = Settings()
