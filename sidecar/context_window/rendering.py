"""Provider request bodies from an assembled context: OpenAI's Responses API and Anthropic's
Messages API, as JSON text the host completes with ``model`` and its own options.

The input is already assembled and provider-neutral: sections in their declared order, the
run's tools, and the transcript window (history). What changes only with the profile (the
static sections and the tools) is serialised once, by :func:`openai_static` or
:func:`anthropic_static`, into fragments that are byte-identical whenever they are built from
equal inputs, since providers' prompt caches hit only on identical prefixes. A turn then
serialises its per-task sections and history items and joins strings.

Both renderings describe the same conversation. History is read as alternating runs: the
assistant's items, then everything else (user, system, tool). A tool result answers its call
only from the run right after the assistant run holding the call; there all the results of
the calls are gathered first, one output per call in call order (Anthropic requires this; the
OpenAI body gets the same shape so it is valid under the strictest pairing too). A call with
no result there gets a fixed placeholder output, because both APIs reject an unanswered call.
A tool result anywhere else, or whose call is not in the history, is fed as plain text.
Messages whose text is blank are dropped (Anthropic rejects blank text blocks; they carry
nothing); tool calls and tool results never are.

Prompt caches hit on the longest identical prefix, so a request is also seen as a list of
*parts*, the units a provider caches by: the static prefix, each per-task section, then each
history item of the body (an OpenAI input item; an Anthropic content block). :func:`openai_parts`
and :func:`anthropic_parts` list a history's parts in body order, each with a key that is equal
exactly when the part's bytes are (and for Anthropic, when it opens the same kind of message)
and the tokens the sidecar counted for the texts it carries (the renderings' fixed texts as the
caller counts them). A provider also counts the framing around each block, which the caller
adds (:data:`FRAMING_TOKENS`).
Anthropic's ``cache_control`` breakpoints go on the last static block, the last per-task block,
and the history blocks the caller names (``rolling``, indices into the history's parts).

Pure: no I/O, standard library only.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring  # the C encoder: json.dumps(s, ensure_ascii=False) for a str
from typing import TypeAlias

from sidecar.caching import CacheSpec, cache_of, text_bytes

# Fed in place of what is missing, fixed so the same history always renders the same bytes.
NO_RESULT = "(no result was recorded for this call)"
CONTINUED = "(The conversation continues from earlier turns.)"
NO_MESSAGES = "(No messages yet.)"

_OTHER_ROLES = frozenset(("system", "user", "tool"))  # everyone's but the assistant's

# A tool call's arguments clipped (sidecar.transcript.window.clip_frame) are this one JSON object,
# whose one string is the arguments' text cut by the elision marker: the text cut is not JSON, and
# Anthropic's tool_use input must be an object (OpenAI's arguments string then holds the same
# one). The key tells the model these are not the arguments as its tool takes them.
CLIPPED_ARGUMENTS = ('{"clipped_arguments":', "}")

# A section's stability: how often it may change, hence where it goes in a cached prefix.
STATIC, PER_TASK, PER_TURN = "static", "per_task", "per_turn"


@dataclass(frozen=True, slots=True)
class TextSection:
    name: str  # a static or per-task section's name (see profiles: STATIC_SECTIONS, TASK_SECTIONS)
    stability: str  # STATIC, PER_TASK or PER_TURN
    text: str  # already rendered, fed as is


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict  # the tool's input JSON schema (an object)


@dataclass(frozen=True, slots=True)
class HistoryItem:
    event_id: str
    role: str  # "system" | "user" | "assistant" | "tool"
    type: str  # free text: "message", "tool_call", "tool_result", "context.summary" ...
    text: str  # exactly what is fed
    call_id: str  # "" if none; ties a tool call to its result(s)
    tool_name: str  # set on a tool call (role "assistant", call_id set): text is then its arguments
    # The text as a JSON string, when the caller has it already (it caches them per event: a
    # turn's window is mostly the previous turn's, and quoting is most of a rendering's cost).
    quoted: str = ""
    key: str = ""  # item_key() of what is fed: equal keys, byte-identical renderings (cached per event too)
    tokens: int = 0  # the text's count in the run's counter
    # A tool result that a later clearing will replace (the caller knows the clearing's rules):
    # the renderings' cache breakpoints never rely on it staying.
    will_change: bool = False


# A part of a request: (key, tokens). Equal keys at the same index: identical bytes there.
Part = tuple[str, int]
# The tokens a provider adds around each block of a request (a tool, a system block or OpenAI's
# instructions, an input item or content block): its role and type markers. An estimate, the same
# for both forms: OpenAI documents 3 a message for its chat format, and a block's type adds one;
# Anthropic documents none. What it misses shows in RecordUsage's drift (docs/transcript.md).
FRAMING_TOKENS = 4
SUMMARY_TYPE = "context.summary"
CACHE_CONTROL = '"cache_control":{"type":"ephemeral"}'


def digest(*texts: str) -> str:
    """A 64-bit digest of ``texts`` (as separate fields), hex: keys that persist across processes."""
    return hashlib.blake2b("\x00".join(texts).encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def item_key(role: str, type: str, text: str, call_id: str, tool_name: str) -> str:
    """What decides an item's bytes in either rendering (its event id is never rendered), and
    whether it is a summary (a break there is a summary recorded). The text is hashed once per
    event by the caller's cache."""
    return ("S" if type == SUMMARY_TYPE else "M") + digest(role, call_id, tool_name, text)


