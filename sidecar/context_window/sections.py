"""The whole context window of a turn (the context-window capability): the sections in their
declared order, the turn limit that bounds them with the transcript, which sections the policy
keeps, and the provider renderings.

The order is static (system prompt, participants, agents, skills index; the tools travel as
the tool list), per-task (task, plan, loaded skills' bodies), per-turn (the state summary, the
history and the tool results: the transcript window's summaries, its events, and the trailing
tool results the model is to act on). The static sections and the tools are the prompt prefix
a provider caches; they come from the profile as rendered when it was written, so the prefix is
byte-identical on every turn until the profile changes, and when it changes the answer names
the parts that did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from sidecar.caching import Cache, Caches, CacheSpec, text_bytes
from sidecar.context_window.policy import KeepInput, Policy, SectionTokens
from sidecar.context_window.profiles import (
    HISTORY,
    SKILL_PREFIX,
    STATE_SUMMARY,
    STATIC_PARTS,
    TOOL_RESULTS,
    TRANSCRIPT_SECTIONS,
    CountedSection,
    PreparedProfile,
    PreparedTask,
    prefix,
    statics,
)
from sidecar.context_window.rendering import (
    ANTHROPIC_MAX_BREAKPOINTS,
    FRAMING_TOKENS,
    PER_TURN,
    STATIC,
    AnthropicStatic,
    BodyMap,
    History,
    HistoryItem,
    OpenAIStatic,
    Part,
    TextSection,
    anthropic_messages,
    anthropic_parts_and_first,
    anthropic_rolling,
    body_map,
    is_blank,
    item_key,
    openai_parts,
    openai_responses,
    quote,
    task_part,
    task_part_names,
    uncounted,
)
from sidecar.errors import TokenBudgetExceeded, ValidationError
from sidecar.storage.codec import StoredEvent, decode_event
from sidecar.storage.environment import after_commit
from sidecar.validation import MAX_COUNT

RENDERINGS = ("openai_responses", "anthropic_messages")


class Clipped(Protocol):
    """An entry fed in another form than its content: clipped, or a cleared result's placeholder."""

    @property
    def text(self) -> str: ...  # what is fed
    @property
    def tokens(self) -> int: ...  # its count
    @property
    def original_tokens(self) -> int: ...  # the content's own count


@dataclass(frozen=True, slots=True)
class FedTranscript:
    """The transcript window a turn feeds, as the sections and renderings read it: plain values
    the turn gives (the transcript is the area above this one)."""

    event_ids: Sequence[str]  # the entries', oldest first: the summaries fed, then the events
    records: Sequence[bytes]  # the entries as stored
    clips: Mapping[int, Clipped]  # by position: the entries fed in another form
    summaries_fed: int  # how many of the entries (the first ones) are summaries
    token_count: int  # the entries' tokens as fed


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    stability: str  # rendering.STATIC, PER_TASK or PER_TURN
    never_compact: bool
    text: str  # what is fed, for a text section; "" for the transcript's sections
    tokens: int
    event_ids: tuple[str, ...] = ()  # a transcript section's entries


@dataclass(frozen=True, slots=True)
class Layout:
    """The text sections a turn feeds, and the room they leave the transcript under the turn
    limit. It depends only on the profile, the task and the policy, so it is built once per
    (profile, task) and reused."""

    profile: PreparedProfile
    task: PreparedTask
    task_id: str  # the task's id, or the run's when it has none: OpenAI's prompt_cache_key
    sections: tuple[CountedSection, ...]  # fed, in order
    kept: frozenset[str]  # never compacted (the keep hook's answer)
    trimmed: tuple[str, ...]  # left out to fit the turn limit, newest-declared first
    turn_limit: int
    fixed_tokens: int  # the fed sections' and the tools' tokens
    transcript_room: int  # what the turn limit leaves the transcript
    # The prefix as fed (the profile's, unless a static section was trimmed).
    parts: dict[str, str]
    prefix_sha256: str
    openai: OpenAIStatic
    anthropic: AnthropicStatic

    @property
    def static_tokens(self) -> int:
        """Of fixed_tokens: the static sections' and the tools' (the cached prefix's texts)."""
        return sum(s.tokens for s in self.sections if s.stability == STATIC) + self.profile.tools_tokens


