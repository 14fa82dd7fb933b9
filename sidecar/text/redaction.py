"""Secret redaction (SR-1), applied to every text before it is counted or stored.

Three passes, each deterministic, so a prompt cache or a replay sees the same bytes every time:

1. Registered secrets: every occurrence of a registered value becomes ``[REDACTED:<secret_id>]``,
   the longest value winning where values overlap, found in one pass by fastcore's multi-pattern
   matcher (its cost per byte does not grow with the number of secrets). Values live in this
   process's memory only: never written to disk, logged or returned.
2. Built-in detectors (on by default): credential shapes that need no registration become
   ``[REDACTED:<kind>]``.
3. Leaked redaction forms are made canonical: ``<REDACTED:x>`` becomes ``[REDACTED:x]`` and
   ``[BYOK:...]`` becomes ``[REDACTED:byok]`` (its inside may be the very key).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import fastcore
from sidecar.caching import Cache, Caches, CacheSpec, text_bytes
from sidecar.errors import ValidationError
from sidecar.telemetry import metrics
from sidecar.validation import check_id, json_field

MIN_SECRET_CHARS = 8
MAX_SECRET_BYTES = 4096
_SECRET_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # a marker must stay a marker

# Kinds of credentials recognised by shape. Order matters only where shapes share a prefix
# (Anthropic keys start like OpenAI's), and alternation takes the first that matches.
DETECTORS: tuple[tuple[str, str], ...] = (
    ("private_key", r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----"),
    ("anthropic_api_key", r"\bsk-ant-[A-Za-z0-9_-]{20,}"),
    ("openai_api_key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
    ("aws_access_key_id", r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b"),
    ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    ("slack_token", r"\bxox[abeoprs]-[A-Za-z0-9-]{10,}"),
    ("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}"),
    ("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
)
# A bearer token in a header keeps its header, loses the token.
_BEARER = re.compile(r"(?i)(\bauthorization\s*[:=]\s*[\"']?bearer\s+)([A-Za-z0-9._~+/=-]{8,})")
_DETECTOR = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in DETECTORS))
# Every detector's match starts with one of these. Searching for them with the multi-pattern
# matcher (C speed) first means the regex alternation, ~50x slower per byte, runs only on the
# rare text that could hold a credential.
_DETECTOR_PREFIXES_TEXT = (
    "-----BEGIN ", "sk-", "AKIA", "ASIA", "ABIA", "ACCA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_",
    "xoxa-", "xoxb-", "xoxe-", "xoxo-", "xoxp-", "xoxr-", "xoxs-", "AIza", "eyJ")
_DETECTOR_PREFIXES = fastcore.MultiMatcher([prefix.encode() for prefix in _DETECTOR_PREFIXES_TEXT])
_LEAKED_ANGLE = re.compile(r"<REDACTED:([A-Za-z0-9_.:-]{1,64})>")
_LEAKED_BYOK = re.compile(r"\[BYOK:[^\]\n]{0,512}\]")
# Every pattern of passes 2 and 3 needs one of these in the text: a detector's prefix, "bearer"
# in any case (no letter but ASCII b, e, a, r matches them case-insensitively) or a leaked form's
# opening. Most texts hold none, and one scan in C says so: they skip both passes.
_BEARER_CASES = ["".join(c.upper() if case >> i & 1 else c for i, c in enumerate("bearer")) for case in range(64)]
_PASSES_2_3_NEED = fastcore.MultiMatcher(
    [text.encode() for text in (*_DETECTOR_PREFIXES_TEXT, *_BEARER_CASES, "<REDACTED:", "[BYOK:")])


@dataclass(frozen=True, slots=True)
class Redacted:
    text: str
    secret_ids: tuple[str, ...]  # registered ids and detector kinds found, first occurrence order


_MARKED = re.compile(r"\[REDACTED:([A-Za-z0-9_.:-]{1,64})\]")


def marker(secret_id: str) -> str:
    return f"[REDACTED:{secret_id}]"


@dataclass(frozen=True, slots=True)
class _Matcher:
    """One pass over the registered values of a scope: the automaton, the ids by pattern index,
    and each id's marker, made once."""

    automaton: fastcore.MultiMatcher
    ids: list[str]
    markers: list[bytes]