def quote(text: str) -> str:
    """``text`` as a JSON string (what json.dumps gives with ensure_ascii=False), by the C encoder."""
    return encode_basestring(text)


def quoted(item: HistoryItem) -> str:
    return item.quoted or encode_basestring(item.text)


@dataclass(frozen=True, slots=True)
class OpenAIStatic:
    """A profile's fixed parts of a Responses body: everything before the input items, and
    everything after them up to the prompt cache key's value."""

    head: str
    tail: str


@dataclass(frozen=True, slots=True)
class AnthropicStatic:
    """A profile's fixed prefix of a Messages body: the tools and the static system blocks, the
    array left open for the per-task blocks."""

    head: str
    has_system_blocks: bool  # a per-task block after them needs a comma


def _canonical(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False)


def _sorted_tools(tools: Sequence[Tool]) -> list[tuple[Tool, str]]:
    """The tools by name, each with its canonical schema. Two tools of one name would leave
    their order to the caller's, so the bytes would depend on it (and providers refuse them)."""
    ordered = sorted(tools, key=lambda tool: tool.name)
    for before, after in zip(ordered, ordered[1:]):
        if before.name == after.name:
            raise ValueError(f"two tools are named {before.name!r}")
    for tool in ordered:
        if not isinstance(tool.parameters, dict):
            raise ValueError(f"tool {tool.name!r}: parameters must be a JSON schema object")
    return [(tool, _canonical(tool.parameters)) for tool in ordered]


def canonical_tools_json(tools: Sequence[Tool]) -> str:
    """The provider-neutral canonical tool list: sorted by name, keys sorted at every level."""
    return "[" + ",".join('{"description":' + encode_basestring(tool.description) + ',"name":'
                          + encode_basestring(tool.name) + ',"parameters":' + schema + "}"
                          for tool, schema in _sorted_tools(tools)) + "]"


def _static_texts(sections: Sequence[TextSection]) -> list[str]:
    for section in sections:
        if section.stability != STATIC:
            raise ValueError(f"section {section.name!r} is {section.stability}, not static: it would change the "
                             "cached prefix")
    return [section.text for section in sections if not _blank(section.text)]


def _blank(text: str) -> bool:
    return not text or text.isspace()


