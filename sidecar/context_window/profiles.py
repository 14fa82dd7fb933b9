"""A run's profile and task: the sections that do not change from turn to turn.

The profile holds the static sections (system prompt, participants, agents roster, skills
index) and the tool definitions: together, the prompt prefix a provider caches. The task holds
the per-task sections (task, plan) and the loaded skills' bodies. Each section is rendered and
counted once, when it is written, and stored as rendered: every turn feeds the same bytes, so
the static prefix is byte-identical until the profile changes, and no turn re-counts it. Texts
are redacted (SR-1) like every other text the sidecar stores. Loaded records are cached in the
process by their digest (which the run record names), so a turn reads neither.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.caching import Cache, Caches, CacheSpec, deep_bytes
from sidecar.context_window import schema
from sidecar.context_window.rendering import (
    PER_TASK,
    STATIC,
    AnthropicStatic,
    OpenAIStatic,
    TextSection,
    Tool,
    anthropic_static,
    canonical_tools_json,
    openai_static,
)
from sidecar.errors import NotFound, ValidationError
from sidecar.settings import TOOL_NAME
from sidecar.storage.codec import dump_json, load_json
from sidecar.storage.keys import Db, Txn
from sidecar.text.fencing import fence
from sidecar.text.redaction import redact_json_text, refuse_secrets
from sidecar.validation import check_id, check_text_bytes, json_field, json_schema_validator

# The sections' names, spelled here only. In their declared order: the static sections (from the
# profile), the per-task ones (from the task, then one per loaded skill), the transcript's.
SYSTEM_PROMPT, PARTICIPANTS, AGENTS, SKILLS_INDEX = "system_prompt", "participants", "agents", "skills_index"
TASK, PLAN = "task", "plan"
SKILL_PREFIX = "skill:"  # a loaded skill's section is named "skill:<its name>"
STATE_SUMMARY, HISTORY, TOOL_RESULTS = "state_summary", "history", "tool_results"
STATIC_SECTIONS = (SYSTEM_PROMPT, PARTICIPANTS, AGENTS, SKILLS_INDEX)
TASK_SECTIONS = (TASK, PLAN)  # then each loaded skill's
TRANSCRIPT_SECTIONS = (STATE_SUMMARY, HISTORY, TOOL_RESULTS)
TOOLS = "tools"  # not a section: the tool list, which the prefix includes
STATIC_PARTS = (*STATIC_SECTIONS, TOOLS)  # the prefix's parts, each hashed on its own
MAX_ITEMS = 512  # tools, agents, skills, participants, criteria: each list at most this long
NO_AGENTS = "(no agents)"

Redact = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class Participant:
    role: str
    description: str = ""


@dataclass(frozen=True, slots=True)
class RemoteAgent:
    id: str
    name: str = ""
    description: str = ""
    skills: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SkillSummary:
    name: str
    description: str = ""


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    name: str
    description: str = ""
    parameters_json: str = ""  # the input JSON schema as JSON text; empty: an object with no properties


@dataclass(frozen=True, slots=True)
class Profile:
    system_prompt: str = ""
    participants: tuple[Participant, ...] = ()
    agents: tuple[RemoteAgent, ...] = ()
    skills: tuple[SkillSummary, ...] = ()
    tools: tuple[ToolDefinition, ...] = ()
    model_window_tokens: int = 0  # 0: [context] model_window_tokens


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str = ""
    goal: str = ""
    acceptance_criteria: tuple[str, ...] = ()
    plan: str = ""


@dataclass(frozen=True, slots=True)
class LoadedSkill:
    name: str
    body: str


@dataclass(frozen=True, slots=True)
class CountedSection:
    name: str
    stability: str
    text: str
    tokens: int


@dataclass(frozen=True, slots=True)
class PreparedProfile:
    """A profile as every turn uses it: its sections rendered and counted, the prefix hashed,
    and the providers' static request fragments built."""

    profile: Profile
    sections: tuple[CountedSection, ...]
    tools_json: str  # canonical: sorted by name, stable JSON
    tools_tokens: int
    parts: dict[str, str]  # each prefix part's sha256 (hex, 16 digits)
    prefix_sha256: str
    openai: OpenAIStatic = field(repr=False)
    anthropic: AnthropicStatic = field(repr=False)


@dataclass(frozen=True, slots=True)
class PreparedTask:
    task: Task
    skills: tuple[LoadedSkill, ...]  # sorted by name
    sections: tuple[CountedSection, ...]


EMPTY_TASK = PreparedTask(Task(), (), ())


# -- validation -------------------------------------------------------------------------------

def _text(field_name: str, value: str, limit: int) -> str:
    return check_text_bytes(field_name, value, limit, "[context] max_event_bytes")


