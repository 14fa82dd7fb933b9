"""Provider request bodies (sidecar.context_window.rendering): exact shapes on small cases, the providers' own
pairing and ordering rules on seeded random histories, byte-stable static prefixes, and texts
fed byte for byte. The checks below restate the APIs' rules, not the module's algorithm."""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace

import pytest

from sidecar.context_window.rendering import (
    CONTINUED,
    NO_MESSAGES,
    NO_RESULT,
    HistoryItem,
    TextSection,
    Tool,
    anthropic_first_block,
    anthropic_messages,
    anthropic_rolling,
    anthropic_static,
    canonical_tools_json,
    openai_responses,
    openai_static,
)

OPENAI_KEYS = ["instructions", "input", "tools", "prompt_cache_key", "store"]
RETENTIONS = ("in_memory", "24h")  # what the Responses API takes for prompt_cache_retention
CACHED = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4  # Anthropic refuses more cache_control blocks in one request
ANTHROPIC_KEYS = ["tools", "system", "messages"]
TOOL_USE_ID = re.compile(r"[A-Za-z0-9_-]+")
TRICKY = 'héllo 🙂 日本 "quoted" back\\slash\nnew line\ttab </script><!-- \u2028 \x00 \x1f'

STATIC = [TextSection("system_prompt", "static", "You are careful."),
          TextSection("skills_index", "static", "Skills: refunds, search.")]
TASK = [TextSection("task", "per_task", "Answer the refund question."),
        TextSection("skill:refunds", "per_task", "Refunds take 5 days.")]
TOOLS = [Tool("search", "Search the docs", {"type": "object", "properties": {"q": {"type": "string"}}}),
         Tool("calc", "Arithmetic", {"type": "object", "properties": {"expr": {"type": "string"}}})]


def item(event_id: str, role: str, text: str, call_id: str = "", tool_name: str = "",
         type: str = "message") -> HistoryItem:
    return HistoryItem(event_id, role, type, text, call_id, tool_name)


def call(event_id: str, call_id: str, arguments: str = "{}", tool_name: str = "search") -> HistoryItem:
    return item(event_id, "assistant", arguments, call_id, tool_name, "tool_call")


def result(event_id: str, call_id: str, text: str) -> HistoryItem:
    return item(event_id, "tool", text, call_id, type="tool_result")


def render_openai(history, static=STATIC, task=TASK, tools=TOOLS, key="task-1") -> dict:
    body = openai_responses(openai_static(static, tools), task, history, key)
    return check_openai(body, has_instructions=any(s.text.strip() for s in static))


def render_anthropic(history, static=STATIC, task=TASK, tools=TOOLS) -> dict:
    body = anthropic_messages(anthropic_static(static, tools), task, history)
    return check_anthropic(body, static_blocks=sum(1 for s in static if s.text.strip()))


# The providers' rules, as checks ------------------------------------------------------------------

def check_openai(body: str, has_instructions: bool) -> dict:
    """A Responses body: the documented keys in order, tools by name, and every function_call
    answered by exactly one output right after its assistant run, no output without its call."""
    doc = json.loads(body)
    keys = OPENAI_KEYS if has_instructions else OPENAI_KEYS[1:]
    if "prompt_cache_retention" in doc:
        assert doc["prompt_cache_retention"] in RETENTIONS
        keys = keys[:-1] + ["prompt_cache_retention", "store"]
    assert list(doc) == keys
    assert doc["store"] is False and isinstance(doc["prompt_cache_key"], str)
    names = [tool["name"] for tool in doc["tools"]]
    assert names == sorted(names) and len(set(names)) == len(names)
    for tool in doc["tools"]:
        assert list(tool) == ["type", "name", "description", "parameters", "strict"]
        assert tool["type"] == "function" and tool["strict"] is False
    called: set[str] = set()
    pending: set[str] = set()  # calls of the current assistant run, not yet answered
    phase = "user"
    for entry in doc["input"]:
        kind = entry["type"]
        if kind == "function_call" or (kind == "message" and entry["role"] == "assistant"):
            if phase != "assistant":
                assert not pending, f"calls {pending} unanswered before {entry}"
                phase = "assistant"
            if kind == "function_call":
                assert list(entry) == ["type", "call_id", "name", "arguments"]
                assert entry["call_id"] not in called, "a call id is used twice"
                assert isinstance(json.loads(entry["arguments"]), dict)
                called.add(entry["call_id"])
                pending.add(entry["call_id"])
        elif kind == "function_call_output":
            assert list(entry) == ["type", "call_id", "output"]
            assert entry["call_id"] in pending, f"output {entry['call_id']} does not answer the assistant run before it"
            pending.discard(entry["call_id"])
            phase = "outputs"
            output = entry["output"]
            assert isinstance(output, str) or all(
                list(part) == ["type", "text"] and part["type"] == "input_text" for part in output)
        else:
            assert kind == "message" and entry["role"] in ("user", "developer"), entry
            assert not pending, f"calls {pending} unanswered before {entry}"
            phase = "user"
        if kind == "message":
            assert list(entry) == ["type", "role", "content"] and isinstance(entry["content"], str)
    assert not pending, f"calls {pending} never answered"
    return doc