def openai_static(static_sections: Sequence[TextSection], tools: Sequence[Tool]) -> OpenAIStatic:
    # Without static text the key is left out: an empty instructions string says nothing.
    texts = _static_texts(static_sections)
    head = ('{"instructions":' + encode_basestring("\n\n".join(texts)) + ',"input":[') if texts else '{"input":['
    # strict is sent as false: the Responses API reads an omitted strict as "make the schema
    # strict when it can", which turns every optional parameter into a required one.
    rendered = ['{"type":"function","name":' + encode_basestring(tool.name) + ',"description":'
                + encode_basestring(tool.description) + ',"parameters":' + schema + ',"strict":false}'
                for tool, schema in _sorted_tools(tools)]
    return OpenAIStatic(head, '],"tools":[' + ",".join(rendered) + '],"prompt_cache_key":')


def anthropic_static(static_sections: Sequence[TextSection], tools: Sequence[Tool]) -> AnthropicStatic:
    texts = _static_texts(static_sections)
    rendered = ['{"name":' + encode_basestring(tool.name) + ',"description":' + encode_basestring(tool.description)
                + ',"input_schema":' + schema + "}" for tool, schema in _sorted_tools(tools)]
    blocks = [_TEXT_BLOCK + encode_basestring(text) + "}" for text in texts]
    if blocks:
        # One breakpoint, after the last static block, caches tools and static system together.
        blocks[-1] = blocks[-1][:-1] + _CACHED_END
    return AnthropicStatic('{"tools":[' + ",".join(rendered) + '],"system":[' + ",".join(blocks), bool(blocks))


# The history as turns --------------------------------------------------------------------------

@dataclass(slots=True)
class _Turn:
    """A run of the assistant's items, or of everyone else's. ``items`` are (is_call, item) in
    history order; an assistant turn's ``calls`` map each call's call_id, in call order, to the
    results that answer it (found in the turn after it)."""

    assistant: bool
    items: list[tuple[bool, HistoryItem]]
    calls: dict[str, list[HistoryItem]]


class History:
    """A window's entries as items, split into turns once, when first asked, for everything a
    request renders of them: its cache report's parts, its breakpoints and its body. The
    renderings take it, or the items alone (then each splits them itself)."""

    __slots__ = ("items", "_turns")

    def __init__(self, items: tuple[HistoryItem, ...]) -> None:
        self.items = items
        self._turns: list[_Turn] | None = None

    @property
    def turns(self) -> list[_Turn]:
        """Shared by everything that renders the history: read them, never change them."""
        if self._turns is None:
            self._turns = _split_turns(self.items)
        return self._turns


ItemsOrHistory: TypeAlias = Sequence[HistoryItem] | History  # what a rendering takes


def _turns(history: ItemsOrHistory) -> list[_Turn]:
    return history.turns if isinstance(history, History) else _split_turns(history)


def _split_turns(history: Sequence[HistoryItem]) -> list[_Turn]:
    """``history`` as alternating turns, blank messages dropped, each result that answers a call
    of the assistant turn just before it attached to that call."""
    turns: list[_Turn] = []
    called: set[str] = set()
    turn: _Turn | None = None
    calls: dict[str, list[HistoryItem]] = {}  # the latest assistant turn's
    # _blank inlined below: this runs once per window entry on every turn.
    for item in history:
        role = item.role
        if role == "assistant":
            call_id = item.call_id
            # A call_id already called is fed as text: one id answering two calls is ambiguous,
            # and both APIs refuse a repeated call id.
            is_call = bool(call_id and item.tool_name) and call_id not in called
            if not is_call and (not item.text or item.text.isspace()):
                continue
            if turn is None or not turn.assistant:
                calls = {}
                turn = _Turn(True, [], calls)
                turns.append(turn)
            turn.items.append((is_call, item))
            if is_call:
                called.add(call_id)
                calls[call_id] = []
            continue
        if role not in _OTHER_ROLES:
            raise ValueError(f"history item {item.event_id!r}: unknown role {role!r}")
        answers = calls.get(item.call_id) if role == "tool" else None
        if answers is None and (not item.text or item.text.isspace()):
            continue
        if turn is None or turn.assistant:
            turn = _Turn(False, [], {})
            turns.append(turn)
        if answers is None:
            turn.items.append((False, item))
        else:
            answers.append(item)
    return turns


