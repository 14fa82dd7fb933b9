"""What each answer says the provider's prompt cache will do, over a real server: the tokens of
a request that repeat the previous one (recounted here from the two requests themselves, with
the "chars" counter: a text's tokens are its code points, and a rendering's every block framed
by FRAMING more), where it breaks and why; Anthropic's breakpoints on long histories; and the
provider's cached figures set against the prediction."""

from __future__ import annotations

import json

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from benchmarks._lib.prompt_cache import ANTHROPIC_MIN_CACHEABLE, AnthropicCache, TokenCache, anthropic_blocks
from sidecar.context_window.rendering import CONTINUED, NO_MESSAGES, NO_RESULT
from sidecar.settings import ConfigError, load_settings
from sidecar.text.encodings import load_encoding
from tests.helpers import call_error

FORMS = ("", "openai_responses", "anthropic_messages")
PLACEHOLDERS = {NO_RESULT, CONTINUED, NO_MESSAGES}  # the renderings' fixed texts: sent, so counted
# What a provider adds around each block of a rendering (a tool, a system block or the
# instructions, an input item or content block): its role and type markers (docs/transcript.md).
FRAMING = 4
LOOKBACK = 20  # Anthropic looks for an earlier cache entry at most this many blocks before a breakpoint
RELIED = 15  # the sidecar leaves a read this many blocks back or fewer to that lookback (a margin for "about 20")
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}
PROFILE = pb.Profile(system_prompt="You answer refund questions. ✅",
                     tools=[pb.ToolDefinition(name="search", description="Search the docs.",
                                              parameters_json=json.dumps(SCHEMA))])
TASK = pb.Task(task_id="refunds", goal="Find the refund window.", plan="1. search\n2. answer")


def chars(text: str) -> int:
    return len(text)  # Python's str is code points: the "chars" counter, recounted


def turn_events(i: int, calls: int = 1, result_size: int = 40) -> list[pb.Event]:
    """A user message, ``calls`` parallel tool calls with their results, and an answer."""
    events = [pb.Event(event_id=f"u{i}", role="user", content=f"question {i}: " + "é" * (i % 7))]
    for k in range(calls):
        events.append(pb.Event(event_id=f"c{i}.{k}", role="assistant", type="tool_call", call_id=f"k{i}_{k}",
                               tool_name="search", content=json.dumps({"q": f"q{i}.{k}"}, separators=(",", ":"))))
    for k in range(calls):
        events.append(pb.Event(event_id=f"r{i}.{k}", role="tool", type="tool_result", call_id=f"k{i}_{k}",
                               content=f"result {i}.{k} " + "x" * result_size))
    events.append(pb.Event(event_id=f"a{i}", role="assistant", content=f"answer {i}"))
    return events


def assemble(stub, run_id: str, iteration: int, events: list[pb.Event], form: str) -> pb.AssembleContextResponse:
    return stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=iteration, append_events=events,
                                                          render=form))


# The requests as parts, rebuilt from what the provider would be sent --------------------------------