def layout(policy: Policy, profile: PreparedProfile, task: PreparedTask, run_id: str, model_window_tokens: int,
           turn_budget_tokens: int) -> Layout:
    """Keep what the policy keeps; when the sections and tools alone would not leave the
    transcript a token under the turn limit, leave out sections it does not keep, the
    last-declared first. TokenBudgetExceeded when even that is not enough."""
    limit = min(profile.profile.model_window_tokens or model_window_tokens, turn_budget_tokens or MAX_COUNT)
    sections = profile.sections + task.sections
    kept = policy.keep(KeepInput(tuple(SectionTokens(s.name, s.stability, s.tokens) for s in sections)
                                 + tuple(SectionTokens(name, PER_TURN, 0) for name in TRANSCRIPT_SECTIONS)))
    fed = list(sections)
    fixed = sum(s.tokens for s in sections) + profile.tools_tokens
    trimmed = []
    for section in reversed(sections):
        if fixed < limit:
            break
        if section.name not in kept:
            fed.remove(section)
            trimmed.append(section.name)
            fixed -= section.tokens
    if fixed >= limit:
        raise TokenBudgetExceeded(
            f"the sections the policy keeps and the tools take {fixed} tokens, which leaves the transcript "
            f"nothing under the turn limit of {limit} (the model's window, or [context] turn_budget_tokens)")
    parts, sha, openai, anthropic = profile.parts, profile.prefix_sha256, profile.openai, profile.anthropic
    static = [s for s in fed if s.stability == STATIC]
    if len(static) != len(profile.sections):  # a static section was trimmed: the prefix fed is another
        parts, sha = prefix(static, profile.tools_json)
        openai, anthropic = statics(profile.profile, static)
    return Layout(profile, task, task.task.task_id or run_id, tuple(fed), kept, tuple(trimmed), limit, fixed,
                  limit - fixed, parts, sha, openai, anthropic)


def check_render(render: str) -> str:
    if render and render not in RENDERINGS:
        raise ValidationError.field("render", f"must be empty or one of {', '.join(RENDERINGS)}")
    return render


def prefix_changed(plan: Layout, fed_before: dict[str, str] | None) -> tuple[str, ...]:
    """The prefix parts that differ from those fed at the run's previous assembly."""
    if fed_before is None:
        return ()
    return tuple(part for part in STATIC_PARTS if fed_before.get(part) != plan.parts[part])


def entry_at(window: FedTranscript, position: int) -> tuple[StoredEvent, str, int]:
    """The entry at ``position``: its event, the text fed and that text's tokens."""
    event = decode_event(window.records[position])
    clip = window.clips.get(position)
    return (event, event.content, event.tokens) if clip is None else (event, clip.text, clip.tokens)


def sections(plan: Layout, window: FedTranscript, history: Sequence[HistoryItem],
             with_text: bool = True) -> list[Section]:
    """Every section of the window, in the declared order. The transcript's sections name
    their entries; their tokens add up to the window's transcript tokens. ``history`` is the
    window's entries as items (:meth:`HistoryCache.items`): their roles and counts are read
    there, not decoded again from the records (a window may feed dozens of summaries)."""
    kept = plan.kept
    out = [Section(s.name, s.stability, s.name in kept, s.text if with_text else "", s.tokens) for s in plan.sections]
    fed = window.summaries_fed
    tail = len(history)
    tail_tokens = 0
    # The tool results the model is to act on: the trailing run of role "tool" entries.
    while tail > fed and history[tail - 1].role == "tool":
        tail -= 1
        tail_tokens += history[tail].tokens
    summary_tokens = sum(item.tokens for item in history[:fed])
    ids = window.event_ids
    if fed:
        out.append(Section(STATE_SUMMARY, PER_TURN, STATE_SUMMARY in kept, "", summary_tokens, tuple(ids[:fed])))
    if tail > fed:
        out.append(Section(HISTORY, PER_TURN, HISTORY in kept, "",
                           window.token_count - summary_tokens - tail_tokens, tuple(ids[fed:tail])))
    if tail < len(history):
        out.append(Section(TOOL_RESULTS, PER_TURN, TOOL_RESULTS in kept, "", tail_tokens, tuple(ids[tail:])))
    return out


# (tool_name, call_id, text fed, original tokens, tokens fed) -> whether a clearing will replace it
WillBeCleared = Callable[[str, str, str, int, int], bool]


