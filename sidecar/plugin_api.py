"""The stable surface a compaction-policy plugin imports: ``from sidecar.plugin_api import ...``.

Everything a plugin needs is here, and only here is it promised to stay: where these names are
defined inside the sidecar (``sidecar.context_window.policy`` today) may change from one release
to the next, this module's names and their fields will not.

A plugin is an entry point in the group :data:`PLUGIN_GROUP`, named by ``[context] plugin``. The
object it loads (instantiated first when it is a class) may define any of the hooks in
:data:`HOOKS`, ``trigger``, ``keep`` and ``summarise``. Each is called with a :class:`HookCall`
whose ``input`` is the hook's input (:class:`TriggerInput`, :class:`KeepInput`,
:class:`SummariseInput`) and whose ``result`` already holds the built-in answer (a bool; a
frozenset of section names; a :class:`SummariseResult`); the hook sets ``call.result`` to replace
it. The object may also hold ``state_schemas``: agent-state data subset names mapped to the JSON
schemas that describe them. A plugin's answer is checked, and one that raises or answers what the
hook cannot take fails the call with ``plugin_failed``.

The built-in answers are :func:`default_trigger`, :func:`default_keep` and
:func:`default_summarise`, for a plugin that wants to build on them. The sections' names (what
``keep`` answers in) are here too: each static and per-task section's, a loaded skill's prefix
(its section is ``SKILL_PREFIX + name``), and the transcript's.
"""

from __future__ import annotations

from sidecar.context_window.policy import (
    HOOKS,
    PLUGIN_GROUP,
    HistoryEvent,
    HookCall,
    KeepInput,
    SectionTokens,
    SummariseInput,
    SummariseResult,
    TriggerInput,
    default_keep,
    default_summarise,
    default_trigger,
)
from sidecar.context_window.profiles import (
    AGENTS,
    HISTORY,
    PARTICIPANTS,
    PLAN,
    SKILL_PREFIX,
    SKILLS_INDEX,
    STATE_SUMMARY,
    STATIC_SECTIONS,
    SYSTEM_PROMPT,
    TASK,
    TASK_SECTIONS,
    TOOL_RESULTS,
    TRANSCRIPT_SECTIONS,
)

__all__ = [
    "AGENTS",
    "HISTORY",
    "PARTICIPANTS",
    "PLAN",
    "SKILL_PREFIX",
    "SKILLS_INDEX",
    "STATE_SUMMARY",
    "STATIC_SECTIONS",
    "SYSTEM_PROMPT",
    "TASK",
    "TASK_SECTIONS",
    "TOOL_RESULTS",
    "TRANSCRIPT_SECTIONS",
    "HOOKS",
    "PLUGIN_GROUP",
    "HistoryEvent",
    "HookCall",
    "KeepInput",
    "SectionTokens",
    "SummariseInput",
    "SummariseResult",
    "TriggerInput",
    "default_keep",
    "default_summarise",
    "default_trigger",
]