def canonical_tools(tools) -> str:
    return json.dumps([{"description": t.description, "name": t.name, "parameters": json.loads(t.parameters_json)}
                       for t in sorted(tools, key=lambda t: t.name)],
                      ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def texts_of(value: object) -> list[str]:
    """The texts an input item or content block carries (a tool call's arguments as sent)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text for part in value for text in texts_of(part)]
    kind = value.get("type")
    if kind == "message":
        return texts_of(value["content"])
    if kind == "function_call":
        return [value["arguments"]]
    if kind == "function_call_output":
        return texts_of(value["output"])
    if kind in ("text", "input_text"):
        return [value["text"]]
    if kind == "tool_use":
        return [json.dumps(value["input"], ensure_ascii=False, separators=(",", ":"))]
    if kind == "tool_result":
        return texts_of(value.get("content", []))
    raise AssertionError(value)


def tokens_of(value: object) -> int:
    """A block's tokens as its provider counts them: its texts and its framing."""
    return sum(chars(text) for text in texts_of(value)) + FRAMING


def uncached(block: dict) -> dict:
    return {key: value for key, value in block.items() if key != "cache_control"}


def parts_of(answer: pb.AssembleContextResponse, form: str, profile: pb.Profile = PROFILE) -> list[tuple[str, int]]:
    """(what is compared, tokens) for each part of the request, from the request itself."""
    static = [s for s in answer.sections if s.stability == "static"]
    tools = canonical_tools(profile.tools) if profile.tools else ""
    if not form:
        parts = [(json.dumps([[s.name, s.text] for s in static] + [tools]), sum(chars(s.text) for s in static)
                  + chars(tools))]
        parts += [(json.dumps([s.name, s.text]), chars(s.text)) for s in answer.sections if s.stability == "per_task"]
        return parts + [(json.dumps([e.role, e.call_id, e.tool_name, e.text]), chars(e.text)) for e in answer.entries]
    body = json.loads(answer.rendered)
    # The tools as the canonical list counts them, each tool a block.
    tools_tokens = chars(tools) + FRAMING * len(body["tools"])
    if form == "openai_responses":
        # instructions joins the static sections with a blank line: one block, its text as sent.
        instructions = body.get("instructions", "")
        prefix_tokens = (chars(instructions) + FRAMING if instructions else 0) + tools_tokens
        prefix = json.dumps([instructions, body["tools"], body["prompt_cache_key"]])
        return [(prefix, prefix_tokens)] + [(json.dumps(item), tokens_of(item)) for item in body["input"]]
    system = body["system"]
    prefix = json.dumps([body["tools"], [uncached(b) for b in system[:len(static)]]])
    parts = [(prefix, sum(tokens_of(b) for b in system[:len(static)]) + tools_tokens)]
    parts += [(json.dumps(uncached(b)), tokens_of(b)) for b in system[len(static):]]
    for message in body["messages"]:
        for position, block in enumerate(message["content"]):
            opens = message["role"] if position == 0 else ""
            parts.append((json.dumps([opens, uncached(block)]), tokens_of(block)))
    return parts


def blocks_in(answer: pb.AssembleContextResponse, form: str) -> int:
    """The blocks a provider frames in the request's body (none without one)."""
    if not form:
        return 0
    body = json.loads(answer.rendered)
    if form == "openai_responses":
        return len(body["tools"]) + ("instructions" in body) + len(body["input"])
    return len(body["tools"]) + len(body["system"]) + sum(len(m["content"]) for m in body["messages"])


def request_tokens(answer: pb.AssembleContextResponse, form: str, profile: pb.Profile = PROFILE) -> int:
    """The whole request's tokens, recounted as its parts' are."""
    return sum(tokens for _, tokens in parts_of(answer, form, profile))


def recounted(before: pb.AssembleContextResponse, after: pb.AssembleContextResponse, form: str,
              profile: pb.Profile = PROFILE) -> tuple[int, int]:
    """(stable tokens, break_at) of ``after`` against ``before``, recounted from the two requests."""
    old, new = parts_of(before, form, profile), parts_of(after, form, profile)
    at = 0
    while at < min(len(old), len(new)) and old[at][0] == new[at][0]:
        at += 1
    return sum(tokens for _, tokens in new[:at]), at


def message_breakpoints(answer: pb.AssembleContextResponse) -> list[int]:
    blocks = [b for m in json.loads(answer.rendered)["messages"] for b in m["content"]]
    return [n for n, b in enumerate(blocks) if "cache_control" in b]


def all_breakpoints(answer: pb.AssembleContextResponse) -> int:
    body = json.loads(answer.rendered)
    return sum("cache_control" in b for b in body["system"]) + len(message_breakpoints(answer))


# Tests --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", FORMS)
def test_a_turn_that_only_appends_repeats_the_whole_previous_request(start_server, form: str) -> None:
    stub = start_server(token_counter="chars", transcript_token_budget=20_000).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=PROFILE, task=TASK))
    before = assemble(stub, "run", 1, turn_events(1), form)
    assert (before.cache.stable_prefix_tokens, before.cache.break_at, before.cache.break_reason) == (0, 0, "first_turn")
    for i in range(2, 9):
        # A turn whose calls are still unanswered: the next turn's results replace their placeholders.
        events = turn_events(i, calls=i % 3)[:-1] if i == 5 else turn_events(i, calls=i % 3)
        if i == 6:
            events = [pb.Event(event_id=f"late{k}", role="tool", type="tool_result", call_id=f"k5_{k}",
                               content=f"late result {k}") for k in range(2)] + events
        answer = assemble(stub, "run", i, events, form)
        stable, at = recounted(before, answer, form)
        assert (answer.cache.stable_prefix_tokens, answer.cache.break_at) == (stable, at)
        if form and i == 6:
            # The rendering fed placeholders for turn 5's calls; their real results change those items.
            assert answer.cache.break_reason == "history_changed" and stable < request_tokens(before, form)
        else:
            assert answer.cache.break_reason == ""
            assert stable == request_tokens(before, form), "the whole previous request repeats"
        before = answer
    # Re-assembling an iteration answers the same report; in another form, that form's.
    again = assemble(stub, "run", 8, [], form)
    assert again.cache == before.cache
    other = "anthropic_messages" if form != "anthropic_messages" else ""
    assert assemble(stub, "run", 8, [], other).cache.break_reason == "render_changed"