def uncached(block: dict) -> dict:
    """The block without its breakpoint (checked to be the documented one, last)."""
    if "cache_control" not in block:
        return block
    assert list(block)[-1] == "cache_control" and block["cache_control"] == CACHED
    return {key: value for key, value in block.items() if key != "cache_control"}


def breakpoints(doc: dict) -> list[int]:
    """The blocks with a breakpoint, as indices into system blocks + message blocks."""
    blocks = doc["system"] + [block for message in doc["messages"] for block in message["content"]]
    return [n for n, block in enumerate(blocks) if "cache_control" in block]


def check_anthropic(body: str, static_blocks: int) -> dict:
    """A Messages body: keys in cache-prefix order, tools by name, non-blank text everywhere,
    breakpoints on the last static and the last per-task block and at most 4 in all, roles
    alternating from user, and the tool_results first in each user message, answering exactly
    the tool_uses of the message before it."""
    doc = json.loads(body)
    assert list(doc) == ANTHROPIC_KEYS
    names = [tool["name"] for tool in doc["tools"]]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert all(list(tool) == ["name", "description", "input_schema"] for tool in doc["tools"])
    assert len(breakpoints(doc)) <= MAX_BREAKPOINTS
    last = len(doc["system"]) - 1
    for position, block in enumerate(doc["system"]):
        assert block["type"] == "text" and block["text"].strip()
        if position in (static_blocks - 1, last):
            assert list(block) == ["type", "text", "cache_control"] and block["cache_control"] == CACHED
        else:
            assert list(block) == ["type", "text"]
    messages = doc["messages"]
    assert messages, "at least one message"
    tool_use_ids: set[str] = set()
    owed: list[str] = []  # tool_use ids of the previous (assistant) message
    for position, message in enumerate(messages):
        assert list(message) == ["role", "content"]
        assert message["role"] == ("user" if position % 2 == 0 else "assistant")
        content = [uncached(block) for block in message["content"]]
        assert content, "no empty message"
        for block in content:
            if block["type"] == "text":
                assert list(block) == ["type", "text"] and block["text"].strip(), "blank text block"
        if message["role"] == "assistant":
            assert all(block["type"] in ("text", "tool_use") for block in content)
            owed = []
            for block in content:
                if block["type"] == "tool_use":
                    assert list(block) == ["type", "id", "name", "input"] and isinstance(block["input"], dict)
                    assert TOOL_USE_ID.fullmatch(block["id"]) and block["id"] not in tool_use_ids
                    tool_use_ids.add(block["id"])
                    owed.append(block["id"])
            continue
        kinds = [block["type"] for block in content]
        assert set(kinds) <= {"text", "tool_result"}
        leading = kinds.count("tool_result")
        assert kinds[:leading] == ["tool_result"] * leading, "tool_result blocks come first"
        answered = [block["tool_use_id"] for block in content[:leading]]
        assert sorted(answered) == sorted(owed), f"message {position} answers {answered}, owed {owed}"
        for block in content[:leading]:
            assert set(block) <= {"type", "tool_use_id", "content"}
            if "content" in block:
                inner = block["content"]
                assert (isinstance(inner, str) and inner.strip()) or (inner and all(
                    list(part) == ["type", "text"] and part["type"] == "text" and part["text"].strip()
                    for part in inner))
        owed = []
    assert not owed or messages[-1]["role"] == "user", "the last assistant message's tool_uses are answered"
    return doc


# What was fed, in order -----------------------------------------------------------------------------

