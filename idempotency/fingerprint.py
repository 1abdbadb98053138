"""Canonical request fingerprints: equal intents hash equal, whatever the body's layout."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from decimal import Decimal
from typing import Any

from django.core.files.uploadedfile import UploadedFile
from django.utils.datastructures import MultiValueDict

from idempotency.conf import idempotency_settings
from idempotency.exceptions import RequestInvalid

# Numbers whose exponent lies in this range keep their plain decimal text ("0.5", "1200");
# beyond it the text would grow with the exponent ("1e400" is 401 characters), so they
# are written as digits and exponent ("1e400"). Either way the text is exact.
_PLAIN_EXPONENTS = range(-64, 65)


def fingerprint(parts: Iterable[str | bytes]) -> str:
    """SHA-256 hex of the parts, length-prefixed so that no two splits collide."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def parse_json(raw: bytes) -> Any:
    """Parse JSON keeping numbers exact; raises ``ValueError`` when it is not JSON.

    ``RequestInvalid`` when it is nested deeper than ``MAX_BODY_DEPTH``.
    """
    try:
        data = json.loads(raw, parse_float=Decimal, parse_int=Decimal)
    except RecursionError:
        raise _too_deep() from None
    check_depth(data)
    return data


def check_depth(data: Any, limit: int | None = None) -> None:
    """``RequestInvalid`` if lists and objects in ``data`` nest deeper than ``limit``.

    ``limit`` defaults to ``MAX_BODY_DEPTH``. Iterative: any depth is measured safely.
    """
    limit = idempotency_settings.MAX_BODY_DEPTH if limit is None else limit
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, Mapping):
            children: Iterable[Any] = value.values()
        elif isinstance(value, (list, tuple)):
            children = value
        else:
            continue
        if depth >= limit:
            raise _too_deep(limit)
        stack.extend((child, depth + 1) for child in children)


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
    check_depth(data)  # so that the recursion of _dump is bounded
    return _dump(data)


def _dump(value: Any) -> str:
    if isinstance(value, Mapping):
        items = sorted((str(key), item) for key, item in value.items())
        return "{" + ",".join(f"{json.dumps(key)}:{_dump(item)}" for key, item in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_dump(item) for item in value) + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int) and -_INT_PLAIN < value < _INT_PLAIN:
        return str(value)  # the text _number gives it, faster
    if isinstance(value, (int, float, Decimal)):
        return _number(Decimal(str(value)) if isinstance(value, float) else Decimal(value))
    if isinstance(value, UploadedFile):
        return json.dumps(f"file:{value.name}:{_file_digest(value)}")
    return json.dumps(str(value))


_INT_PLAIN = 10**_PLAIN_EXPONENTS.stop


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
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite
    significant = len(digits)
    while digits[significant - 1] == 0:  # trailing zeros belong to the exponent
        significant -= 1
    exponent += len(digits) - significant
    digits = digits[:significant]
    if exponent in _PLAIN_EXPONENTS:
        return f"{Decimal((sign, digits, exponent)):f}"
    return f"{'-' if sign else ''}{''.join(map(str, digits))}e{exponent}"


def _file_digest(upload: UploadedFile) -> str:
    digest = fingerprint(upload.chunks())
    upload.seek(0)
    return digest