def test_each_break_reason_appears_exactly_when_its_cause_happens(start_server) -> None:
    stub = start_server(token_counter="chars", transcript_token_budget=1200, summarization=True,
                        keep_last_turns=1, window_policy="cache_stable", clearing={"enabled": False}).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=PROFILE, task=TASK))
    causes = {3: "summary", 5: "profile", 7: "task", 9: "skill", 11: "unload"}
    seen: dict[str, list[int]] = {}
    before = None
    for i in range(1, 40):
        cause = causes.get(i)
        if cause == "profile":
            stub.UpdateProfile(pb.UpdateProfileRequest(run_id="run", profile=pb.Profile(
                system_prompt=PROFILE.system_prompt + " Be brief.", tools=PROFILE.tools)))
        elif cause == "task":
            stub.UpdateTask(pb.UpdateTaskRequest(run_id="run", task=pb.Task(task_id="refunds", goal="Quote it.")))
        elif cause == "skill":
            stub.LoadSkill(pb.LoadSkillRequest(run_id="run", skill=pb.LoadedSkill(name="pdf", body="Read PDFs.")))
        elif cause == "unload":
            stub.UnloadSkill(pb.UnloadSkillRequest(run_id="run", name="pdf"))
        elif cause == "summary":
            assert before.event_ids[0] == "u1", "the summary replaces the window's first turn"
            stub.RecordSummary(pb.RecordSummaryRequest(run_id="run", iteration=i, replaced_event_ids=[
                "u1", "c1.0", "r1.0", "a1"], summary_text=f"Summary before turn {i}."))
        answer = assemble(stub, "run", i, turn_events(i), "anthropic_messages")
        reason = answer.cache.break_reason
        seen.setdefault(reason, []).append(i)
        stable, at = recounted(before, answer, "anthropic_messages") if before else (0, 0)
        assert (answer.cache.stable_prefix_tokens, answer.cache.break_at) == (stable, at), i
        if before is not None and not cause:
            moved = answer.event_ids[0] != before.event_ids[0]
            assert (reason == "window_start_moved") == moved, (i, reason)
            assert reason in ("", "window_start_moved"), (i, reason)
        before = answer
    assert seen["first_turn"] == [1]
    assert seen["summary_recorded"] == [3]
    assert seen["profile:system_prompt"] == [5]
    assert seen["task_changed"] == [7]
    assert seen["skill_loaded"] == [9]
    assert seen["skill_unloaded"] == [11]
    assert len(seen.get("window_start_moved", [])) >= 2, "the budget moved the window's start"


