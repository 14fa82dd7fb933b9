"""Checks shared by every request that carries ids and numbers.

Ids become parts of LMDB keys, separated by NUL bytes, so an id may not contain NUL (nor any
other control character): that is what keeps one tenant's or run's key range from ever
overlapping another's.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import jsonschema
import regex

from sidecar.errors import ValidationError

T = TypeVar("T")
MAX_ID_BYTES = 256
MAX_COUNT = 2**31 - 1  # counts, sequence numbers and token figures travel as int32 on the wire
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")

# The longest run a text may hold of letters (and marks), of whitespace, or of other symbols (and
# marks): tiktoken's pre-tokeniser cuts text into pieces inside such runs only, and its BPE of one
# piece costs more than linearly in its length (one 8 MiB word: ~10 s of CPU; 1 MiB of spaces
# overflowed its regex's stack). Within it, cost grows with the log of a run's length: 8 MiB of
# random letters in runs of this length cost ~4x the CPU of 8-letter random words (16K: ~3x), and
# the counts stay tiktoken's own. A run this long is rare in text (a line of a genome at most).
MAX_UNBROKEN_RUN = 65_536
_RUN_STEP = MAX_UNBROKEN_RUN // 2  # a longer run holds two consecutive multiples of it
_RUN_CLASSES = {"letters": r"\p{L}\p{M}", "whitespace": r"\s", "symbols": r"^\s\p{L}\p{N}"}
_RUNS = {name: regex.compile(f"[{members}]*") for name, members in _RUN_CLASSES.items()}


def check_id(field: str, value: str, *, required: bool = True, max_bytes: int = MAX_ID_BYTES) -> bytes:
    """Return the id's UTF-8 bytes, or raise naming ``field``. An optional id may be empty."""
    if not value:
        if required:
            raise ValidationError.field(field, "is required")
        return b""
    encoded = value.encode("utf-8")
    _check_size(field, len(encoded), max_bytes)
    if _CONTROL_CHARACTERS.search(value):
        raise ValidationError.field(field, "contains a control character")
    return encoded


def check_text_bytes(field: str, text: str, limit: int, setting: str = "") -> str:
    """The text, when its UTF-8 form is at most ``limit`` bytes and it holds no run longer than
    ``MAX_UNBROKEN_RUN``; else the error naming ``field`` and, when a setting sets the limit,
    that setting."""
    _check_size(field, len(text.encode("utf-8")), limit, setting)
    check_unbroken_runs(field, text)
    return text


def check_unbroken_runs(field: str, text: str) -> None:
    """Refuse, naming ``field``, a text holding a run of more than ``MAX_UNBROKEN_RUN`` letters,
    whitespace or symbols. Linear, and nearly free below the limit: only the characters at
    multiples of half the limit start a scan, each run is scanned once from the first of them it
    holds, and that one lies within half the limit of the run's start."""
    if len(text) <= MAX_UNBROKEN_RUN:
        return
    for name, run in _RUNS.items():
        scanned_to = 0
        for at in range(0, len(text), _RUN_STEP):
            if at < scanned_to:
                continue  # inside the run scanned last
            end = run.match(text, at).end()
            scanned_to = end
            if end - at + _RUN_STEP <= MAX_UNBROKEN_RUN:
                continue  # the run began less than a step before ``at``
            start = at - run.match(text[max(0, at - _RUN_STEP):at][::-1]).end()
            if end - start > MAX_UNBROKEN_RUN:
                raise ValidationError.field(
                    field, f"holds an unbroken run of {end - start} {name} from character {start}; at most "
                    f"{MAX_UNBROKEN_RUN} are allowed (tokenizers cannot split such a run cheaply): break it up")


def _check_size(field: str, size: int, limit: int, setting: str = "") -> None:
    if size > limit:
        raise ValidationError.field(field, f"is {size} bytes; at most {limit} are allowed"
                                    + (f" ({setting})" if setting else ""))


def check_at_least(field: str, value: int, minimum: int) -> int:
    if value < minimum:
        raise ValidationError.field(field, f"must be at least {minimum}, got {value}")
    return value


def check_at_most(field: str, value: int, maximum: int, why: str = "") -> int:
    if value > maximum:
        raise ValidationError.field(field, f"must be at most {maximum}{f' ({why})' if why else ''}, got {value}")
    return value


DEFAULT_PAGE = 100
MAX_PAGE = 1000


def page_size(field: str, value: int) -> int:
    """A list call's page size: 0 means the default (100), and no page holds more than 1000."""
    return min(check_at_least(field, value, 0) or DEFAULT_PAGE, MAX_PAGE)


# Every list answer stays within gRPC's default receive limit (4 MiB), so a client left at its
# defaults reads every page; a page still holds at least one item, however large.
MAX_PAGE_BYTES = 4 * 1024 * 1024
_ITEM_FRAMING_BYTES = 16  # a repeated field's tag and length, with room to spare
_PAGE_HEAD_BYTES = 64  # the answer's other fields (the cursor, counts)