def never_cleared(tool_name: str, call_id: str, text: str, original_tokens: int, fed_tokens: int) -> bool:
    return False


def _call_of(history: list[HistoryItem | None], position: int, call_id: str) -> HistoryItem | None:
    """The call a tool result at ``position`` answers: the first entry before it with its call id
    (a clearing names that entry's tool), when that is a call; None for a result with no call."""
    first = None
    if call_id:
        for item in history[position - 1::-1] if position else ():
            if item is not None and item.call_id == call_id:
                first = item
    return first if first is not None and first.role == "assistant" and first.tool_name else None


# The window's entries as renderings take them, each with its text already quoted as JSON, by run
# (key and incarnation) and event id: a turn's window is mostly the previous turn's, so a turn
# decodes and quotes only what is new. An entry fed in another form (cleared, clipped) is kept by
# that form too (its text and count): a cleared result is fed as the same placeholder on every
# later turn, and a cleared run's window is mostly those. Per run only the last window's entries
# are kept (what the next turn reads again), and each is counted by its texts' bytes: a 100 KB
# tool result is held twice (its text and its quoted text), so a bound by entries would hold GBs.
HISTORY_ITEMS = CacheSpec(
    "history_items", key="run key and incarnation, then event id (and the form it is fed in, if not its own)",
    valid="an event never changes under its run's incarnation; a form is keyed by its text and count",
    max_bytes=32 << 20)


def _item_bytes(item: HistoryItem) -> int:
    return text_bytes(item.text, item.quoted, item.key, item.event_id) + _ITEM_BYTES


_ITEM_BYTES = 200  # the item's own object, its other fields, its slot in the run's dict


class HistoryCache:
    """:data:`HISTORY_ITEMS`: a run's window entries as items (a dict per run, replaced whole, so a
    window is looked up by its event ids as they are, in C: a str keeps its hash), with their bytes."""

    def __init__(self, caches: Caches) -> None:
        self._runs: Cache[tuple, tuple[dict[str | tuple, HistoryItem], int]] = caches.of(HISTORY_ITEMS)

    def items(self, window: FedTranscript, run: tuple, will_be_cleared: WillBeCleared = never_cleared) -> \
            tuple[HistoryItem, ...]:
        """The window's entries as items (a request splits them into turns once:
        rendering.History). ``will_be_cleared`` tells the results a
        later clearing will replace (clearing.will_be_cleared: the run's counter and the
        sidecar's settings, the same for all of a run's items)."""
        keys: list[str | tuple] = list(window.event_ids)
        for position, clip in window.clips.items():
            keys[position] = (keys[position], clip.text, clip.tokens)
        kept, held = self._runs.get(run) or ({}, 0)
        history = list(map(kept.get, keys))  # the whole window in C; most entries are known
        if not all(history):
            for position, item in enumerate(history):
                if item is None:
                    event, text, tokens = entry_at(window, position)
                    call = _call_of(history, position, event.call_id) if event.role == "tool" else None
                    fed_as = window.clips.get(position)
                    will_change = call is not None and will_be_cleared(
                        call.tool_name, event.call_id, text, fed_as.original_tokens if fed_as else event.tokens, tokens)
                    item = history[position] = HistoryItem(
                        event.event_id, event.role, event.type, text, event.call_id, event.tool_name, quote(text),
                        item_key(event.role, event.type, text, event.call_id, event.tool_name), tokens, will_change)
                    held += _item_bytes(item)
            # Only this window's entries: the next turn's window is mostly this one. Those no
            # longer in it (a start moved on, an entry fed in another form) are measured out.
            items = cast("list[HistoryItem]", history)  # every None is filled in by now
            now = dict(zip(keys, items, strict=True))
            held -= sum(_item_bytes(kept[key]) for key in kept.keys() - now.keys())
            # Kept once what was read is committed: an event of a turn refused after it was read is
            # not the run's, and its id may come again with other fields.
            after_commit(self._runs.put, run, (now, held), held)
        return tuple(cast("list[HistoryItem]", history))