# The matcher over a scope's secrets (the tenant's and the run's), built once: every run redacts
# its events, most with no secret registered (then the entry says so). Registering or forgetting
# a tenant's secrets drops the tenant's matchers, under the lock every build takes.
SECRET_MATCHERS = CacheSpec(
    "secret_matchers", key="tenant and run id", max_bytes=16 << 20,
    valid="built from the scope's secrets, and dropped for the whole tenant whenever they change")


class Redactor:
    """Registered secrets per tenant (tenant-wide, or for one run), and the redaction passes."""

    def __init__(self, detectors: bool = True, caches: Caches | None = None) -> None:
        """``caches``: the server's (by default, caches of this object's own, on)."""
        self._detectors = detectors
        self._lock = threading.Lock()
        self._scopes: dict[tuple[str, str], dict[str, str]] = {}  # (tenant, run_id or "") -> id -> value
        self._matchers: Cache[tuple[str, str], tuple[_Matcher | None]] = (caches or Caches()).of(SECRET_MATCHERS)

    def register(self, tenant: str, run_id: str, secrets: Sequence[tuple[str, str]]) -> None:
        """Add or replace secrets (secret_id, value) of a run, or tenant-wide when run_id is ''."""
        check_id("run_id", run_id, required=False)
        for i, (secret_id, value) in enumerate(secrets):
            if not _SECRET_ID.match(secret_id):
                raise ValidationError.field(f"secrets[{i}].secret_id", "must be 1-64 of A-Z a-z 0-9 _ . -")
            if len(value) < MIN_SECRET_CHARS:
                # Short values would redact ordinary words; the message never echoes the value.
                raise ValidationError.field(f"secrets[{i}].value", f"is shorter than {MIN_SECRET_CHARS} characters")
            if len(value.encode("utf-8")) > MAX_SECRET_BYTES:
                raise ValidationError.field(f"secrets[{i}].value", f"is longer than {MAX_SECRET_BYTES} bytes")
        with self._lock:
            scope = self._scopes.setdefault((tenant, run_id), {})
            scope.update(secrets)
            self._forget_matchers(tenant)

    def forget(self, tenant: str, run_id: str, secret_ids: Sequence[str]) -> int:
        """Forget the named secrets of the scope (all of them when none is named); how many."""
        check_id("run_id", run_id, required=False)
        with self._lock:
            scope = self._scopes.get((tenant, run_id), {})
            names = list(secret_ids) or list(scope)
            forgotten = sum(scope.pop(name, None) is not None for name in names)
            if not scope:
                self._scopes.pop((tenant, run_id), None)
            self._forget_matchers(tenant)
            return forgotten

    def _forget_matchers(self, tenant: str) -> None:
        self._matchers.drop(lambda key: key[0] == tenant)

    def _matcher(self, tenant: str, run_id: str) -> _Matcher | None:
        """The matcher over the tenant-wide and the run's secrets (a run's value wins), built once."""
        key = (tenant, run_id)
        with self._lock:
            kept = self._matchers.get(key)
            if kept is None:
                values = {**self._scopes.get((tenant, ""), {}), **(self._scopes.get(key, {}) if run_id else {})}
                ids = list(values)
                kept = (_Matcher(fastcore.MultiMatcher([values[i].encode("utf-8") for i in ids]), ids,
                                 [marker(i).encode("utf-8") for i in ids]) if ids else None,)
                # The automaton holds each secret's bytes a few times over; ids and markers beside them.
                self._matchers.put(key, kept, text_bytes(tenant, run_id) + sum(
                    8 * len(values[i].encode("utf-8")) + 2 * len(i) + 120 for i in ids))
            return kept[0]

    def redact(self, tenant: str, run_id: str, text: str) -> Redacted:
        text, found = self._redact(self._matcher(tenant, run_id), text)
        return Redacted(text, tuple(dict.fromkeys(found)))

    def redacting(self, tenant: str, run_id: str) -> Callable[[str], str]:
        """The scope's redaction as a function of text alone (what :func:`redact_json` takes),
        with the scope's secrets as registered when it is made."""
        matcher = self._matcher(tenant, run_id)
        return lambda text: self._redact(matcher, text)[0]

    def _redact(self, matcher: _Matcher | None, text: str) -> tuple[str, list[str]]:
        """The text redacted, and each occurrence found: registered ids first, then detector kinds."""
        found: list[str] = []
        data = text.encode("utf-8")
        registered = 0
        if matcher is not None:
            redacted, matched = matcher.automaton.replace(data, matcher.markers)
            if matched:
                data = redacted
                text = redacted.decode("utf-8")
                found += [matcher.ids[index] for index in matched]
                registered = len(matched)
        if _PASSES_2_3_NEED.find(data):
            if self._detectors:
                if _DETECTOR_PREFIXES.find(data):
                    text = _DETECTOR.sub(lambda m: _found(found, m.lastgroup or "secret"), text)
                if "authorization" in text.lower():
                    text = _BEARER.sub(lambda m: m.group(1) + _found(found, "bearer_token"), text)
            if "<REDACTED:" in text:
                text = _LEAKED_ANGLE.sub(lambda m: marker(m.group(1)), text)
            if "[BYOK:" in text:
                text = _LEAKED_BYOK.sub(lambda m: _found(found, "byok"), text)
        if found:
            metrics.secrets_redacted(found[registered:], registered)
        return text, found