def _items(field_name: str, items: tuple) -> tuple:
    if len(items) > MAX_ITEMS:
        raise ValidationError.field(field_name, f"has {len(items)} items; at most {MAX_ITEMS} are allowed")
    return items


def _unique(field_name: str, names: list[str]) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ValidationError.field(f"{field_name}[{i}]", f"{name!r} is named twice")
        seen.add(name)


def tool_parameters(field_name: str, parameters_json: str) -> dict[str, Any]:
    if not parameters_json:
        return {"type": "object", "properties": {}}
    parameters = json_field(field_name, parameters_json)
    if not isinstance(parameters, dict):
        raise ValidationError.field(field_name, "must be a JSON schema: a JSON object")
    return parameters


def redacted_parameters(field_name: str, parameters_json: str, redact: Redact) -> str:
    """A tool's parameter schema as stored and fed: redacted (SR-1) like any text, then checked
    against the metaschema of the draft it declares. The check is of the redacted schema, which
    is what providers receive (and its error messages can then echo no secret)."""
    if not parameters_json:
        return parameters_json
    text, parameters = redact_json_text(parameters_json, redact, field_name)
    try:
        json_schema_validator(parameters)
    except ValueError as error:
        raise ValidationError.field(field_name, str(error)) from None
    return text


def check_profile(profile: Profile, limit: int, field_name: str = "profile") -> None:
    _text(f"{field_name}.system_prompt", profile.system_prompt, limit)
    for i, participant in enumerate(_items(f"{field_name}.participants", profile.participants)):
        at = f"{field_name}.participants[{i}]"
        if not participant.role.strip():
            raise ValidationError.field(f"{at}.role", "is required")
        _text(f"{at}.description", participant.description, limit)
    for i, agent in enumerate(_items(f"{field_name}.agents", profile.agents)):
        at = f"{field_name}.agents[{i}]"
        check_id(f"{at}.id", agent.id)
        _text(f"{at}.description", agent.description, limit)
    _unique(f"{field_name}.agents", [a.id for a in profile.agents])
    for i, skill in enumerate(_items(f"{field_name}.skills", profile.skills)):
        check_id(f"{field_name}.skills[{i}].name", skill.name)
    _unique(f"{field_name}.skills", [s.name for s in profile.skills])
    for i, tool in enumerate(_items(f"{field_name}.tools", profile.tools)):
        at = f"{field_name}.tools[{i}]"
        if not TOOL_NAME.fullmatch(tool.name):
            raise ValidationError.field(f"{at}.name", "must be 1-64 of A-Z a-z 0-9 _ - (as providers name tools)")
        _text(f"{at}.description", tool.description, limit)
        tool_parameters(f"{at}.parameters_json", _text(f"{at}.parameters_json", tool.parameters_json, limit))
    _unique(f"{field_name}.tools", [t.name for t in profile.tools])
    if profile.model_window_tokens < 0:
        raise ValidationError.field(f"{field_name}.model_window_tokens", "must be at least 0")


def check_task(task: Task, limit: int, field_name: str = "task") -> None:
    check_id(f"{field_name}.task_id", task.task_id, required=False)
    _text(f"{field_name}.goal", task.goal, limit)
    for i, criterion in enumerate(_items(f"{field_name}.acceptance_criteria", task.acceptance_criteria)):
        _text(f"{field_name}.acceptance_criteria[{i}]", criterion, limit)
    _text(f"{field_name}.plan", task.plan, limit)


def check_skill(skill: LoadedSkill, limit: int, field_name: str = "skill") -> None:
    check_id(f"{field_name}.name", skill.name)
    _text(f"{field_name}.body", skill.body, limit)


def identifiers(profile: Profile, field_name: str = "profile") -> list[tuple[str, str]]:
    """The profile's identifiers (field, value): fed as they are, so never redacted (SR-1 refuses
    one that holds a secret instead)."""
    return ([(f"{field_name}.agents[{i}].id", a.id) for i, a in enumerate(profile.agents)]
            + [(f"{field_name}.skills[{i}].name", s.name) for i, s in enumerate(profile.skills)]
            + [(f"{field_name}.tools[{i}].name", t.name) for i, t in enumerate(profile.tools)])