def render(kind: str, plan: Layout, history: History, cache: dict, prompt_cache_retention: str = "") -> str:
    """The provider request body for the window (JSON); ``history`` is its entries (split into
    turns already, when :func:`cache_state` computed the request's parts), ``cache`` the
    request's cache state (:func:`cache_state`: where Anthropic's rolling breakpoints go)."""
    task_sections = [TextSection(s.name, s.stability, s.text) for s in plan.sections if s.stability != STATIC]
    if kind == "openai_responses":
        return openai_responses(plan.openai, task_sections, history, plan.task_id, prompt_cache_retention)
    start = cache["history_from"]
    return anthropic_messages(plan.anthropic, task_sections, history, [p - start for p in cache["rolling"]])


# What the provider's prompt cache will do ---------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CacheReport:
    """The part of this request that repeats the previous assembly's, byte for byte, counted as
    the provider counts it (for a rendering, with the framing of each block: see the proto)."""

    stable_prefix_tokens: int  # the tokens of parts[:break_at]
    break_at: int  # the first part that is not the previous request's part at the same index
    break_reason: str  # why it differs ("" when the previous request is all repeated); see the proto
    request_tokens: int = 0  # the whole request's, counted alike (0: a report persisted before it was)


def request_parts(form: str, plan: Layout, history: History, count: Callable[[str], int] = uncounted,
                  holding: list[tuple[HistoryItem, ...]] | None = None) -> tuple[list[Part], int, int]:
    """The request as parts (see sidecar.context_window.rendering), the index of its first history part, and
    for Anthropic the history block of the first tool result a clearing will replace (-1: none, or
    another form; found in the same pass):
    the static prefix (the static sections and the tools; for OpenAI also the prompt cache key,
    which routes the request to a cache), each per-task section, then the history: the window's
    entries for the plain form (""), the body's items for a rendering. A part's tokens are its
    texts' as sent, without framing; ``count`` counts those the rendering adds (the run's counter).
    ``holding``, when given, gets the history items each part holds (none for the prefix's and the
    per-task sections')."""
    static_tokens = sum(s.tokens for s in plan.sections if s.stability == STATIC) + plan.profile.tools_tokens
    if form == "openai_responses":
        texts = _static_texts(plan)
        if texts > 1:  # the instructions join the static texts with a blank line
            static_tokens += (texts - 1) * count("\n\n")
    routed = "\x00" + plan.task_id if form == "openai_responses" else ""
    parts: list[Part] = [("P" + plan.prefix_sha256 + routed, static_tokens)]
    parts += [task_part(s.name, s.text, s.tokens) for s in plan.sections
              if s.stability != STATIC and not (form and is_blank(s.text))]
    start = len(parts)
    if holding is not None:
        holding += [()] * start
    clearable = -1
    if form == "openai_responses":
        parts += openai_parts(history, count, holding)
    elif form == "anthropic_messages":
        history_parts, clearable = anthropic_parts_and_first(history, _clearable, count, holding)
        parts += history_parts
    else:
        parts += [(item.key, item.tokens) for item in history.items]
        if holding is not None:
            holding += [(item,) for item in history.items]
    return parts, start, clearable


def body_parts(form: str, plan: Layout, body: str) -> BodyMap:
    """Where the parts of :func:`request_parts` (after the static prefix) begin in ``body``, the
    request rendered in ``form`` over ``plan``, and where its breakpoints are."""
    return body_map(form, body, _static_texts(plan) if form == "anthropic_messages" else 0)


def _clearable(item: HistoryItem) -> bool:
    return item.will_change


def _static_blocks(form: str, plan: Layout) -> int:
    """How many blocks a provider frames in the request's static prefix: each tool, and the static
    texts (OpenAI: one instructions string; Anthropic: a system block each)."""
    texts = _static_texts(plan)
    return len(plan.profile.profile.tools) + (min(texts, 1) if form == "openai_responses" else texts)


def _static_texts(plan: Layout) -> int:
    """The static sections a rendering feeds (the blank ones it leaves out)."""
    return sum(1 for s in plan.sections if s.stability == STATIC and not is_blank(s.text))


def _as_provider_counts(form: str, plan: Layout, tokens: list[int], upto: int) -> int:
    """The tokens of the request's first ``upto`` parts as its provider counts them: their texts,
    and for a rendering FRAMING_TOKENS around each block (the static part holds several)."""
    texts = sum(tokens[:upto])
    if not form or not upto:
        return texts  # without a rendering, the request's framing is the host's, unknown here
    return texts + FRAMING_TOKENS * (_static_blocks(form, plan) + upto - 1)