def _found(found: list[str], kind: str) -> str:
    found.append(kind)
    return marker(kind)


def refuse_secrets(redact: Callable[[str], str], identifiers: Sequence[tuple[str, str]]) -> None:
    """Refuse, naming its field, an identifier (field, value) that holds a secret: an id is fed,
    matched and answered as it is, so redacting it would rename it. The value is not echoed."""
    for field, value in identifiers:
        redacted = redact(value) if value else value
        if redacted != value:  # named by what was found (secret ids and credential kinds are not secret)
            found = sorted(set(_MARKED.findall(redacted)) - set(_MARKED.findall(value)))
            raise ValidationError.field(field, f"holds a secret ({', '.join(found) or 'a leaked redaction form'}); "
                                        "an identifier is used as it is, so it is refused rather than redacted")


def redact_json(value: Any, redact: Callable[[str], str], field: str) -> Any:
    """A parsed JSON value with every string in it redacted, object keys included: a key is
    text a provider reads like any other. Two keys of one object that redact to the same
    marker would silently lose a member, so that is refused, naming ``field``. Recursion is
    bounded: every JSON value comes from the strict parser, which refuses deep nesting."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_json(item, redact, field) for item in value]
    if isinstance(value, dict):
        redacted: dict[str, Any] = {}
        for key, item in value.items():
            new_key = redact(key)
            if new_key in redacted:
                raise ValidationError.field(field, "two keys of one object are the same once their secrets are "
                                            f"redacted ({new_key!r}); rename one")
            redacted[new_key] = redact_json(item, redact, field)
        return redacted
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # A registered secret may be all digits (a card number, a PIN of 8 or more): a number
        # that holds one becomes its marker, a string. Shorter numbers cannot hold a secret
        # (values are at least MIN_SECRET_CHARS long) and no detector matches digits alone.
        digits = json.dumps(value)
        if len(digits) >= MIN_SECRET_CHARS and (redacted_digits := redact(digits)) != digits:
            return redacted_digits
    return value  # booleans, null, and numbers that hold no secret


def canonical_json(value: Any) -> str:
    """The one serialisation of a JSON value the sidecar writes when it changes one: compact,
    keys sorted, UTF-8 as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False)


def redact_json_text(text: str, redact: Callable[[str], str], field: str) -> tuple[str, Any]:
    """JSON text as it may be stored and fed, and its value: parsed by the strict parser
    (a validation_error naming ``field`` if it is not JSON), each string redacted, and written
    again canonically when that changed anything, else kept byte for byte as the host sent it.
    Redacting the text as text would not do: JSON may spell a secret with escapes (``\\u0073k-``)
    that no byte-level match sees but every reader decodes."""
    value = json_field(field, text)
    redacted = redact_json(value, redact, field)
    return (text if redacted == value else canonical_json(redacted)), redacted