def openai_fed(doc: dict, task_count: int) -> list[tuple[str, str]]:
    """(kind, text) of every history text in the input: message, call (arguments) or output."""
    fed = []
    for entry in doc["input"][task_count:]:
        if entry["type"] == "message":
            fed.append(("message", entry["content"]))
        elif entry["type"] == "function_call":
            fed.append(("call", entry["arguments"]))
        else:
            output = entry["output"]
            fed += [("output", text) for text in ([output] if isinstance(output, str) else
                                                 [part["text"] for part in output])]
    return fed


def anthropic_fed(doc: dict) -> list[tuple[str, str]]:
    fed = []
    for message in doc["messages"]:
        for block in message["content"]:
            if block["type"] == "text":
                fed.append(("message", block["text"]))
            elif block["type"] == "tool_use":
                fed.append(("call", block["input"]))
            else:
                inner = block.get("content", "")
                fed += [("output", text) for text in ([inner] if isinstance(inner, str) else
                                                     [part["text"] for part in inner])]
    return fed


def check_fed_in_order(fed: list[tuple[str, object]], history: list[HistoryItem], structural: set[str]) -> None:
    """Every non-blank text is fed exactly once. Everything but tool results keeps its history
    order; a tool result stays between the assistant items around it, and is fed as an output
    exactly when ``structural`` (its event id) says its call answers it."""
    by_text = {}
    for h in history:
        if h.role == "assistant" and h.tool_name and h.call_id:
            by_text[json.dumps(json.loads(h.text), sort_keys=True)] = h
        by_text.setdefault(h.text, h)
    positions: dict[str, int] = {}
    for position, (kind, text) in enumerate(fed):
        key = json.dumps(text, sort_keys=True) if isinstance(text, dict) else text
        if text in (NO_RESULT, CONTINUED, NO_MESSAGES) or not (isinstance(text, dict) or text.strip()):
            continue
        h = by_text[key]
        assert h.event_id not in positions, f"{h.event_id} fed twice"
        positions[h.event_id] = position
        if h.role == "tool":
            assert (kind == "output") == (h.event_id in structural), h
    fed_ids = [h.event_id for h in history if h.role != "tool" and h.event_id in positions]
    assert fed_ids == sorted(fed_ids, key=positions.__getitem__), "history order kept"
    around = [(o_index, positions[o.event_id]) for o_index, o in enumerate(history)
              if o.role == "assistant" and o.event_id in positions]
    for index, h in enumerate(history):
        if not h.text.strip() and not (h.role == "assistant" and h.tool_name):
            continue
        assert h.event_id in positions, f"{h.event_id} not fed"
        if h.role != "tool":
            continue
        before = [position for o_index, position in around if o_index < index]
        after = [position for o_index, position in around if o_index > index]
        assert (not before or max(before) < positions[h.event_id]) and (not after or positions[h.event_id] < min(after))


def answerable(history: list[HistoryItem]) -> set[str]:
    """The rule, restated: a tool result answers its call when the call (the first with its id)
    is in the run of assistant items just before the result's run. What is not fed (a blank
    message, a blank result answering nothing) splits no run."""
    first_calls: dict[str, str] = {}
    for h in history:
        if h.role == "assistant" and h.call_id and h.tool_name:
            first_calls.setdefault(h.call_id, h.event_id)

    def fed(o: HistoryItem) -> bool:
        return bool(o.text.strip()) or o.event_id in first_calls.values() or o.event_id in structural

    structural: set[str] = set()
    for index, h in enumerate(history):
        if h.role != "tool" or h.call_id not in first_calls:
            continue
        back = index - 1
        while back >= 0 and not (history[back].role == "assistant" and fed(history[back])):
            back -= 1
        run: set[str] = set()
        while back >= 0 and (history[back].role == "assistant" or not fed(history[back])):
            run.add(history[back].event_id)
            back -= 1
        if first_calls[h.call_id] in run:
            structural.add(h.event_id)
    return structural


# Seeded random histories -------------------------------------------------------------------------