def redacted_profile(profile: Profile, redact: Redact, field_name: str = "profile") -> Profile:
    """The profile as stored: every text redacted, the tools' parameter schemas too (those are
    checked here, as redacted; :func:`check_profile` has checked the rest). An identifier that
    holds a secret is refused."""
    refuse_secrets(redact, identifiers(profile, field_name))
    return Profile(
        redact(profile.system_prompt),
        tuple(Participant(redact(p.role), redact(p.description)) for p in profile.participants),
        tuple(RemoteAgent(a.id, redact(a.name), redact(a.description), tuple(redact(s) for s in a.skills))
              for a in profile.agents),
        tuple(SkillSummary(s.name, redact(s.description)) for s in profile.skills),
        tuple(ToolDefinition(t.name, redact(t.description),
                             redacted_parameters(f"{field_name}.tools[{i}].parameters_json", t.parameters_json, redact))
              for i, t in enumerate(profile.tools)),
        profile.model_window_tokens)


def redacted_task(task: Task, redact: Redact, field_name: str = "task") -> Task:
    refuse_secrets(redact, [(f"{field_name}.task_id", task.task_id)])
    return Task(task.task_id, redact(task.goal), tuple(redact(c) for c in task.acceptance_criteria), redact(task.plan))


# -- rendering the sections -------------------------------------------------------------------

def static_texts(profile: Profile) -> list[tuple[str, str]]:
    """The static sections, in their declared order; the agents section is always there."""
    sections = []
    if profile.system_prompt:
        sections.append((SYSTEM_PROMPT, profile.system_prompt))
    if profile.participants:
        sections.append((PARTICIPANTS, "Participants:\n" + "\n".join(
            f"- {p.role}: {p.description}" if p.description else f"- {p.role}" for p in profile.participants)))
    # Agent cards come from remote agents: data, never instructions, so they go in the fence.
    roster = "\n".join(
        f"- {a.id}" + (f" ({a.name})" if a.name else "") + (f": {a.description}" if a.description else "")
        + (f" Skills: {', '.join(a.skills)}." if a.skills else "") for a in profile.agents)
    sections.append((AGENTS, "Agents you can delegate to:\n" + (fence(roster, "agent-cards") if roster else NO_AGENTS)))
    if profile.skills:
        sections.append((SKILLS_INDEX, "Skills you can load:\n" + "\n".join(
            f"- {s.name}: {s.description}" if s.description else f"- {s.name}" for s in profile.skills)))
    return sections


def task_texts(task: Task, skills: tuple[LoadedSkill, ...]) -> list[tuple[str, str]]:
    sections = []
    if task.goal or task.acceptance_criteria:
        text = f"Task {task.task_id}:" if task.task_id else "Task:"
        if task.goal:
            text += "\n" + task.goal
        if task.acceptance_criteria:
            text += "\nAcceptance criteria:\n" + "\n".join(f"- {c}" for c in task.acceptance_criteria)
        sections.append((TASK, text))
    if task.plan:
        sections.append((PLAN, "Plan:\n" + task.plan))
    sections.extend((SKILL_PREFIX + s.name, f"Skill {s.name}:\n{s.body}") for s in skills)
    return sections


def _tools(profile: Profile) -> list[Tool]:
    return [Tool(t.name, t.description, tool_parameters("tools", t.parameters_json)) for t in profile.tools]


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prefix(sections: Sequence[CountedSection], tools_json: str) -> tuple[dict[str, str], str]:
    """The prefix parts' hashes, and the hash of the whole prefix as rendered."""
    by_name = {s.name: s.text for s in sections}
    parts = {name: _hash(by_name.get(name, ""))[:16] for name in STATIC_SECTIONS}
    parts[TOOLS] = _hash(tools_json)[:16]
    whole = dump_json({"sections": [[s.name, s.text] for s in sections], "tools": tools_json})
    return parts, hashlib.sha256(whole).hexdigest()


def statics(profile: Profile, sections: Sequence[CountedSection]) -> tuple[OpenAIStatic, AnthropicStatic]:
    """The providers' request fragments for these static sections and the profile's tools."""
    tools = _tools(profile)
    text_sections = [TextSection(s.name, s.stability, s.text) for s in sections]
    return openai_static(text_sections, tools), anthropic_static(text_sections, tools)


def _prepare_profile(profile: Profile, sections: tuple[CountedSection, ...], tools_tokens: int) -> PreparedProfile:
    tools_json = canonical_tools_json(_tools(profile))
    parts, sha = prefix(sections, tools_json)
    return PreparedProfile(profile, sections, tools_json, tools_tokens, parts, sha, *statics(profile, sections))


# -- storage ----------------------------------------------------------------------------------

def profile_record(profile: Profile, count: Callable[[str], int]) -> bytes:
    """The stored profile: its fields, and its sections as rendered with their counts."""
    sections = [[name, text, count(text)] for name, text in static_texts(profile)]
    tools_tokens = count(canonical_tools_json(_tools(profile))) if profile.tools else 0  # no tools: no tool list
    return dump_json({"profile": _profile_fields(profile), "sections": sections, "tools_tokens": tools_tokens})