def test_cleared_tool_results_are_named_as_the_break(start_server) -> None:
    stub = start_server(token_counter="chars", transcript_token_budget=3000,
                        clearing={"enabled": True, "keep_recent": 1, "clear_at_least_tokens": 300}).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=PROFILE))
    before, previous_cleared = None, set()
    cleared_turns, reasons = [], []
    for i in range(1, 30):
        answer = assemble(stub, "run", i, turn_events(i, result_size=200), "openai_responses")
        body = json.loads(answer.rendered)
        now = {item["call_id"] for item in body["input"]
               if item["type"] == "function_call_output" and "cleared" in str(item["output"])}
        if before is not None:
            if now - previous_cleared:
                cleared_turns.append(i)
            if answer.cache.break_reason == "tool_results_cleared":
                reasons.append(i)
            stable, at = recounted(before, answer, "openai_responses")
            assert (answer.cache.stable_prefix_tokens, answer.cache.break_at) == (stable, at)
        previous_cleared = now
        before = answer
    assert cleared_turns, "the budget made the sidecar clear tool results"
    assert reasons == cleared_turns


def test_a_clearing_turn_still_reads_the_history_before_what_it_cleared(start_server) -> None:
    """Without a breakpoint written before the first cleared result, a clearing's request reads
    only the system blocks and re-bills the whole history."""
    stub = start_server(token_counter="chars", transcript_token_budget=3000,
                        clearing={"enabled": True, "keep_recent": 1, "clear_at_least_tokens": 300}).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=PROFILE, task=TASK))
    before, checked = None, 0
    for i in range(1, 30):
        answer = assemble(stub, "run", i, turn_events(i, result_size=200), "anthropic_messages")
        if answer.cache.break_reason == "tool_results_cleared":
            old = [uncached(b) for m in json.loads(before.rendered)["messages"] for b in m["content"]]
            new = [uncached(b) for m in json.loads(answer.rendered)["messages"] for b in m["content"]]
            changed = next(n for n, (a, b) in enumerate(zip(old, new)) if a != b)
            assert new[changed]["type"] == "tool_result" and "cleared" in str(new[changed].get("content"))
            # A history block before the change that the previous request marked (wrote) is read here:
            # marked again, or within the lookback's sure reach of the last mark. The block before the
            # first result a clearing could change is such a block.
            marks = message_breakpoints(answer)
            assert any(mark < changed and (mark in marks or marks[-1] - mark <= RELIED)
                       for mark in message_breakpoints(before)), i
            checked += 1
        assert all_breakpoints(answer) <= 4
        before = answer
    assert checked >= 2, "clearings were seen"


