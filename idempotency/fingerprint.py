"""Canonical request fingerprints: equal intents hash equal, whatever the body's layout."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, InvalidOperation
from json.encoder import encode_basestring_ascii as _quote  # what json.dumps(str) returns
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.files.uploadedfile import UploadedFile
from django.utils.datastructures import MultiValueDict

from idempotency.conf import idempotency_settings
from idempotency.exceptions import RequestInvalid

# Numbers whose leading digit's exponent lies in this range keep their plain decimal text
# ("0.5", "1200"); beyond it the text would grow with the exponent (1e400 has 401 digits),
# so they are written in scientific notation ("1e+400"). Either way the text is exact.
_PLAIN_EXPONENTS = range(-64, 65)


def fingerprint(parts: Iterable[str | bytes]) -> str:
    """SHA-256 hex of the parts, length-prefixed so that no two splits collide."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


# A record keeps 128 bits of a request's fingerprint: ample to tell two payloads sent
# with one key apart (a collision by chance is a 2**-64 event after 2**32 payloads
# under one key), at a quarter of the SHA-256 hexadecimal text's bytes.
DIGEST_BYTES = 16


def digest_of(fingerprint: str | bytes) -> bytes:
    """The bytes a record keeps of a fingerprint: hexadecimal text, or a digest's bytes.

    ``ImproperlyConfigured`` for anything shorter than 128 bits or text that is not
    hexadecimal: a ``FINGERPRINT_FUNCTION`` or ``Operation(request_hash=...)`` that
    returns another kind of value would otherwise be cut to nonsense silently.
    """
    try:
        digest = bytes.fromhex(fingerprint) if isinstance(fingerprint, str) else bytes(fingerprint)
    except ValueError:
        digest = b""
    if len(digest) < DIGEST_BYTES:
        raise ImproperlyConfigured(
            f"A request fingerprint should be a digest of at least {DIGEST_BYTES * 8} bits, "
            f"as hexadecimal text or bytes (FINGERPRINT_FUNCTION returns SHA-256 hex); got "
            f"{fingerprint!r:.80}."
        )
    return digest[:DIGEST_BYTES]


def parse_json(raw: bytes) -> Any:
    """Parse JSON keeping numbers exact; raises ``ValueError`` when it is not JSON.

    ``RequestInvalid`` when its bytes are not valid Unicode text or it is nested
    deeper than ``MAX_BODY_DEPTH``.
    """
    text = decode_json(raw)
    try:
        data = json.loads(text, parse_float=_decimal, parse_int=_decimal)
    except RecursionError:
        raise _too_deep() from None
    check_depth(data)
    return data


def decode_json(raw: bytes) -> str:
    """The text of a JSON body, decoded strictly; ``RequestInvalid`` for bytes that are not.

    ``json.loads`` on bytes decodes with ``surrogatepass``: an encoded surrogate
    (``b"\\xed\\xa0\\x80"``) would become a string no database or encoder takes back.
    UTF-8 as RFC 8259 requires, or the UTF-16/32 that ``json`` detects by its zeros.
    """
    encoding = json.detect_encoding(raw)
    try:
        return raw.decode(encoding, errors="strict")
    except UnicodeDecodeError as exc:
        raise RequestInvalid(
            f"The request body is not valid {encoding.upper()} text (byte {exc.start}: "
            f"{exc.reason}); send JSON encoded as UTF-8."
        ) from None


def _decimal(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:  # an exponent past what any decimal holds (10**18)
        raise RequestInvalid(
            f"The request body holds the number {text[:40]}, whose exponent is out of range."
        ) from None


def check_depth(data: Any, limit: int | None = None) -> None:
    """``RequestInvalid`` if the lists and objects of parsed JSON nest deeper than ``limit``.

    ``limit`` defaults to ``MAX_BODY_DEPTH``. Iterative: any depth is measured safely.
    """
    limit = idempotency_settings.MAX_BODY_DEPTH if limit is None else limit
    if not isinstance(data, (dict, list)):
        return
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            raise _too_deep(limit)
        for child in value.values() if isinstance(value, dict) else value:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))


def _too_deep(limit: int | None = None) -> RequestInvalid:
    limit = idempotency_settings.MAX_BODY_DEPTH if limit is None else limit
    return RequestInvalid(
        f"The request body nests lists or objects more than {limit} levels deep; "
        "send it with fewer levels."
    )


def canonical(
    data: Any,
    *,
    include: Collection[str] | None = None,
    exclude: Collection[str] = (),
) -> str:
    """Canonical text of parsed request data: sorted keys, no whitespace, normalized numbers.

    ``include``/``exclude`` select the top-level fields that take part.
    """
    if isinstance(data, MultiValueDict):
        data = {name: data.getlist(name) for name in data}
    if isinstance(data, Mapping):
        data = {
            name: value
            for name, value in data.items()
            if (include is None or name in include) and name not in exclude
        }
    return _dump(data, idempotency_settings.MAX_BODY_DEPTH)


def _dump(value: Any, room: int) -> str:
    """The canonical text of ``value``, which may nest ``room`` more levels (bounded)."""
    if isinstance(value, str):  # the commonest leaf first
        return _quote(value)
    if isinstance(value, Mapping):
        if not room:
            raise _too_deep()
        items = sorted((str(key), item) for key, item in value.items())
        inner = ",".join(f"{_quote(key)}:{_dump(item, room - 1)}" for key, item in items)
        return "{" + inner + "}"
    if isinstance(value, (list, tuple)):
        if not room:
            raise _too_deep()
        return "[" + ",".join(_dump(item, room - 1) for item in value) + "]"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int) and -_INT_PLAIN < value < _INT_PLAIN:
        return str(value)  # the text _number gives it, faster
    if isinstance(value, (int, float, Decimal)):
        return _number(Decimal(str(value)) if isinstance(value, float) else Decimal(value))
    if isinstance(value, UploadedFile):
        return _quote(f"file:{value.name}:{_file_digest(value)}")
    return _quote(str(value))


_INT_PLAIN = 10**_PLAIN_EXPONENTS.stop
# Enough precision and range for any number a parser gives: normalising rounds nothing.
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


def _number(value: Decimal) -> str:
    """One exact text per number: 1, 1.0, 1.00 and 1e0 are the same number; 1e400 is not 1e401.

    NaN and the infinities (which some parsers accept) are written unquoted, as
    JavaScript names them: never the text of the strings "NaN" or "Infinity".
    """
    if value.is_nan():
        return "NaN"
    if value.is_infinite():
        return "-Infinity" if value.is_signed() else "Infinity"
    if value.is_zero():
        return "0"
    exact = value.normalize(_EXACT)  # trailing zeros into the exponent, never rounded
    return f"{exact:f}" if exact.adjusted() in _PLAIN_EXPONENTS else f"{exact:e}"


def _file_digest(upload: UploadedFile) -> str:
    digest = fingerprint(upload.chunks())
    upload.seek(0)
    return digest