def task_record(task: Task, skills: tuple[LoadedSkill, ...], count: Callable[[str], int]) -> bytes:
    skills = tuple(sorted(skills, key=lambda s: s.name))
    sections = [[name, text, count(text)] for name, text in task_texts(task, skills)]
    return dump_json({"task": [task.task_id, task.goal, list(task.acceptance_criteria), task.plan],
                      "skills": [[s.name, s.body] for s in skills], "sections": sections})


def digest(record: bytes) -> str:
    return hashlib.sha256(record).hexdigest()[:16]


def _profile_fields(profile: Profile) -> dict[str, Any]:
    return {"system_prompt": profile.system_prompt,
            "participants": [[p.role, p.description] for p in profile.participants],
            "agents": [[a.id, a.name, a.description, list(a.skills)] for a in profile.agents],
            "skills": [[s.name, s.description] for s in profile.skills],
            "tools": [[t.name, t.description, t.parameters_json] for t in profile.tools],
            "model_window_tokens": profile.model_window_tokens}


def _parse_profile(value: dict[str, Any]) -> PreparedProfile:
    fields = value["profile"]
    profile = Profile(fields["system_prompt"], tuple(Participant(*p) for p in fields["participants"]),
                      tuple(RemoteAgent(a[0], a[1], a[2], tuple(a[3])) for a in fields["agents"]),
                      tuple(SkillSummary(*s) for s in fields["skills"]),
                      tuple(ToolDefinition(*t) for t in fields["tools"]), fields["model_window_tokens"])
    sections = tuple(CountedSection(name, STATIC, text, tokens) for name, text, tokens in value["sections"])
    return _prepare_profile(profile, sections, value["tools_tokens"])


def _parse_task(value: dict[str, Any]) -> PreparedTask:
    task_id, goal, criteria, plan = value["task"]
    return PreparedTask(Task(task_id, goal, tuple(criteria), plan), tuple(LoadedSkill(*s) for s in value["skills"]),
                        tuple(CountedSection(name, PER_TASK, text, tokens) for name, text, tokens in value["sections"]))


# Prepared profiles and tasks, and the layouts made of them, by (run key, digest): a profile or
# task record is named by the digest of its content, so the record a digest names never changes
# (so one prepared in a write that was then refused is still the prepared form of that digest).
PREPARED = CacheSpec(
    "prepared_context", key="run key and the profile's or task's digest (a layout: both)",
    valid="a record named by the digest of its content never changes", max_bytes=16 << 20)


class ProfileCache:
    """:data:`PREPARED`, or another declaration of the same kind."""

    def __init__(self, caches: Caches, spec: CacheSpec = PREPARED) -> None:
        self._entries: Cache[tuple[bytes, str], Any] = caches.of(spec)

    def get(self, key: tuple[bytes, str], load: Callable[[], Any]) -> Any:
        return self._entries.get_or_make(key, load, deep_bytes)


def load_profile(txn: Txn, db: dict[str, Db], key: bytes, profile_digest: str,
                 cache: ProfileCache) -> PreparedProfile:
    """The run's prepared profile, which its run record names by ``profile_digest``
    (:data:`EMPTY_PROFILE` for a run that never set one: "")."""
    if not profile_digest:
        return EMPTY_PROFILE
    return cache.get((key, profile_digest),
                     lambda: _parse_profile(load_json(_named(schema.read_profile(txn, db, key)))))


def load_task(txn: Txn, db: dict[str, Db], key: bytes, task_digest: str, cache: ProfileCache) -> PreparedTask:
    """The run's prepared task, named by ``task_digest`` (:data:`EMPTY_TASK`: "")."""
    if not task_digest:
        return EMPTY_TASK
    return cache.get((key, task_digest), lambda: _parse_task(load_json(_named(schema.read_task(txn, db, key)))))


def empty_profile() -> PreparedProfile:
    """The profile of a run that never set one: no section at all (not even the agents
    section), no tools. Such a run's window is its transcript alone, as before profiles."""
    return _prepare_profile(Profile(), (), 0)


def stored_task(txn: Txn, db: dict[str, Db], key: bytes) -> tuple[Task, tuple[LoadedSkill, ...]]:
    data = schema.read_task(txn, db, key)
    if data is None:
        return Task(), ()
    prepared = _parse_task(load_json(data))
    return prepared.task, prepared.skills


def _named(data: bytes | None) -> bytes:
    """A record the run record names by digest."""
    if data is None:  # the run record names a record that is not there: a defect, not a user error
        raise NotFound("the run's profile or task record is missing")
    return data


EMPTY_PROFILE = empty_profile()