def random_history(rng: random.Random, size: int) -> list[HistoryItem]:
    """User and assistant messages, parallel tool calls with one or more results (sometimes
    late, out of order, past a user message, past an assistant message or missing), summaries,
    orphan results, assistant text with a call_id but no tool, blank messages; unique texts."""
    history: list[HistoryItem] = []
    counter = 0

    def text(event_id: str) -> str:
        return f"[{event_id}] " + rng.choice(["plain", TRICKY, "x" * rng.randint(1, 50), "🙂" * 3, "</script>"])

    def next_id(prefix: str) -> str:
        nonlocal counter
        counter += 1
        return f"{prefix}{counter}"

    late: list[HistoryItem] = []
    while len(history) < size:
        roll = rng.random()
        if roll < 0.2:
            e = next_id("u")
            history.append(item(e, "user", text(e)))
        elif roll < 0.35:
            e = next_id("a")
            history.append(item(e, "assistant", text(e)))
        elif roll < 0.4:
            e = next_id("s")
            history.append(item(e, "system", text(e), type="context.summary"))
        elif roll < 0.45:
            e = next_id("o")
            history.append(result(e, f"gone-{e}", text(e)))
        elif roll < 0.48:
            e = next_id("x")
            history.append(item(e, "assistant", text(e), call_id=f"k{e}"))
        elif roll < 0.52:
            e = next_id("b")
            history.append(item(e, rng.choice(["user", "assistant", "system"]), rng.choice(["", " ", "\n\t"])))
        elif roll < 0.55 and late:
            history.append(late.pop(rng.randrange(len(late))))
        else:
            calls = []
            for _ in range(rng.randint(1, 3)):
                e = next_id("c")
                call_id = rng.choice([f"call_{e}", f"call:{e}", f"{e}.id"])
                arguments = json.dumps({"id": e, "q": rng.choice(["refund", TRICKY])}, ensure_ascii=rng.random() < 0.5)
                if rng.random() < 0.2:
                    arguments = arguments.replace(",", " ,\n ")
                calls.append(call(e, call_id, arguments, rng.choice(["search", "calc"])))
                if rng.random() < 0.2:
                    e = next_id("a")
                    calls.append(item(e, "assistant", text(e)))
            history += calls
            results = []
            for c in calls:
                if not c.tool_name:
                    continue
                for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
                    e = next_id("r")
                    results.append(result(e, c.call_id, rng.choice([text(e), text(e), ""])))
            rng.shuffle(results)
            for r in results:
                fate = rng.random()
                if fate < 0.1:
                    late.append(r)  # fed later: past other items, perhaps past an assistant turn
                    continue
                if fate < 0.2:
                    e = next_id("u")
                    history.append(item(e, "user", text(e)))
                history.append(r)
            if rng.random() < 0.05:
                e = next_id("d")  # the same call id called again
                history.append(call(e, calls[0].call_id, json.dumps({"id": e})))
    return history[:size]


@pytest.mark.parametrize("seed", range(40))
def test_random_histories_render_valid_bodies_with_every_text_in_place(seed: int) -> None:
    rng = random.Random(seed)
    history = random_history(rng, rng.randint(150, 400))
    if seed % 4 == 0:
        history = history[rng.randint(1, 30):]  # a window that cut calls off, or starts with the assistant
    structural = answerable(history)
    openai = render_openai(history)
    check_fed_in_order(openai_fed(openai, len(TASK)), history, structural)
    anthropic = render_anthropic(history)
    check_fed_in_order(anthropic_fed(anthropic), history, structural)
    # Anthropic takes the arguments as an object: they are fed as written, byte for byte.
    anthropic_body = anthropic_messages(anthropic_static(STATIC, TOOLS), TASK, history)
    called: set[str] = set()
    for h in history:
        if h.role == "assistant" and h.tool_name and h.call_id not in called:
            called.add(h.call_id)
            assert f',"input":{h.text}}}' in anthropic_body
    assert sum(1 for e in openai["input"] if e["type"] == "function_call_output") == sum(
        1 for m in anthropic["messages"] for b in m["content"] if b["type"] == "tool_result")


@pytest.mark.parametrize("seed", range(20))
def test_the_first_block_holding_an_item_is_found_in_the_bodys_order(seed: int) -> None:
    """anthropic_first_block (where the breakpoint before a clearing's first change goes) against
    the rendered body itself: the first message block whose JSON holds the marked text."""
    rng = random.Random(seed)
    history = random_history(rng, rng.randint(50, 200))
    if seed % 4 == 0:
        history = history[rng.randint(1, 30):]
    tools = [n for n, h in enumerate(history) if h.role == "tool"]
    marked = set(rng.sample(tools, min(len(tools), rng.randint(1, 3))))
    history = [replace(h, text=f"MARKED-{n}", quoted="", key="") if n in marked else h for n, h in enumerate(history)]
    blocks = [b for m in render_anthropic(history)["messages"] for b in m["content"]]
    expected = next((n for n, b in enumerate(blocks) if "MARKED-" in json.dumps(b)), -1)
    found = anthropic_first_block(history, lambda h: h.text.startswith("MARKED-"))
    assert found == expected
    if found >= 0:  # a breakpoint there lands on that block
        body = json.loads(anthropic_messages(anthropic_static(STATIC, TOOLS), TASK, history, [found]))
        assert [n for n, b in enumerate(b for m in body["messages"] for b in m["content"]) if "cache_control" in b] \
            == [found]