def cache_state(form: str, plan: Layout, window: FedTranscript, history: History,
                changed: tuple[str, ...], previous: dict | None, count: Callable[[str], int] = uncounted,
                cold: bool = False) -> dict:
    """This request's cache state, to persist with its window (what the next turn compares
    with: each part's key, Anthropic's breakpoints), and its report against ``previous`` (the
    previous assembly's state; None: there is none). The parts' tokens are not kept: the
    stable prefix's are this request's, and every re-assembly parses what is kept. ``count``
    counts the texts a rendering adds, in the run's counter; ``cold``: the provider's cache
    expired since the previous request, so none of it is read from there."""
    parts, start, clearable = request_parts(form, plan, history, count)
    keys, tokens = (list(column) for column in zip(*parts))  # a request has its prefix part at least
    fed = window.summaries_fed
    first = window.event_ids[fed] if len(window.event_ids) > fed else ""
    items = history.items
    altered = sum(1 for position in window.clips if items[position].role == "tool")
    at = 0
    if previous is not None and previous["form"] == form and not cold:
        before = previous["keys"]
        limit = min(len(keys), len(before))
        if keys[:limit] == before[:limit]:  # the common case, compared in C: the whole previous request
            at = limit
        while at < limit and keys[at] == before[at]:
            at += 1
    rolling: list[int] = []
    if form == "anthropic_messages":
        # Where the previous request wrote and this one is still identical, the block before the
        # first tool result a clearing may change, and the last block: see anthropic_rolling.
        reads = [p for p in (previous["rolling"] if at and previous is not None else ()) if start <= p < at]
        room = ANTHROPIC_MAX_BREAKPOINTS - plan.anthropic.has_system_blocks - (start > 1)  # static, per-task
        rolling = anthropic_rolling(len(keys) - 1, reads, start + clearable - 1 if clearable > 0 else -1, room)
    reason = "cache_expired" if cold and previous is not None else \
        _break_reason(form, previous, keys, at, changed, first, altered)
    return {"form": form, "keys": keys, "history_from": start, "rolling": rolling, "first": first,
            "altered": altered, "report": [_as_provider_counts(form, plan, tokens, at), at, reason,
                                           _as_provider_counts(form, plan, tokens, len(tokens))]}


def cache_report(state: dict) -> CacheReport:
    return CacheReport(*state["report"])


def _kind(key: str) -> str:
    """A part's kind: "P" prefix, "T" per-task section, "S" summary, else another history part
    (an Anthropic block opening a message has "<" and its role's letter in front)."""
    return key[2:3] if key[:1] == "<" else key[:1]


def _unopened(key: str) -> str:
    """A part's key without what says it opens an Anthropic message: the same summary opens the
    messages when those before it are left out."""
    return key[2:] if key[:1] == "<" else key


def _summaries(keys: list[str]) -> set[str]:
    """The summary parts among ``keys`` (they come first in a window's history), as _unopened keys."""
    return {_unopened(key) for key in keys if _kind(key) == "S"}


def _break_reason(form: str, previous: dict | None, keys: list[str], at: int, changed: tuple[str, ...],
                  first: str, altered: int) -> str:
    if previous is None:
        return "first_turn"
    if previous["form"] != form:
        return "render_changed"
    before = previous["keys"]
    if at == len(before):
        return ""  # all of the previous request is repeated; what follows is new
    if at == 0:
        return "profile:" + changed[0] if changed else "task_changed"  # OpenAI: the cache key (task id)
    mine = _kind(keys[at]) if at < len(keys) else ""
    if mine == "T" or _kind(before[at]) == "T":
        now, then = task_part_names(keys), task_part_names(before)
        if {n: k for n, k in now.items() if not n.startswith(SKILL_PREFIX)} != \
                {n: k for n, k in then.items() if not n.startswith(SKILL_PREFIX)}:
            return "task_changed"
        return "skill_unloaded" if set(then) - set(now) else "skill_loaded"
    if mine == "S" and _unopened(keys[at]) not in _summaries(before):
        return "summary_recorded"  # a summary not fed before entered the window there
    if _kind(before[at]) == "S" and not _summaries(before) <= _summaries(keys):
        return "summary_slid_out"  # no summary entered there, and one fed before is left out
    if first != previous["first"]:
        return "window_start_moved"
    if altered > previous.get("altered", 0):
        return "tool_results_cleared"
    return "history_changed"