def test_anthropic_breakpoints_stay_four_and_read_where_the_previous_request_wrote(start_server) -> None:
    stub = start_server(token_counter="chars", transcript_token_budget=60_000).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=PROFILE, task=TASK))
    before = None
    wide = 0
    for i in range(1, 41):
        calls = 14 if i % 5 == 0 else 1  # a wide turn adds 30 blocks: more than the lookback
        answer = assemble(stub, "run", i, turn_events(i, calls=calls), "anthropic_messages")
        marks = message_breakpoints(answer)
        blocks = sum(len(m["content"]) for m in json.loads(answer.rendered)["messages"])
        assert all_breakpoints(answer) <= 4
        assert marks[-1] == blocks - 1, "the write breakpoint ends the request"
        # The block before the first tool result a clearing may change: a clearing breaks there.
        contents = [b for m in json.loads(answer.rendered)["messages"] for b in m["content"]]
        first_result = next(n for n, b in enumerate(contents) if b["type"] == "tool_result"
                            and not str(b.get("content", "")).startswith("[tool result cleared"))
        if before is not None:
            assert answer.cache.break_reason == ""
            previous_last = message_breakpoints(before)[-1]
            gap = blocks - 1 - previous_last
            if gap > RELIED:
                # Out of the lookback's sure reach: the read is marked exactly where the previous request wrote.
                assert marks == [previous_last, blocks - 1]
            else:
                # The last block's lookback reads the previous write; the other breakpoint keeps what a
                # clearing cannot change readable.
                assert marks == [first_result - 1, blocks - 1]
            wide += gap > LOOKBACK
        before = answer
    assert wide >= 5, "turns that added more blocks than the lookback were seen"
    # When the history changes at its start, no read breakpoint is placed in messages: the last
    # block and the one before the first tool result.
    stub.UpdateTask(pb.UpdateTaskRequest(run_id="run", task=pb.Task(task_id="refunds", goal="Another goal.")))
    answer = assemble(stub, "run", 41, turn_events(41), "anthropic_messages")
    assert answer.cache.break_reason == "task_changed"
    assert len(message_breakpoints(answer)) == 2


def test_usage_sets_the_provider_cached_figures_against_the_prediction(start_server) -> None:
    stub = start_server(token_counter="chars", transcript_token_budget=20_000).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=PROFILE))
    first = assemble(stub, "run", 1, turn_events(1), "anthropic_messages")
    second = assemble(stub, "run", 2, turn_events(2), "anthropic_messages")
    usage = stub.RecordUsage(pb.RecordUsageRequest(run_id="run", iteration=2, input_tokens=30,
                                                   cache_read_input_tokens=400, cache_creation_input_tokens=70,
                                                   output_tokens=9))
    assert usage.predicted_cached_tokens == second.cache.stable_prefix_tokens == \
        request_tokens(first, "anthropic_messages")
    assert usage.reported_cached_tokens == 400
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (400, 70)
    assert usage.drift_tokens == 30 + 400 + 70 - second.window_tokens  # Anthropic's three figures add up
    assert stub.GetState(pb.GetStateRequest(run_id="run")).last_usage == usage
    openai = stub.RecordUsage(pb.RecordUsageRequest(run_id="run", iteration=1, input_tokens=500, cached_tokens=256))
    assert (openai.predicted_cached_tokens, openai.reported_cached_tokens) == (0, 256)  # a first turn: none expected
    assert openai.drift_tokens == 500 - first.window_tokens
    mixed = call_error(stub.RecordUsage, pb.RecordUsageRequest(run_id="run", iteration=2, input_tokens=500,
                                                                cached_tokens=5, cache_read_input_tokens=5))
    assert mixed == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["cached_tokens"])
    negative = call_error(stub.RecordUsage, pb.RecordUsageRequest(run_id="run", iteration=2, input_tokens=5,
                                                                   cache_creation_input_tokens=-1))
    assert negative == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["cache_creation_input_tokens"])


def test_openai_prompt_cache_retention_is_sent_when_configured(start_server) -> None:
    stub = start_server(token_counter="chars", render={"openai_prompt_cache_retention": "24h"}).stub
    body = json.loads(assemble(stub, "run", 1, turn_events(1), "openai_responses").rendered)
    assert body["prompt_cache_retention"] == "24h" and list(body)[-2:] == ["prompt_cache_retention", "store"]
    plain = start_server(token_counter="chars").stub
    assert "prompt_cache_retention" not in json.loads(assemble(plain, "run", 1, turn_events(1),
                                                               "openai_responses").rendered)
    env = {"CONTEXT_SIDECAR_RENDER_OPENAI_PROMPT_CACHE_RETENTION": "in_memory"}
    assert load_settings(env=env).render.openai_prompt_cache_retention == "in_memory"
    with pytest.raises(ConfigError, match=r"\[render\] openai_prompt_cache_retention"):
        load_settings(env={"CONTEXT_SIDECAR_RENDER_OPENAI_PROMPT_CACHE_RETENTION": "in-memory"})