def test_history_breakpoints_read_write_and_keep_within_the_room() -> None:
    last = 100
    # The previous write within the lookback's sure reach: the last block and the clearing's edge.
    assert anthropic_rolling(last, [90], 40, 2) == [40, 100]
    # Out of its reach: the read is marked; the edge waits for a request with room for it.
    assert anthropic_rolling(last, [80, 40], 40, 2) == [80, 100]
    assert anthropic_rolling(last, [80], 40, 3) == [40, 80, 100]
    # Room to spare: the read is marked even within reach; nothing repeated, nothing past the last block.
    assert anthropic_rolling(last, [90], 40, 4) == [40, 90, 100]
    assert anthropic_rolling(last, [100], 100, 4) == [100]
    assert anthropic_rolling(last, [], -1, 2) == [100]
    assert all(len(anthropic_rolling(last, [r], k, room)) <= room
               for r in range(0, 101, 7) for k in range(-1, 101, 9) for room in (2, 3, 4))


def test_the_random_histories_cover_every_case() -> None:
    """Guards the test above: its histories hold what it claims to check."""
    seen: dict[str, int] = dict.fromkeys(["answered", "answered past a user message", "late, as text", "orphan",
                                          "unanswered", "several results", "empty result", "hashed id"], 0)
    for seed in range(40):
        history = random_history(random.Random(seed), 200)
        structural = answerable(history)
        called = {h.call_id for h in history if h.role == "assistant" and h.tool_name}
        seen["answered"] += len(structural)
        seen["late, as text"] += sum(1 for h in history if h.role == "tool" and h.call_id in called
                                     and h.event_id not in structural and h.text)
        seen["orphan"] += sum(1 for h in history if h.role == "tool" and h.call_id not in called)
        seen["answered past a user message"] += sum(
            1 for before, after in zip(history, history[1:]) if before.role == "user" and after.event_id in structural)
        results = [b for m in render_anthropic(history)["messages"] for b in m["content"] if b["type"] == "tool_result"]
        seen["unanswered"] += sum(1 for b in results if b.get("content") == NO_RESULT)
        seen["several results"] += sum(1 for b in results if isinstance(b.get("content"), list))
        seen["empty result"] += sum(1 for b in results if "content" not in b)
        seen["hashed id"] += sum(1 for b in results if b["tool_use_id"].startswith("cs_"))
    assert min(seen.values()) >= 10, seen


# Exact shapes ------------------------------------------------------------------------------------

