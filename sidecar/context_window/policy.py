"""The compaction policy: the context-window capability's three hook points, each with a
built-in default and replaceable by a plugin.

- ``compaction.trigger``: is compaction due this turn? Built-in: the whole window passes
  ``[context] compaction_fraction`` of the turn limit (the smaller of the model's window and
  ``[context] turn_budget_tokens``), or the transcript no summary replaced yet passes that
  fraction of the transcript budget (RFC 0111's rule, which holds for runs without a profile),
  counting, once a summary is in force, only what came after it: a summary is asked for again
  when a trigger's worth of new transcript has come, not on every turn that the turns it had to
  keep verbatim still hold.
- ``compaction.keep``: which sections are never compacted. Built-in: the system prompt, the
  participants, the agents roster, the task (goal and acceptance criteria), the plan and every
  loaded skill's body. Only sections outside it are ever trimmed to fit the turn limit.
- ``compaction.summarise``: what a summary replaces, and optionally the summary itself.
  Built-in: the oldest half of the history that may be summarised, the text left to the host
  (the compaction-due signal, then RecordSummary) or to the built-in summariser when configured.

A plugin is a Python entry point in the group ``context_sidecar.plugins`` named by ``[context]
plugin``. The object it loads (instantiated first when it is a class) may define ``trigger``,
``keep`` and ``summarise``: each is called with a :class:`HookCall` whose ``result`` already
holds the built-in answer, and sets ``call.result`` to replace it. It may also hold
``state_schemas``: agent-state data subset names mapped to the JSON schemas that describe them.
A plugin's answer is checked; a plugin that raises or answers nonsense fails the call with
``plugin_failed`` (the traceback goes to the log), never silently falls back to the default.

A plugin imports the names it needs (the hooks' inputs and results, :class:`HookCall`) from
``sidecar.plugin_api``, the stable surface, which re-exports them from here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from sidecar.context_window.profiles import AGENTS, PARTICIPANTS, PLAN, SKILL_PREFIX, SYSTEM_PROMPT, TASK
from sidecar.errors import PluginFailed
from sidecar.telemetry import logs

log = logging.getLogger(__name__)

PLUGIN_GROUP = "context_sidecar.plugins"
HOOKS = ("trigger", "keep", "summarise")
# The built-in keep: what the context-window capability says always survives.
KEPT_SECTIONS = frozenset({SYSTEM_PROMPT, PARTICIPANTS, AGENTS, TASK, PLAN})

In = TypeVar("In")
Out = TypeVar("Out")


@dataclass(frozen=True, slots=True)
class SectionTokens:
    name: str
    stability: str  # "static", "per_task" or "per_turn" (rendering.STATIC, PER_TASK, PER_TURN)
    tokens: int


@dataclass(frozen=True, slots=True)
class TriggerInput:
    iteration: int
    task_id: str
    window_tokens: int  # everything this turn feeds: sections, tools and the transcript window
    turn_limit_tokens: int  # the smaller of the model's window and [context] turn_budget_tokens
    unsummarised_tokens: int  # the run's transcript that no summary replaced yet
    transcript_budget: int
    fraction: float  # [context] compaction_fraction
    # Of unsummarised_tokens, what was appended after the summary in force was recorded (None:
    # no summary is in force, all of it is new).
    since_summary_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class KeepInput:
    sections: tuple[SectionTokens, ...]  # this turn's sections, in their declared order


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    event_id: str
    role: str
    type: str
    iteration: int
    call_id: str
    text: str
    tokens: int


@dataclass(frozen=True, slots=True)
class SummariseInput:
    iteration: int
    task_id: str
    strategy: str  # the run's summarization strategy
    summary_in_force: str  # the ref of the newest summary in force, "" when none
    default_ids: tuple[str, ...]  # the built-in choice
    transcript_budget: int
    # The events that may be summarised, oldest first (outside the verbatim floor and the active
    # turn). A call, because reading their texts costs a pass over them.
    history: Callable[[], tuple[HistoryEvent, ...]] = field(repr=False, default=lambda: ())


@dataclass(frozen=True, slots=True)
class SummariseResult:
    # Oldest first: optionally the summary in force (to fold it in), then a prefix of the history.
    replace_ids: tuple[str, ...]
    # The summary; None leaves it to the host (or to the built-in summariser when configured).
    text: str | None = None


@dataclass(slots=True)
class HookCall(Generic[In, Out]):
    """What a plugin's hook receives: the hook's input, and the result to keep or replace."""

    input: In
    result: Out


def default_trigger(given: TriggerInput) -> bool:
    new = given.unsummarised_tokens if given.since_summary_tokens is None else given.since_summary_tokens
    return (given.window_tokens > given.fraction * given.turn_limit_tokens
            or new > given.fraction * given.transcript_budget)


def default_keep(given: KeepInput) -> frozenset[str]:
    return frozenset(s.name for s in given.sections
                     if s.name in KEPT_SECTIONS or s.name.startswith(SKILL_PREFIX))


def default_summarise(given: SummariseInput) -> SummariseResult:
    return SummariseResult(given.default_ids)


class Policy:
    """The three hooks as this sidecar runs them: the built-in ones, or a plugin's over them."""

    def __init__(self, plugin: Any = None, name: str = "") -> None:
        self._plugin = plugin
        self.name = name
        self.replaced = tuple(hook for hook in HOOKS if callable(getattr(plugin, hook, None)))
        schemas = getattr(plugin, "state_schemas", None) or {}
        if not isinstance(schemas, Mapping):
            raise PluginFailed(f"plugin {name!r}: state_schemas must be a mapping of subset names to JSON schemas")
        self.state_schemas: dict[str, Any] = dict(schemas)

    def describe(self) -> dict[str, str]:
        """Who answers each hook: "built-in", or the plugin's name."""
        return {hook: (self.name if hook in self.replaced else "built-in") for hook in HOOKS}

    def _call(self, hook: str, given: Any, result: Any) -> Any:
        if hook not in self.replaced:
            return result
        call = HookCall(given, result)
        try:
            getattr(self._plugin, hook)(call)
        except Exception as error:  # its traceback, not its message: that may quote the content it was given
            log.error("plugin %r: compaction.%s raised", self.name, hook, extra=logs.failure(error))
            raise PluginFailed(f"plugin {self.name!r}: compaction.{hook} raised (see the sidecar's log)") from None
        return call.result

    def trigger(self, given: TriggerInput) -> bool:
        result = self._call("trigger", given, default_trigger(given))
        if not isinstance(result, bool):
            raise PluginFailed(f"plugin {self.name!r}: compaction.trigger must set a bool, not {type(result).__name__}")
        return result

    def keep(self, given: KeepInput) -> frozenset[str]:
        result = self._call("keep", given, default_keep(given))
        if isinstance(result, str) or not all(isinstance(name, str) for name in result):
            raise PluginFailed(f"plugin {self.name!r}: compaction.keep must set a collection of section names")
        return frozenset(result)

    def summarise(self, given: SummariseInput) -> SummariseResult:
        default = default_summarise(given)
        result = self._call("summarise", given, default)
        if result is default:
            return result
        if not isinstance(result, SummariseResult):
            raise PluginFailed(f"plugin {self.name!r}: compaction.summarise must set a SummariseResult")
        if result.text is not None and (not isinstance(result.text, str) or not result.text.strip()):
            raise PluginFailed(f"plugin {self.name!r}: compaction.summarise set an empty summary text")
        _check_range(self.name, given, tuple(result.replace_ids))
        return SummariseResult(tuple(result.replace_ids), result.text)


