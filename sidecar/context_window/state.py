"""Agent state beyond the transcript (the context-window capability's AgentState): the data, a
JSON object whose named subsets a JSON schema may describe, and the usage the provider reported
for each iteration, set beside what the sidecar counted it fed.

A subset's schema comes from ``[context] state_schemas_dir`` (``<subset>.schema.json``) or from
the plugin's ``state_schemas``; every schema is checked when the sidecar starts, and a write to
a described subset is validated before anything is written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jsonschema

from sidecar.context_window.schema import put_usage, read_last_usage, read_usage
from sidecar.errors import FieldViolation, NotFound, StateInvalid, ValidationError
from sidecar.storage.keys import Db, Txn
from sidecar.text.redaction import redact_json_text
from sidecar.validation import MAX_COUNT, check_text_bytes, json_schema_validator

SUBSET = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SCHEMA_SUFFIX = ".schema.json"


class StateSchemas:
    """The validators of the described subsets."""

    def __init__(self, schemas: Mapping[str, Any] | None = None) -> None:
        self._validators: dict[str, Any] = {}
        for subset, schema in (schemas or {}).items():
            if not isinstance(subset, str) or not SUBSET.match(subset):
                raise ValueError(f"state schema {subset!r}: a subset name is 1-64 of A-Z a-z 0-9 _ . -")
            try:
                cls = json_schema_validator(schema)
            except ValueError as error:
                raise ValueError(f"state schema {subset!r}: {error}") from None
            self._validators[subset] = cls(schema)

    @property
    def subsets(self) -> list[str]:
        return sorted(self._validators)

    @classmethod
    def load(cls, directory: str, plugin_schemas: Mapping[str, Any]) -> StateSchemas:
        """The schemas of a folder of ``<subset>.schema.json`` and the plugin's; ValueError on a
        bad file, a bad schema or a subset described twice."""
        schemas: dict[str, Any] = {}
        if directory:
            folder = Path(directory)
            if not folder.is_dir():
                raise ValueError(f"[context] state_schemas_dir: {directory!r} is not a folder")
            for path in sorted(folder.glob("*" + SCHEMA_SUFFIX)):
                try:
                    schemas[path.name[:-len(SCHEMA_SUFFIX)]] = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError) as error:
                    raise ValueError(f"state schema {path}: cannot be read as JSON: {error}") from None
        twice = sorted(set(schemas) & set(plugin_schemas))
        if twice:
            raise ValueError(f"state schemas {twice} are described both in [context] state_schemas_dir "
                             "and by the plugin")
        return cls({**schemas, **plugin_schemas})

    def check(self, subset: str, value: Any) -> None:
        validator = self._validators.get(subset)
        if validator is None:
            return
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is None:
            return
        schema_path = "/" + "/".join(str(part) for part in error.absolute_schema_path)
        where = error.json_path
        raise StateInvalid(f"json: subset {subset!r} at {where}: {error.message} (schema path {schema_path})",
                           (FieldViolation("json", f"at {where}: {error.message} (schema path {schema_path})"),),
                           {"subset": subset, "schema_path": schema_path, "instance_path": where})


def check_subset(subset: str) -> str:
    if not SUBSET.match(subset):
        raise ValidationError.field("subset", "must be 1-64 of A-Z a-z 0-9 _ . -")
    return subset


def parse_value(text: str, limit: int, redact: Callable[[str], str]) -> Any:
    """The value as it is stored: parsed by the strict parser (NaN, deep nesting and the like
    are refused, so GetState always answers JSON), then every string in it redacted (SR-1)."""
    check_text_bytes("json", text, limit, "[context] max_event_bytes")
    return redact_json_text(text, redact, "json")[1]


@dataclass(frozen=True, slots=True)
class Usage:
    iteration: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    fed_tokens: int  # what the sidecar counted it fed that iteration
    drift_tokens: int  # the prompt's tokens (Anthropic: with the cache's) - fed_tokens
    recorded_ms: int
    # Defaults: usage recorded before the cache figures existed reads back with none.
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    predicted_cached_tokens: int = 0  # the iteration's cache report's stable_prefix_tokens
    reported_cached_tokens: int = 0  # cached_tokens (OpenAI) or cache_read_input_tokens (Anthropic)


class Fed(NamedTuple):
    """What the sidecar fed at an iteration, as the transcript persisted its window."""

    tokens: int  # everything fed: the transcript's tokens and the sections' and tools'
    predicted_cached_tokens: int  # its cache report's stable_prefix_tokens (0: none)


def record_usage(txn: Txn, db: dict[str, Db], key: bytes, run_id: str, iteration: int, fed: Fed | None,
                 input_tokens: int, cached_tokens: int, output_tokens: int, now_ms: int,
                 cache_read_input_tokens: int = 0, cache_creation_input_tokens: int = 0) -> Usage:
    """Record the usage of ``iteration``, which fed ``fed`` (None: it was never assembled)."""
    for name, value in (("input_tokens", input_tokens), ("cached_tokens", cached_tokens),
                        ("output_tokens", output_tokens), ("cache_read_input_tokens", cache_read_input_tokens),
                        ("cache_creation_input_tokens", cache_creation_input_tokens)):
        if not 0 <= value <= MAX_COUNT:
            raise ValidationError.field(name, f"must be between 0 and {MAX_COUNT}")
    if cached_tokens > input_tokens:
        raise ValidationError.field("cached_tokens", f"is {cached_tokens}, more than input_tokens ({input_tokens})")
    anthropic = bool(cache_read_input_tokens or cache_creation_input_tokens)
    if anthropic and cached_tokens:
        # Two providers' figures for one call: one of them is misread, and the prompt's size with them.
        raise ValidationError.field("cached_tokens", "must be 0 with cache_read_input_tokens or "
                                    "cache_creation_input_tokens (OpenAI's figure and Anthropic's, for one call)")
    prompt_tokens = input_tokens + cache_read_input_tokens + cache_creation_input_tokens  # Anthropic's add up
    if prompt_tokens > MAX_COUNT:
        raise ValidationError.field("input_tokens",
                                    f"with the cache's tokens is {prompt_tokens}, more than {MAX_COUNT}")
    if fed is None:
        raise NotFound(f"iteration {iteration} of run {run_id!r} was never assembled")
    usage = Usage(iteration, input_tokens, cached_tokens, output_tokens, fed.tokens, prompt_tokens - fed.tokens,
                  now_ms, cache_read_input_tokens, cache_creation_input_tokens, fed.predicted_cached_tokens,
                  cache_read_input_tokens if anthropic else cached_tokens)
    put_usage(txn, db, key, iteration, {name: getattr(usage, name) for name in usage.__slots__})
    return usage


def last_usage(txn: Txn, db: dict[str, Db], key: bytes) -> Usage | None:
    """The usage of the newest iteration that has one."""
    fields = read_last_usage(txn, db, key)
    return Usage(**fields) if fields else None


def usage_of(txn: Txn, db: dict[str, Db], key: bytes, iteration: int) -> Usage | None:
    """The usage recorded for ``iteration``; None when RecordUsage was not called for it."""
    fields = read_usage(txn, db, key, iteration)
    return Usage(**fields) if fields else None