# OpenAI Responses --------------------------------------------------------------------------------

_OPENAI_ROLES = {"user": "user", "system": "developer", "tool": "user"}  # "tool": a result fed as text
_OPENAI_MESSAGE = {role: '{"type":"message","role":"' + mapped + '","content":'
                   for role, mapped in _OPENAI_ROLES.items()}
_OPENAI_ASSISTANT = '{"type":"message","role":"assistant","content":'
_OPENAI_DEVELOPER = '{"type":"message","role":"developer","content":'


def openai_responses(static: OpenAIStatic, task_sections: Sequence[TextSection], history: ItemsOrHistory,
                     prompt_cache_key: str, prompt_cache_retention: str = "") -> str:
    """A Responses API request body: ``instructions`` (the static sections), ``input`` (the
    per-task sections as developer messages, then the history), ``tools``,
    ``prompt_cache_key``, ``prompt_cache_retention`` when given, and ``store: false``."""
    # One flat list of pieces and one join at the end: the body is built in a single copy.
    q = encode_basestring
    out = [static.head]
    add = out.append
    separator = ""  # before each input item but the first
    for section in task_sections:
        if not _blank(section.text):
            out += (separator, _OPENAI_DEVELOPER, q(section.text), "}")
            separator = ","
    for turn in _turns(history):
        if not turn.assistant:
            for _, item in turn.items:
                out += (separator, _OPENAI_MESSAGE[item.role], quoted(item), "}")
                separator = ","
            continue
        for is_call, item in turn.items:
            if is_call:
                out += (separator, '{"type":"function_call","call_id":', q(item.call_id), ',"name":',
                        q(item.tool_name), ',"arguments":', quoted(item), "}")
            else:
                out += (separator, _OPENAI_ASSISTANT, quoted(item), "}")
            separator = ","
        for call_id, results in turn.calls.items():
            out += (separator, '{"type":"function_call_output","call_id":', q(call_id), ',"output":')
            if not results:
                add(q(NO_RESULT))
            elif len(results) == 1:
                add(quoted(results[0]))
            else:
                # Each function_call takes exactly one output: several results become its parts.
                parts = [result for result in results if result.text]
                add("[" + ",".join('{"type":"input_text","text":' + quoted(part) + "}" for part in parts) + "]"
                    if parts else '""')
            add("}")
    out += (static.tail, q(prompt_cache_key))
    if prompt_cache_retention:
        out += (',"prompt_cache_retention":', q(prompt_cache_retention))
    add(',"store":false}')
    return "".join(out)


def task_part(name: str, text: str, tokens: int) -> Part:
    """A per-task section as a part: its name is in the key (a break there names it)."""
    return "T" + name + "\x00" + digest(text), tokens


def task_part_names(keys: Sequence[str]) -> dict[str, str]:
    """The per-task parts among ``keys``: each section's name and key."""
    return {key[1:key.index("\x00")]: key for key in keys if key[:1] == "T"}


def is_blank(text: str) -> bool:
    """A text the renderings drop (blank)."""
    return _blank(text)


def _output_key(kind: str, call_id: str, results: Sequence[HistoryItem]) -> str:
    keys = (kind, call_id, *(result.key for result in results))
    kept = cache_of(RESULTS_KEYS)
    found = kept.get(keys)
    if found is None:
        found = kind + digest(call_id, *keys[2:])
        kept.put(keys, found, text_bytes(found, *keys) + 8 * len(keys))
    return found


# A call's results as one part, by the call and its results' keys (a window's calls are the
# previous turn's): a digest is a pure function of what it digests.
RESULTS_KEYS = CacheSpec("results_keys", key="kind, call id and its results' item keys",
                         valid="a digest is a pure function of its texts", max_bytes=4 << 20)


