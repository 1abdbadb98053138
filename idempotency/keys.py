"""Parsing and validation of client-supplied idempotency keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from idempotency.exceptions import IdempotencyError, KeyInvalid

_FORBIDDEN = {",", '"'}
# Every visible ASCII character but the forbidden ones, deleted by ``str.translate``:
# a valid key translates to nothing (one C call instead of a loop per character).
_ALLOWED = str.maketrans(
    dict.fromkeys(chr(code) for code in range(0x21, 0x7F) if chr(code) not in _FORBIDDEN)
)


def parse_key(raw: str, *, max_length: int) -> str:
    """Return the key carried by a header value, or raise ``KeyInvalid``.

    Accepts the bare form (``abc``) and the Structured Field string form
    (``"abc"``) used by the IETF draft; both give the same key.
    """
    value = raw.strip(" \t")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = _unquote(value[1:-1])
    validate_key(value, max_length=max_length)
    return value


def validate_key(key: str, *, max_length: int) -> None:
    if not key:
        raise KeyInvalid("The idempotency key must not be empty.")
    if len(key) > max_length:
        raise KeyInvalid(f"The idempotency key must be at most {max_length} characters long.")
    if key.translate(_ALLOWED):
        raise KeyInvalid(
            "The idempotency key may only contain visible ASCII characters "
            "(0x21 to 0x7E) other than ',' and '\"'."
        )


def checked_key(key: object, function: Callable[..., Any], owner: str = "") -> str:
    """``key`` if a key function returned a non-empty string; else ``KeyInvalid`` naming it.

    ``str(None)`` would make every call without an id share the one key "None".
    """
    if isinstance(key, str) and key:
        return key
    found = "an empty string" if key == "" else f"{key!r} ({type(key).__name__})"
    raise KeyInvalid(
        f"{_named(function, owner)} returned {found}: it should return the key as a "
        "non-empty string, never a value that many calls could share."
    )


def call_key_function(
    function: Callable[..., Any],
    call: Callable[[], object],
    owner: str = "",
    passes: Callable[[Exception], bool] = lambda exc: False,
) -> object:
    """What ``call()``, a call of the key function ``function``, returns.

    If it raises (``lambda event: event["id"]`` on an event without one), the
    ``KeyInvalid`` that a ``None`` key gets, naming the function and the exception,
    before anything is recorded. The protocol's own errors, the database's and
    those ``passes`` accepts (a framework's 4xx) go on as they are.
    """
    try:
        return call()
    except (IdempotencyError, DatabaseError):
        raise
    except Exception as exc:
        if passes(exc):
            raise
        raise KeyInvalid(
            f"{_named(function, owner)} raised {type(exc).__name__}: {exc}. It should return "
            "the key as a non-empty string (or None where the key may be missing)."
        ) from exc


def _named(function: Callable[..., Any], owner: str) -> str:
    name = getattr(function, "__qualname__", None) or repr(function)
    module = getattr(function, "__module__", None)
    where = f"{module}.{name}" if module else name
    of = f" of {owner}" if owner else ""
    return f"The key function{of}, {where},"


def _unquote(inner: str) -> str:
    chars: list[str] = []
    escaped = False
    for char in inner:
        if escaped:
            if char not in {"\\", '"'}:
                raise KeyInvalid("The quoted idempotency key has an invalid escape sequence.")
            chars.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        else:
            chars.append(char)
    if escaped:
        raise KeyInvalid("The quoted idempotency key ends with a lone backslash.")
    return "".join(chars)