LOOKUP_PROFILE = pb.Profile(system_prompt=PROFILE.system_prompt, tools=[
    PROFILE.tools[0],
    pb.ToolDefinition(name="lookup", description="Look a code up.", parameters_json=json.dumps(SCHEMA))])


def words(count: int, seed: int) -> str:
    return " ".join(f"w{seed}x{j}" for j in range(count))


@pytest.mark.parametrize("never_cleared", ["small", "excluded"])
def test_a_clearing_turn_reads_every_block_before_what_it_cleared(start_server, never_cleared: str) -> None:
    """The breakpoint kept for clearings sits on the last block a clearing will really leave as it
    is: a result whose placeholder would not be smaller, or whose tool is excluded from clearing,
    is never replaced, so the breakpoint before it would read only the blocks before it."""
    stub = start_server(token_counter="chars", transcript_token_budget=16_000,
                        clearing={"enabled": True, "keep_recent": 1, "clear_at_least_tokens": 3000,
                                  "exclude_tools": ["lookup"]}).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=LOOKUP_PROFILE, task=TASK))
    tokens, model = TokenCache(load_encoding("o200k_base")), AnthropicCache()
    before, checked = None, 0
    for i in range(1, 60):
        # The first turns' results are never cleared: too small for a placeholder to be smaller (a
        # few characters), or of the excluded tool; the later ones are large and clearable.
        early = i <= 8
        tool = "lookup" if early and never_cleared == "excluded" else "search"
        result = "ok" if early and never_cleared == "small" else words(120, i)
        call_id = f"toolu_01A09q90qw90lq917835lq{i:03d}"  # as long as a provider's: in every placeholder
        events = [pb.Event(event_id=f"u{i}", role="user", content=f"question {i}: " + words(60, -i)),
                  pb.Event(event_id=f"c{i}", role="assistant", type="tool_call", call_id=call_id, tool_name=tool,
                           content=json.dumps({"q": f"q{i}"})),
                  pb.Event(event_id=f"r{i}", role="tool", type="tool_result", call_id=call_id, content=result),
                  pb.Event(event_id=f"a{i}", role="assistant", content=f"answer {i}")]
        answer = assemble(stub, "run", i, events, "anthropic_messages")
        bill = model.bill(anthropic_blocks(answer.rendered, tokens))
        if answer.cache.break_reason == "tool_results_cleared":
            old = [uncached(b) for m in json.loads(before.rendered)["messages"] for b in m["content"]]
            new = [uncached(b) for m in json.loads(answer.rendered)["messages"] for b in m["content"]]
            changed = next(n for n, (a, b) in enumerate(zip(old, new)) if a != b)
            assert "cleared" in str(new[changed].get("content")), "the first block changed is a cleared result"
            # The previous request wrote the prefix ending just before the change, and this one reads it.
            assert changed - 1 in message_breakpoints(before), (i, changed, message_breakpoints(before))
            blocks = anthropic_blocks(answer.rendered, tokens)
            unchanged = len(blocks) - len(new) + changed  # the tools, the system blocks, the history before the change
            before_change = sum(block.size for block in blocks[:unchanged])
            # (a prefix too short for the provider to cache: a clearing early in a moved window)
            if before_change >= ANTHROPIC_MIN_CACHEABLE:
                assert bill.cached == before_change, i
                checked += 1
        assert all_breakpoints(answer) <= 4
        before = answer
    assert checked >= 2, "clearings were seen"