def uncounted(text: str) -> int:
    """No count: for the renderings' own texts when the run's counter cannot count them (a
    host-defined one), or when no counter is given."""
    return 0


def openai_parts(history: ItemsOrHistory, fixed: Callable[[str], int] = uncounted,
                 holding: list[tuple[HistoryItem, ...]] | None = None) -> list[Part]:
    """The history's input items in :func:`openai_responses` order, as parts; ``fixed`` counts
    the rendering's fixed texts (a missing result's); ``holding``, when given, gets the items each
    part holds, in the parts' order (a reader showing them; a turn passes none)."""
    parts: list[Part] = []
    add = parts.append
    for turn in _turns(history):
        if not turn.assistant:
            for _, item in turn.items:
                add((item.key, item.tokens))
                if holding is not None:
                    holding.append((item,))
            continue
        for is_call, item in turn.items:
            add(("C" + item.key if is_call else item.key, item.tokens))
            if holding is not None:
                holding.append((item,))
        for call_id, results in turn.calls.items():
            tokens = results[0].tokens if len(results) == 1 else \
                sum(r.tokens for r in results if r.text) if results else fixed(NO_RESULT)
            add((_output_key("O", call_id, results), tokens))
            if holding is not None:
                holding.append(tuple(results))
    return parts


def anthropic_parts(history: ItemsOrHistory) -> list[Part]:
    """The history's content blocks in :func:`anthropic_messages` order, as parts; a block that
    opens a message has "<" and the role's letter in front of its key (the bytes before it differ)."""
    return anthropic_parts_and_first(history, None)[0]


def anthropic_first_block(history: ItemsOrHistory, wanted: Callable[[HistoryItem], bool]) -> int:
    """The index, in :func:`anthropic_parts`' order, of the first block holding an item that
    ``wanted`` accepts (a call's result block holds all the call's results); -1 when none does."""
    return anthropic_parts_and_first(history, wanted)[1]


def _results_tokens(results: list[HistoryItem]) -> int:
    if len(results) == 1:  # the common case, without a generator
        return 0 if _blank(results[0].text) else results[0].tokens
    return sum(r.tokens for r in results if not _blank(r.text))


def _nothing_wanted(item: HistoryItem) -> bool:
    return False


def anthropic_parts_and_first(history: ItemsOrHistory, wanted: Callable[[HistoryItem], bool] | None,
                              fixed: Callable[[str], int] = uncounted,
                              holding: list[tuple[HistoryItem, ...]] | None = None) -> tuple[list[Part], int]:
    """:func:`anthropic_parts` and :func:`anthropic_first_block` in one pass over the history
    (a turn's request needs both; ``wanted`` None: no block is looked for, the index is -1);
    ``fixed`` counts the rendering's fixed texts; ``holding``, when given, gets the items each
    block holds, in the parts' order (none for a block of the rendering's own text)."""
    parts: list[Part] = []
    turns = _turns(history)
    if not turns:
        if holding is not None:
            holding.append(())
        return [("<uN", fixed(NO_MESSAGES))], -1
    if turns[0].assistant:
        parts.append(("<uK", fixed(CONTINUED)))
        if holding is not None:
            holding.append(())
    first = -1
    looking = wanted is not None
    is_wanted = wanted if wanted is not None else _nothing_wanted  # called only while looking
    owed: list[Part] = []
    owed_results: list[list[HistoryItem]] = []
    for turn in turns:
        if turn.assistant:
            blocks: list[Part] = []
        else:
            blocks = owed
            if looking:
                for index, results in enumerate(owed_results, len(parts)):
                    if any(is_wanted(item) for item in results):
                        first, looking = index, False
                        break
        owed = []
        if holding is not None:
            holding += [tuple(results) for results in owed_results] if not turn.assistant else ()
            holding += [(item,) for _, item in turn.items]
        for is_call, item in turn.items:
            if looking and is_wanted(item):
                first, looking = len(parts) + len(blocks), False
            blocks.append(("C" + item.key if is_call else item.key, item.tokens))
        if blocks:
            blocks[0] = (("<a" if turn.assistant else "<u") + blocks[0][0], blocks[0][1])
        parts += blocks
        if turn.assistant:
            owed_results = list(turn.calls.values())
            owed = [(_output_key("R", call_id, results), _results_tokens(results) if results else fixed(NO_RESULT))
                    for call_id, results in turn.calls.items()]
        else:
            owed_results = []
    if owed:
        if looking:
            for index, results in enumerate(owed_results, len(parts)):
                if any(is_wanted(item) for item in results):
                    first = index
                    break
        owed[0] = ("<u" + owed[0][0], owed[0][1])
        parts += owed
        if holding is not None:
            holding += [tuple(results) for results in owed_results]
    return parts, first


