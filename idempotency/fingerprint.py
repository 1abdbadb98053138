"""Canonical request fingerprints: equal intents hash equal, whatever the body's layout."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from decimal import Decimal
from json.encoder import encode_basestring_ascii as _quote  # what json.dumps(str) returns
from typing import Any

from django.core.files.uploadedfile import UploadedFile
from django.utils.datastructures import MultiValueDict


def fingerprint(parts: Iterable[str | bytes]) -> str:
    """SHA-256 hex of the parts, length-prefixed so that no two splits collide."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def parse_json(raw: bytes) -> Any:
    """Parse JSON keeping numbers exact; raises ``ValueError`` when it is not JSON."""
    return json.loads(raw, parse_float=Decimal, parse_int=Decimal)


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
    return _dump(data)


def _dump(value: Any) -> str:
    if isinstance(value, str):  # the commonest leaf first
        return _quote(value)
    if isinstance(value, Mapping):
        items = sorted((str(key), item) for key, item in value.items())
        return "{" + ",".join(f"{_quote(key)}:{_dump(item)}" for key, item in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_dump(item) for item in value) + "]"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float, Decimal)):
        return _number(Decimal(str(value)) if isinstance(value, float) else Decimal(value))
    if isinstance(value, UploadedFile):
        return _quote(f"file:{value.name}:{_file_digest(value)}")
    return _quote(str(value))


def _number(value: Decimal) -> str:
    # 1, 1.0, 1.00 and 1e0 are the same number: give them the same text.
    if not value.is_finite():
        return json.dumps(str(value))
    if value.is_zero():
        return "0"
    return f"{value.normalize():f}"


def _file_digest(upload: UploadedFile) -> str:
    digest = fingerprint(upload.chunks())
    upload.seek(0)
    return digest
