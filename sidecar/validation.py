"""Checks shared by every request that carries ids and numbers.

Ids become parts of LMDB keys, separated by NUL bytes, so an id may not contain NUL (nor any
other control character): that is what keeps one tenant's or run's key range from ever
overlapping another's.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sidecar.errors import ValidationError

MAX_ID_BYTES = 256
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def check_id(field: str, value: str, *, required: bool = True, max_bytes: int = MAX_ID_BYTES) -> bytes:
    """Return the id's UTF-8 bytes, or raise naming ``field``. An optional id may be empty."""
    if not value:
        if required:
            raise ValidationError.field(field, "is required")
        return b""
    encoded = value.encode("utf-8")
    if len(encoded) > max_bytes:
        raise ValidationError.field(field, f"is {len(encoded)} bytes; at most {max_bytes} are allowed")
    if _CONTROL_CHARACTERS.search(value):
        raise ValidationError.field(field, "contains a control character")
    return encoded


def check_at_least(field: str, value: int, minimum: int) -> int:
    if value < minimum:
        raise ValidationError.field(field, f"must be at least {minimum}, got {value}")
    return value


DEFAULT_PAGE = 100
MAX_PAGE = 1000


def page_size(field: str, value: int) -> int:
    """A list call's page size: 0 means the default (100), and no page holds more than 1000."""
    return min(check_at_least(field, value, 0) or DEFAULT_PAGE, MAX_PAGE)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str) -> Any:
    """Parse JSON as providers do: Python's json accepts NaN and Infinity, which they reject."""
    return json.loads(text, parse_constant=_no_constant)