# Anthropic reads a prefix at a breakpoint or at any block boundary up to about 20 blocks before
# one ("approximately 20", says its documentation) where an earlier request wrote. A read this
# many blocks before the last block is left to that lookback, with a margin for "about".
ANTHROPIC_LOOKBACK_RELIED = 15
ANTHROPIC_MAX_BREAKPOINTS = 4  # in one request; more are refused


def anthropic_rolling(last: int, reads: Collection[int], keep: int, room: int) -> list[int]:
    """The history's breakpoints (indices into the request's parts), at most ``room`` (the four
    less the system's): the last block (the write, which the next request reads); the newest of
    ``reads`` (where the previous request wrote and that is still identical) when the lookback
    from the last block would not reach it; and ``keep``, the block before the first one a
    clearing may change (-1: none), so that a clearing's request still reads everything before
    what it cleared: without it, the newest written prefix then is the static one."""
    chosen = [last]
    read = max(reads, default=-1)
    if read >= 0 and last - read > ANTHROPIC_LOOKBACK_RELIED:
        chosen.append(read)
    for extra in (keep, read):  # with room to spare, the read is marked even when the lookback reaches it
        if 0 <= extra < last and extra not in chosen and len(chosen) < room:
            chosen.append(extra)
    return sorted(chosen)


# Anthropic Messages ------------------------------------------------------------------------------

_TEXT_BLOCK = '{"type":"text","text":'
_CACHED_END = "," + CACHE_CONTROL + "}"  # a block's closing brace, with a breakpoint
_USER = '{"role":"user","content":['
_ASSISTANT = '{"role":"assistant","content":['
_TOOL_USE_ID = re.compile(r"[A-Za-z0-9_-]+")


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _tool_use_id(call_id: str) -> str:
    """Anthropic accepts only ids of [A-Za-z0-9_-]; any other call_id is fed as a digest of
    itself, the same in the call and in its result."""
    if _TOOL_USE_ID.fullmatch(call_id):
        return call_id
    return "cs_" + hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:32]


_MEMOISED_ARGUMENTS_CHARS = 4096  # longer arguments are checked on each rendering, not kept


def _arguments(item: HistoryItem) -> str:
    """The tool call's arguments, checked to be one JSON object, as they are: the text parsed
    as one, so it needs no re-serialisation. A text that is not one is fed as clipped."""
    text = item.text
    if len(text) <= _MEMOISED_ARGUMENTS_CHARS:
        kept = cache_of(ARGUMENTS_PROBLEMS)
        problem = kept.get(text)
        if problem is None:
            problem = _object_problem(text)
            kept.put(text, problem, text_bytes(text, problem))
    else:
        problem = _object_problem(text)
    if problem:  # a call's arguments are checked when appended: only a clip kept from before clips were objects
        return CLIPPED_ARGUMENTS[0] + encode_basestring(text) + CLIPPED_ARGUMENTS[1]
    return text