def _check_range(name: str, given: SummariseInput, ids: tuple[str, ...]) -> None:
    """A plugin's range must be one RecordSummary accepts: optionally the summary in force, then
    the oldest summarisable events in order, never splitting a tool call from its results."""
    events = ids[1:] if given.summary_in_force and ids[:1] == (given.summary_in_force,) else ids
    history = given.history()
    if not events or tuple(e.event_id for e in history[:len(events)]) != events:
        raise PluginFailed(f"plugin {name!r}: compaction.summarise must replace the oldest summarisable events, "
                           "in order and without gaps")
    inside = {e.call_id for e in history[:len(events)] if e.call_id}
    if any(e.call_id in inside for e in history[len(events):]):
        raise PluginFailed(f"plugin {name!r}: compaction.summarise split a tool call from its result")


def load_policy(name: str) -> Policy:
    """The built-in policy, or the one the named plugin makes; ValueError when it is not installed."""
    if not name:
        return Policy()
    found = entry_points(group=PLUGIN_GROUP, name=name)
    if not found:
        raise ValueError(f"[context] plugin: no entry point {name!r} in the group {PLUGIN_GROUP!r} is installed")
    loaded = next(iter(found)).load()
    plugin = loaded() if isinstance(loaded, type) else loaded
    policy = Policy(plugin, name)
    log.info("compaction policy: %s", policy.describe())
    return policy