@pytest.mark.parametrize("form", FORMS)
def test_a_summary_is_named_as_the_break_only_when_one_entered_the_window(start_server, form: str) -> None:
    """Summaries stack (sliding-window), and a full window leaves its oldest ones out as it grows:
    a break where a summary fed before slid out is not a summary recorded."""
    stub = start_server(token_counter="chars", transcript_token_budget=2500, summarization=True,
                        keep_last_turns=1, window_policy="max_fill", clearing={"enabled": False}).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=PROFILE, task=TASK))
    before, recorded_for, kept_some = None, 0, 0
    previous_summaries: list[str] = []
    seen: dict[str, list[int]] = {}
    for i in range(1, 40):
        answer = assemble(stub, "run", i, turn_events(i, result_size=60), form)
        window = stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="run", iteration=i))
        summaries = [summarized.summary_ref for summarized in window.summarized_ranges]
        if before is not None:
            entered = [ref for ref in summaries if ref not in previous_summaries]
            left = [ref for ref in previous_summaries if ref not in summaries]
            reason = answer.cache.break_reason
            seen.setdefault(reason, []).append(i)
            # The first part that differs is a summary that was not fed before: one was recorded.
            assert (reason == "summary_recorded") == (recorded_for == i and bool(entered)), (i, reason, entered, left)
            if left and not entered:
                assert reason == "summary_slid_out", (i, reason, left)
                kept_some += bool(summaries)  # the window then opens with a summary fed before
        if answer.compaction.due and answer.compaction.candidate_event_ids and i % 3 == 0:
            stub.RecordSummary(pb.RecordSummaryRequest(
                run_id="run", iteration=i + 1, replaced_event_ids=answer.compaction.candidate_event_ids,
                summary_text=f"Summary {i}: " + "s" * 60))
            recorded_for = i + 1
        before, previous_summaries = answer, summaries
    assert seen.get("summary_recorded"), "summaries entered the window"
    assert kept_some >= 2, "summaries slid out of the window while newer ones stayed"


@pytest.mark.parametrize("form", FORMS)
def test_the_stable_prefix_counts_what_the_provider_counts_of_it(start_server, form: str) -> None:
    """A provider bills the framing of every block it reads from its cache, and the texts a rendering
    adds (a missing result's placeholder, the blank lines joining OpenAI's instructions), not the
    entries' texts alone: the stable prefix is the prefix's tokens as the provider counts them, and
    the request's whole count beside it is counted alike. Without a rendering there is no framing
    the sidecar knows of: its counts are the texts'."""
    stub = start_server(token_counter="chars", transcript_token_budget=20_000).stub
    profile = pb.Profile(system_prompt=PROFILE.system_prompt, tools=[
        PROFILE.tools[0], pb.ToolDefinition(name="open", description="Open a page.", parameters_json="{}")],
        participants=[pb.Participant(role="user", description="A customer.")])
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=profile, task=TASK))
    before = assemble(stub, "run", 1, turn_events(1, calls=2), form)
    for i in range(2, 6):
        # Turn 3 ends with its calls unanswered: the rendering feeds a placeholder result for each.
        events = turn_events(i, calls=2)[:3] if i == 3 else turn_events(i)
        answer = assemble(stub, "run", i, events, form)
        stable, at = recounted(before, answer, form, profile)
        assert (answer.cache.stable_prefix_tokens, answer.cache.break_at) == (stable, at), i
        assert answer.cache.request_tokens == request_tokens(answer, form, profile), i
        if i != 4:  # turn 4 answers turn 3's calls, in place of the placeholders
            assert stable == request_tokens(before, form, profile), "the whole previous request repeats"
        # Beside the budget's count (the texts), the framing of every block the body holds.
        assert answer.cache.request_tokens >= answer.window_tokens + FRAMING * blocks_in(answer, form)
        usage = stub.RecordUsage(pb.RecordUsageRequest(run_id="run", iteration=i, input_tokens=9, cached_tokens=5))
        assert usage.predicted_cached_tokens == stable
        before = answer
    if not form:
        assert before.cache.request_tokens == before.window_tokens