def _object_problem(text: str) -> str:
    """Why ``text`` is not one JSON object; "" when it is."""
    try:
        # NaN and Infinity parse in Python but are not JSON, and the text is fed as it is.
        arguments = json.loads(text, parse_constant=_reject_constant)
    except ValueError as error:
        return f"its arguments are not a JSON object ({error})"
    if not isinstance(arguments, dict):
        return f"its arguments are a JSON {type(arguments).__name__}, not an object"
    return ""


# Every turn renders again each call its window holds: what is checked and quoted of a call is
# kept, a pure function of its text and its id.
ARGUMENTS_PROBLEMS = CacheSpec("arguments_problems", key="a tool call's arguments, up to 4,096 characters",
                               valid="the check is a pure function of the text", max_bytes=4 << 20)
TOOL_USE_IDS = CacheSpec("tool_use_ids", key="a call id", valid="the quoted id is a pure function of it",
                         max_bytes=2 << 20)


def _quoted_tool_use_id(call_id: str) -> str:
    kept = cache_of(TOOL_USE_IDS)
    quoted = kept.get(call_id)
    if quoted is None:
        quoted = encode_basestring(_tool_use_id(call_id))
        kept.put(call_id, quoted, text_bytes(call_id, quoted))
    return quoted


def _tool_result(call_id: str, results: list[HistoryItem]) -> str:
    head = '{"type":"tool_result","tool_use_id":' + _quoted_tool_use_id(call_id)
    if not results:
        return head + ',"content":' + encode_basestring(NO_RESULT) + "}"
    if len(results) == 1:
        text = results[0].text
        # Content is optional; a blank one is refused like a blank text block.
        return head + "}" if _blank(text) else head + ',"content":' + quoted(results[0]) + "}"
    # Each tool_use takes exactly one tool_result: several results become its text blocks.
    parts = [_TEXT_BLOCK + quoted(r) + "}" for r in results if not _blank(r.text)]
    return head + ',"content":[' + ",".join(parts) + "]}" if parts else head + "}"


def anthropic_messages(static: AnthropicStatic, task_sections: Sequence[TextSection],
                       history: ItemsOrHistory, rolling: Collection[int] = ()) -> str:
    """A Messages API request body: ``tools``, ``system`` (the static blocks, the last one a
    cache breakpoint, then the per-task blocks, the last one a breakpoint too) and ``messages``
    (the history, alternating user and assistant, starting with user), with a breakpoint on
    each history block whose index (in :func:`anthropic_parts`' order) is in ``rolling``.

    System items (summaries included) are user-side text: Anthropic has no system role inside
    messages, and keeping them in the history's place keeps everything after them cacheable.
    A history ending with an assistant message is left so (the API reads it as a prefill), and
    the API refuses tool calls in a body without tools: the run's tools belong in ``static``."""
    # One flat list of pieces and one join at the end: the body is built in a single copy. A
    # block's closing piece is its own item (or ends one), so a breakpoint is spliced into it.
    q = encode_basestring
    out = [static.head]
    separator = "," if static.has_system_blocks else ""
    last_task_block = -1
    for section in task_sections:
        if not _blank(section.text):
            out += (separator, _TEXT_BLOCK, q(section.text), "}")
            last_task_block = len(out) - 1
            separator = ","
    if last_task_block >= 0:
        out[last_task_block] = _CACHED_END
    out.append('],"messages":[')
    ends: list[int] = []  # the piece closing each history block, in anthropic_parts' order
    turns = _turns(history)
    if not turns:
        out += (_USER, _TEXT_BLOCK, q(NO_MESSAGES), "}")
        ends.append(len(out) - 1)
        out.append("]}")
    elif turns[0].assistant:
        out += (_USER, _TEXT_BLOCK, q(CONTINUED), "}")
        ends.append(len(out) - 1)
        out.append("]},")
    owed: list[str] = []  # tool_results for the last assistant turn: first in the next user message
    for position, turn in enumerate(turns):
        if position:
            out.append(",")
        if not turn.assistant:
            out.append(_USER)
            separator = ""
            for result in owed:
                out += (separator, result)
                ends.append(len(out) - 1)
                separator = ","
            owed = []
            for _, item in turn.items:
                out += (separator, _TEXT_BLOCK, quoted(item), "}")
                ends.append(len(out) - 1)
                separator = ","
            out.append("]}")
            continue
        out.append(_ASSISTANT)
        separator = ""
        for is_call, item in turn.items:
            if is_call:
                out += (separator, '{"type":"tool_use","id":', _quoted_tool_use_id(item.call_id), ',"name":',
                        q(item.tool_name), ',"input":', _arguments(item), "}")
            else:
                out += (separator, _TEXT_BLOCK, quoted(item), "}")
            ends.append(len(out) - 1)
            separator = ","
        out.append("]}")
        owed = [_tool_result(call_id, answers) for call_id, answers in turn.calls.items()]
    if owed:  # the history ends with calls: their results (placeholders) make the last user message
        out += (",", _USER)
        separator = ""
        for result in owed:
            out += (separator, result)
            ends.append(len(out) - 1)
            separator = ","
        out.append("]}")
    for index in rolling:
        end = ends[index]  # an index past the history's blocks is the caller's defect
        out[end] = out[end][:-1] + "," + CACHE_CONTROL + "}"
    out.append("]}")
    return "".join(out)


