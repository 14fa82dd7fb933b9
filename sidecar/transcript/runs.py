"""Runs: their settings, and the record that tracks each run's log in LMDB.

Everything of a run lives under its key (``schema.run_key``); the run record itself is stored
at that key in the ``runs`` database.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from sidecar.errors import Conflict, FieldViolation, NotFound, ValidationError
from sidecar.settings import STRATEGIES, ContextSettings
from sidecar.storage.codec import dump_plain_json, load_plain_json
from sidecar.storage.keys import Txn
from sidecar.text.counting import Counters
from sidecar.transcript.schema import put_run_record, run_record
from sidecar.validation import check_at_least

# Ids the sidecar makes (summary refs, its own log entries) start with this; hosts may not.
SIDECAR_ID_PREFIX = "sidecar:"


@dataclass(frozen=True, slots=True)
class Deps:
    """What the domain's functions share: the store's databases, the counters, the defaults."""

    db: dict
    counters: Counters
    defaults: ContextSettings


@dataclass(frozen=True, slots=True)
class RunSettings:
    token_counter: str
    transcript_token_budget: int
    keep_last_turns: int
    transcript_window: int  # 0: no event-count bound
    summarization: bool = False
    summarization_strategy: str = "sliding-window"
    keep_last_tokens: int = 0
    # A run keeps the policy it was opened with, so its windows re-assemble and replay the same
    # whatever the sidecar's configuration says later. Runs recorded before the policy existed
    # had max-fill windows: that is what their records lacking it mean.
    window_policy: str = "max_fill"
    trim_to_fraction: float = 0.6


@dataclass(frozen=True, slots=True)
class ForkOrigin:
    source_run_id: str
    from_seq: int
    mode: str  # "replay" or "branch"


@dataclass(slots=True)
class Run:
    settings: RunSettings
    next_seq: int = 0
    last_iteration: int = 0
    last_assembled: int = 0  # the latest iteration whose window was fed: it never changes again
    summaries: int = 0  # summaries recorded in the run (in force or replaced)
    replay_pending: int = 0  # a replay fork's source summaries not reached yet
    origin: ForkOrigin | None = None
    log_entries: int = 0  # the sidecar's own entries in the log (one per summary)
    # Which profile and task records are the run's (their digests key the in-process cache).
    profile_digest: str = ""
    task_digest: str = ""
    # The prefix parts' hashes as last fed, to say which part changed when the prefix does.
    fed_prefix: dict[str, str] | None = None
    # Random, made when the run is: a run deleted and made again under its id is another
    # incarnation, so what a process caches of a run's events (keyed by it) is never stale.
    incarnation: str = field(default_factory=lambda: secrets.token_hex(8))
    # When the newest iteration was first assembled (ms since the epoch; 0: never): the pause
    # before the next one says whether the provider's cache is still warm.
    last_turn_ms: int = 0
    # A replay fork's: the iterations its source assembled (up to source_assembled) whose cache
    # it found cold. The fork takes the same steps there, whatever its own clock says.
    source_cold: tuple[int, ...] = ()
    source_assembled: int = 0
    # The iteration of the newest clearing (0: none): that turn's window reaches back to the
    # recent turns as the clearing left them (sidecar.transcript.window).
    cleared_at: int = 0

    def record(self) -> bytes:
        value: dict[str, Any] = {
            "settings": _fields(self.settings), "next_seq": self.next_seq, "last_iteration": self.last_iteration,
            "last_assembled": self.last_assembled, "summaries": self.summaries,
            "replay_pending": self.replay_pending, "log_entries": self.log_entries}
        if self.origin:
            value["origin"] = _fields(self.origin)
        if self.profile_digest:
            value["profile_digest"] = self.profile_digest
        if self.task_digest:
            value["task_digest"] = self.task_digest
        if self.fed_prefix is not None:
            value["fed_prefix"] = self.fed_prefix
        value["incarnation"] = self.incarnation
        if self.last_turn_ms:
            value["last_turn_ms"] = self.last_turn_ms
        if self.source_assembled:
            value["source_cold"], value["source_assembled"] = list(self.source_cold), self.source_assembled
        if self.cleared_at:
            value["cleared_at"] = self.cleared_at
        return dump_plain_json(value)

    @classmethod
    def parse(cls, data: bytes) -> Run:
        value = load_plain_json(data)
        origin = value.get("origin")
        return cls(RunSettings(**value["settings"]), value["next_seq"], value["last_iteration"],
                   value.get("last_assembled", 0), value.get("summaries", 0), value.get("replay_pending", 0),
                   ForkOrigin(**origin) if origin else None, value.get("log_entries", 0),
                   value.get("profile_digest", ""), value.get("task_digest", ""), value.get("fed_prefix"),
                   value.get("incarnation", ""), value.get("last_turn_ms", 0), tuple(value.get("source_cold", ())),
                   value.get("source_assembled", 0), value.get("cleared_at", 0))


def _fields(value: Any) -> dict[str, Any]:
    # Not dataclasses.asdict: it deep-copies, and the run record is written on every turn.
    return {name: getattr(value, name) for name in value.__slots__}


def load_run(txn: Txn, db: dict, key: bytes) -> Run | None:
    data = run_record(txn, db, key)
    return None if data is None else Run.parse(data)


def require_run(txn: Txn, db: dict, key: bytes, run_id: str) -> Run:
    return require_run_record(txn, db, key, run_id)[0]


def require_run_record(txn: Txn, db: dict, key: bytes, run_id: str) -> tuple[Run, bytes]:
    """The run, and its record as stored."""
    data = run_record(txn, db, key)
    if data is None:
        raise NotFound(f"run {run_id!r} not found")
    return Run.parse(data), data


def save_run(txn: Txn, db: dict, key: bytes, run: Run) -> None:
    put_run_record(txn, db, key, run.record())


def default_settings(defaults: ContextSettings) -> RunSettings:
    return RunSettings(defaults.token_counter, defaults.transcript_token_budget, defaults.keep_last_turns,
                       defaults.transcript_window, defaults.summarization, defaults.summarization_strategy,
                       defaults.keep_last_tokens, defaults.window_policy, defaults.trim_to_fraction)


def check_given_settings(defaults: ContextSettings, counters: Counters, given: dict[str, Any]) -> RunSettings:
    """Validate the settings an OpenRun gives (each named as its request field) and return the
    run's settings: the given ones over the configured defaults."""
    if "token_counter" in given:
        counters.get(given["token_counter"])
    if "transcript_token_budget" in given:
        budget = check_at_least("transcript_token_budget", given["transcript_token_budget"], 1)
        if budget > defaults.transcript_token_budget:
            raise ValidationError.field(
                "transcript_token_budget",
                f"{budget} exceeds the sidecar's advertised transcriptTokenBudget "
                f"({defaults.transcript_token_budget}); raise [context] transcript_token_budget to allow it")
    for name in ("keep_last_turns", "transcript_window", "keep_last_tokens"):
        if name in given:
            check_at_least(name, given[name], 0)
    if "summarization_strategy" in given and given["summarization_strategy"] not in STRATEGIES:
        raise ValidationError.field("summarization_strategy", f"must be one of {', '.join(STRATEGIES)}")
    return replace(default_settings(defaults), **given)


def confirm_settings(run: Run, run_id: str, given: dict[str, Any]) -> None:
    """An existing run is confirmed when every given setting equals the run's."""
    differing = [name for name, value in given.items() if getattr(run.settings, name) != value]
    if differing:
        raise Conflict(f"run {run_id!r} already exists with different {', '.join(differing)}",
                       tuple(FieldViolation(name, f"the run has {getattr(run.settings, name)!r}")
                             for name in differing))