def canonical(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


REFUNDS = "<untrusted-data>Refunds: 30 days.</untrusted-data>"
HISTORY = [
    item("s1", "system", "Earlier: the user asked about refunds.", type="context.summary"),
    item("u1", "user", TRICKY),
    call("c1", "k1", '{"q": "refund"}'),
    item("u2", "user", "hurry please"),
    result("r1", "k1", REFUNDS),
    result("o1", "lost", "an orphan result"),
    item("a1", "assistant", "Refunds take 30 days."),
    item("x1", "assistant", "a note with a call id", call_id="k9"),
    call("c2", "k:2", '{"expr": "1+1"}', "calc"),
]


def test_openai_body_is_exactly_the_documented_one() -> None:
    body = openai_responses(openai_static(STATIC, TOOLS), TASK, HISTORY, 'task "1"')

    def message(role: str, text: str) -> dict:
        return {"type": "message", "role": role, "content": text}

    assert body == canonical({
        "instructions": "You are careful.\n\nSkills: refunds, search.",
        "input": [
            message("developer", "Answer the refund question."), message("developer", "Refunds take 5 days."),
            message("developer", "Earlier: the user asked about refunds."), message("user", TRICKY),
            {"type": "function_call", "call_id": "k1", "name": "search", "arguments": '{"q": "refund"}'},
            # The result answers its call right after it; the user's message sent meanwhile follows.
            {"type": "function_call_output", "call_id": "k1", "output": REFUNDS},
            message("user", "hurry please"), message("user", "an orphan result"),
            message("assistant", "Refunds take 30 days."), message("assistant", "a note with a call id"),
            {"type": "function_call", "call_id": "k:2", "name": "calc", "arguments": '{"expr": "1+1"}'},
            {"type": "function_call_output", "call_id": "k:2", "output": NO_RESULT}],
        "tools": [
            {"type": "function", "name": "calc", "description": "Arithmetic",
             "parameters": {"properties": {"expr": {"type": "string"}}, "type": "object"}, "strict": False},
            {"type": "function", "name": "search", "description": "Search the docs",
             "parameters": {"properties": {"q": {"type": "string"}}, "type": "object"}, "strict": False}],
        "prompt_cache_key": 'task "1"',
        "store": False})


def test_anthropic_body_is_exactly_the_documented_one() -> None:
    body = anthropic_messages(anthropic_static(STATIC, TOOLS), TASK, HISTORY)

    def text(value: str) -> dict:
        return {"type": "text", "text": value}

    hashed = json.loads(body)["messages"][3]["content"][2]["id"]
    assert re.fullmatch(r"cs_[0-9a-f]{32}", hashed)  # "k:2" is not an id Anthropic accepts
    assert body == canonical({
        "tools": [
            {"name": "calc", "description": "Arithmetic",
             "input_schema": {"properties": {"expr": {"type": "string"}}, "type": "object"}},
            {"name": "search", "description": "Search the docs",
             "input_schema": {"properties": {"q": {"type": "string"}}, "type": "object"}}],
        "system": [text("You are careful."),
                   {"type": "text", "text": "Skills: refunds, search.", "cache_control": {"type": "ephemeral"}},
                   text("Answer the refund question."),
                   {"type": "text", "text": "Refunds take 5 days.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [text("Earlier: the user asked about refunds."), text(TRICKY)]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "k1", "name": "search", "input": {"q": "refund"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "k1", "content": REFUNDS},
                text("hurry please"), text("an orphan result")]},
            {"role": "assistant", "content": [
                text("Refunds take 30 days."), text("a note with a call id"),
                {"type": "tool_use", "id": hashed, "name": "calc", "input": {"expr": "1+1"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": hashed, "content": NO_RESULT}]}],
    }).replace('"input":{"q":"refund"}', '"input":{"q": "refund"}').replace(
        '"input":{"expr":"1+1"}', '"input":{"expr": "1+1"}')  # arguments are fed as written
    check_anthropic(body, static_blocks=2)


# Static prefixes ---------------------------------------------------------------------------------

def test_static_fragments_are_byte_stable_and_independent_of_tool_order() -> None:
    reordered = [Tool(t.name, t.description, dict(reversed(list(t.parameters.items())))) for t in reversed(TOOLS)]
    assert openai_static(STATIC, TOOLS) == openai_static(list(STATIC), reordered)
    assert anthropic_static(STATIC, TOOLS) == anthropic_static(list(STATIC), reordered)
    assert canonical_tools_json(TOOLS) == canonical_tools_json(reordered)
    # The neutral list is the canonical JSON of the tools, sorted by name.
    assert canonical_tools_json(TOOLS) == json.dumps(
        [{"name": t.name, "description": t.description, "parameters": t.parameters}
         for t in sorted(TOOLS, key=lambda t: t.name)], ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    # The per-turn body starts with the static prefix, whatever the history.
    anthropic = anthropic_static(STATIC, TOOLS)
    assert anthropic_messages(anthropic, TASK, HISTORY).startswith(anthropic.head)
    assert anthropic_messages(anthropic, [], []).startswith(anthropic.head)
    openai = openai_static(STATIC, TOOLS)
    assert openai_responses(openai, TASK, HISTORY, "t").startswith(openai.head)


def test_changing_one_schema_changes_the_fragments() -> None:
    changed = [TOOLS[0], Tool("calc", "Arithmetic", {"type": "object", "properties": {"expr": {"type": "number"}}})]
    assert canonical_tools_json(changed) != canonical_tools_json(TOOLS)
    assert openai_static(STATIC, changed).tail != openai_static(STATIC, TOOLS).tail
    assert anthropic_static(STATIC, changed).head != anthropic_static(STATIC, TOOLS).head
    assert '"number"' in anthropic_static(STATIC, changed).head


def test_bad_static_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="two tools are named 'calc'"):
        openai_static(STATIC, TOOLS + [Tool("calc", "again", {"type": "object"})])
    with pytest.raises(ValueError, match="'task' is per_task"):
        anthropic_static(STATIC + TASK[:1], TOOLS)
    with pytest.raises(ValueError):
        canonical_tools_json([Tool("t", "d", {"type": "object", "default": float("nan")})])


# Edge cases --------------------------------------------------------------------------------------

def test_no_static_sections_no_tools_and_no_history() -> None:
    openai = render_openai([], static=[], task=[], tools=[])
    assert openai == {"input": [], "tools": [], "prompt_cache_key": "task-1", "store": False}
    anthropic = render_anthropic([], static=[], task=[], tools=[])
    assert anthropic == {"tools": [], "system": [],
                         "messages": [{"role": "user", "content": [{"type": "text", "text": NO_MESSAGES}]}]}
    # Without static blocks the last per-task block still carries one; blank sections are left out.
    anthropic = render_anthropic([], static=[TextSection("system_prompt", "static", "  ")], task=TASK)
    assert [b["text"] for b in anthropic["system"]] == [s.text for s in TASK]
    assert ["cache_control" in b for b in anthropic["system"]] == [False, True]
    assert "instructions" not in render_openai([], static=[TextSection("system_prompt", "static", "")])


def test_the_breakpoint_is_on_the_last_non_blank_static_block() -> None:
    static = STATIC + [TextSection("agents", "static", "\n")]
    doc = render_anthropic([], static=static)
    assert [b.get("cache_control") for b in doc["system"]] == [None, CACHED, None, CACHED]  # static, per-task


def test_texts_survive_byte_for_byte() -> None:
    texts = [TRICKY, "emoji 👩‍👩‍👧 and ZWJ", 'a "quote", \\ and \\" and \\\\', "\r\n\x7f",
             "</script><script>x</script>", "\ufeffBOM", "\U0010ffff"]
    history = [item(f"u{i}", "user", t) if i % 2 == 0 else item(f"a{i}", "assistant", t) for i, t in enumerate(texts)]
    history += [call("c", "k", json.dumps({"t": TRICKY}, ensure_ascii=False)), result("r", "k", TRICKY + "!")]
    task = [TextSection("task", "per_task", TRICKY)]
    static = [TextSection("system_prompt", "static", TRICKY)]
    openai = render_openai(history, static=static, task=task)
    assert openai["instructions"] == TRICKY and openai["input"][0]["content"] == TRICKY
    assert [e["content"] for e in openai["input"][1:len(texts) + 1]] == texts
    assert openai["input"][-2]["arguments"] == history[-2].text and openai["input"][-1]["output"] == TRICKY + "!"
    anthropic = render_anthropic(history, static=static, task=task)
    assert [b["text"] for b in anthropic["system"]] == [TRICKY, TRICKY]
    assert [m["content"][0]["text"] for m in anthropic["messages"][:len(texts)]] == texts
    assert anthropic["messages"][-2]["content"][0]["input"] == {"t": TRICKY}
    assert anthropic["messages"][-1]["content"][0]["content"] == TRICKY + "!"
    # Raw text: no escaping beyond JSON's own; the body itself is valid UTF-8.
    body = anthropic_messages(anthropic_static(static, TOOLS), task, history)
    assert "🙂" in body and "\\u" not in body.replace("\\u0000", "").replace("\\u001f", "")
    body.encode("utf-8")


def test_a_result_past_a_user_message_still_answers_its_call() -> None:
    history = [item("u1", "user", "look it up"), call("c1", "k1"), item("u2", "user", "and hurry"),
               result("r1", "k1", "found it")]
    messages = render_anthropic(history)["messages"]
    assert messages[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "k1", "content": "found it"}, {"type": "text", "text": "and hurry"}]}
    kinds = [(e["type"], e.get("content") or e.get("output")) for e in render_openai(history)["input"][2:]]
    assert kinds == [("message", "look it up"), ("function_call", None), ("function_call_output", "found it"),
                     ("message", "and hurry")]


def test_a_result_past_an_assistant_message_is_fed_as_text() -> None:
    """The assistant spoke before the result came: the call is answered by the placeholder and
    the result is told as text, since Anthropic takes results only right after their call."""
    history = [item("u1", "user", "go"), call("c1", "k1"), item("u2", "user", "still there?"),
               item("a1", "assistant", "waiting"), result("r1", "k1", "late result")]
    messages = render_anthropic(history)["messages"]
    assert messages[2]["content"][0] == {"type": "tool_result", "tool_use_id": "k1", "content": NO_RESULT}
    assert messages[-1] == {"role": "user", "content": [{"type": "text", "text": "late result"}]}
    assert render_openai(history)["input"][-1] == {"type": "message", "role": "user", "content": "late result"}


def test_several_results_for_one_call_are_one_output() -> None:
    history = [item("u1", "user", "go"), call("c1", "k1"), call("c2", "k2"), result("r1", "k2", "two"),
               result("r2", "k1", "one, part 1"), result("r3", "k1", ""), result("r4", "k1", "one, part 2")]
    user = render_anthropic(history)["messages"][2]["content"]
    assert user == [  # in call order, each call once
        {"type": "tool_result", "tool_use_id": "k1", "content": [
            {"type": "text", "text": "one, part 1"}, {"type": "text", "text": "one, part 2"}]},
        {"type": "tool_result", "tool_use_id": "k2", "content": "two"}]
    outputs = [e for e in render_openai(history)["input"] if e["type"] == "function_call_output"]
    assert outputs == [
        {"type": "function_call_output", "call_id": "k1", "output": [
            {"type": "input_text", "text": "one, part 1"}, {"type": "input_text", "text": "one, part 2"}]},
        {"type": "function_call_output", "call_id": "k2", "output": "two"}]


def test_an_empty_result_is_kept_without_blank_content() -> None:
    history = [item("u1", "user", "go"), call("c1", "k1"), result("r1", "k1", "")]
    assert render_anthropic(history)["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "k1"}]
    assert render_openai(history)["input"][-1] == {"type": "function_call_output", "call_id": "k1", "output": ""}


def test_a_history_starting_with_the_assistant_gets_a_fixed_first_user_message() -> None:
    history = [call("c1", "k1"), result("r1", "k1", "done"), item("a1", "assistant", "ok")]
    messages = render_anthropic(history)["messages"]
    assert messages[0] == {"role": "user", "content": [{"type": "text", "text": CONTINUED}]}
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert render_openai(history)["input"][2]["type"] == "function_call"  # OpenAI needs no such message


def test_summaries_and_blank_messages() -> None:
    history = [item("a0", "assistant", "   "), item("s1", "system", "Summary.", type="context.summary"),
               item("u1", "user", ""), item("a1", "assistant", "hi"), item("u2", "user", "\n"),
               item("a2", "assistant", "there")]
    # Summaries are context, not the user's words: developer messages for OpenAI; for Anthropic,
    # which has no system role in messages, text of the user side.
    assert render_openai(history)["input"][2:] == [
        {"type": "message", "role": "developer", "content": "Summary."},
        {"type": "message", "role": "assistant", "content": "hi"},
        {"type": "message", "role": "assistant", "content": "there"}]
    assert render_anthropic(history)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Summary."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}]


def test_a_repeated_call_id_is_fed_as_text() -> None:
    history = [item("u1", "user", "go"), call("c1", "k1", '{"n": 1}'), result("r1", "k1", "one"),
               call("c2", "k1", '{"n": 2}'), result("r2", "k1", "two")]
    openai = render_openai(history)["input"][2:]
    assert [e["type"] for e in openai] == ["message", "function_call", "function_call_output", "message", "message"]
    assert openai[3] == {"type": "message", "role": "assistant", "content": '{"n": 2}'}
    render_anthropic(history)


@pytest.mark.parametrize("arguments", ["[1, 2]", "not json", '"a string"', "", '{"a": NaN}', '{"a": 1} x',
                                       "null"])
def test_a_tool_call_without_an_object_for_arguments_is_fed_as_clipped(arguments: str) -> None:
    # Appends refuse such arguments; only a clip persisted before clips were kept as objects has them.
    history = [item("u1", "user", "go"), call("bad-call-7", "k1", arguments), result("r1", "k1", "x")]
    uses = [block for message in render_anthropic(history)["messages"] for block in message["content"]
            if block["type"] == "tool_use"]
    assert [use["input"] for use in uses] == [{"clipped_arguments": arguments}]


def test_an_unknown_role_is_a_defect() -> None:
    with pytest.raises(ValueError, match="e9.*'robot'"):
        openai_responses(openai_static(STATIC, TOOLS), [], [item("e9", "robot", "beep")], "t")