# Where a body's parts are ---------------------------------------------------------------------------

# A JSON body's tokens that matter to its structure: a string (a key when a colon follows), a bracket.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"(\s*:)?|[{}\[\]]')
_CACHE_CONTROL_KEY = '"cache_control"'


@dataclass(frozen=True, slots=True)
class BodyMap:
    """Where a rendered body's parts and breakpoints are, as offsets into its text."""

    starts: list[int]  # where each part after the static prefix begins, in the parts' order
    end: int  # where the last part ends (the history's array closes there)
    breakpoints: list[int]  # where each block-level ``cache_control`` begins (CACHE_CONTROL's text)


def body_map(form: str, body: str, static_blocks: int) -> BodyMap:
    """Where the parts of ``body`` (rendered in ``form``) begin, found in its JSON: for OpenAI each
    ``input`` item; for Anthropic each ``system`` block after the ``static_blocks`` static ones (the
    per-task sections), then each block of the messages' contents. Its breakpoints are the
    ``cache_control`` keys of system and message content blocks (a tool's schema or a call's
    arguments may hold that key too: those are not breakpoints)."""
    stack: list[tuple[str, str]] = []  # each open container's bracket and the key it sits under
    key = ""
    system: list[int] = []
    blocks: list[int] = []
    breakpoints: list[int] = []
    end = 0
    for token in _JSON_TOKEN.finditer(body):
        text = token.group()
        if text[0] == '"':
            colon = token.group(1)
            key = text[:len(text) - len(colon)] if colon is not None else ""
            if key == _CACHE_CONTROL_KEY and _path(stack) in (("system", ""), ("messages", "", "content", "")):
                breakpoints.append(token.start())
            continue
        if text in "{[":
            where = _path(stack)
            if form == "openai_responses" and where == ("input",):
                blocks.append(token.start())
            elif where == ("system",):
                system.append(token.start())
            elif where == ("messages", "", "content"):
                blocks.append(token.start())
            stack.append((text, key if stack and stack[-1][0] == "{" else ""))
            key = ""
            continue
        closed = _path(stack)
        stack.pop()
        key = ""
        if closed in (("input",), ("messages", "", "content")):
            end = token.start()
    return BodyMap((system[static_blocks:] if form == "anthropic_messages" else []) + blocks, end, breakpoints)


def _path(stack: list[tuple[str, str]]) -> tuple[str, ...]:
    """The keys (unquoted; "" for an array's element) from the body's root to where the scan is."""
    return tuple(key.strip('"') for _, key in stack[1:])