def page_within_bytes(items: Iterable[T], size: Callable[[T], int] = len,  # type: ignore[assignment]
                      max_bytes: int = MAX_PAGE_BYTES) -> tuple[list[T], bool]:
    """The leading ``items`` whose encodings (``size`` each, framing added) fit in ``max_bytes``,
    always at least the first, taken lazily (at most one item past the page is read); and
    whether any item was left over."""
    page: list[T] = []
    total = _PAGE_HEAD_BYTES
    for item in items:
        total += size(item) + _ITEM_FRAMING_BYTES
        if page and total > max_bytes:
            return page, True
        page.append(item)
    return page, False


# How deeply JSON input may nest (objects and arrays). Every JSON text a request carries is
# parsed, redacted, validated and serialised again by code that recurses once (jsonschema: a
# few frames) per level, under Python's recursion limit of 1000 frames shared with the gRPC
# stack; 64 levels keep all of that far from the limit, and no tool schema or agent-state
# document a person writes comes near it (providers' own schema limits are shallower still).
MAX_JSON_DEPTH = 64
# A JSON string (its escapes included), and the brackets outside strings.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_OPEN_CLOSE = str.maketrans("[{]}", "(())")  # only the depth matters, not which bracket
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise ValueError("a number is beyond the range of a double")  # not echoed: its digits may be a secret
    return number


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are unique. Python keeps the last of a repeated key, other readers
    the first: the text would then say something its parsed value does not (a secret in the
    member dropped here would go unredacted), so a repeated key is refused. The key is not
    echoed: it may be the very secret."""
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError("an object names one of its keys twice")
    return value


def too_deep(text: str) -> bool:
    """Whether ``text`` nests deeper than MAX_JSON_DEPTH, found without recursion (and so before
    json.loads, whose C parser recurses per level and fails with RecursionError near 1000):
    outside strings, each pass removes every innermost pair of brackets, so the passes needed
    are the depth. Each pass is one str.replace, in C: at most 65 of them."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:  # cannot nest deeper: most texts end here
        return False
    brackets = _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", text)).translate(_OPEN_CLOSE)
    for _ in range(MAX_JSON_DEPTH):
        inner = brackets.replace("()", "")
        if len(inner) == len(brackets):  # nothing left to remove (an unbalanced rest is the parser's to refuse)
            return False
        brackets = inner
    return "()" in brackets


def strict_json(text: str) -> Any:
    """Parse JSON as providers do, or raise ValueError saying why. Python's json accepts what
    they reject: NaN and Infinity, numbers beyond a double (1e400 parses as infinity, then
    serialises as Infinity), lone UTF-16 surrogates (which cannot even be stored as UTF-8), and
    repeated keys. Nesting deeper than MAX_JSON_DEPTH is refused before parsing."""
    if too_deep(text):
        raise ValueError(f"it nests more than {MAX_JSON_DEPTH} levels deep; at most {MAX_JSON_DEPTH} are allowed")
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique_keys)
    except RecursionError:  # the scan above should make this unreachable; never let it be INTERNAL
        raise ValueError(f"it nests more than {MAX_JSON_DEPTH} levels deep") from None
    if _SURROGATE_ESCAPE.search(text):  # only an escape can spell a surrogate: protobuf strings are UTF-8
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("it holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not a character") from None
    return value


def json_schema_validator(schema: Any) -> type[jsonschema.protocols.Validator]:
    """The validator class of the draft ``schema`` declares in ``$schema`` (draft 2020-12 when
    it declares none), once the schema is checked against that draft's metaschema; ValueError
    saying what is wrong otherwise, an unknown ``$schema`` included (checking it against another
    draft than the one it names would accept or refuse the wrong schemas)."""
    # None tells an unknown $schema from a known one; the stub allows only a class.
    cls = jsonschema.validators.validator_for(schema, default=None)  # type: ignore[arg-type]
    if cls is None:
        if isinstance(schema, dict) and "$schema" in schema:
            raise ValueError(f"its $schema {str(schema['$schema'])[:200]!r} is not a JSON Schema draft the sidecar "
                             "knows (draft 3, 4, 6, 7, 2019-09 or 2020-12)")
        cls = jsonschema.Draft202012Validator
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as error:
        where = "/" + "/".join(str(part) for part in error.absolute_path)
        meta: dict[str, Any] = cls.META_SCHEMA
        draft = meta.get("$id", meta.get("id", "")).rstrip("#")
        raise ValueError(f"is not a valid JSON schema (checked against {draft}): at {where}: {error.message}") from None
    return cls


def json_field(field: str, text: str) -> Any:
    """A request field's JSON text, parsed strictly, or a validation_error naming the field."""
    try:
        return strict_json(text)
    except ValueError as error:
        raise ValidationError.field(field, f"is not JSON: {error}") from None
