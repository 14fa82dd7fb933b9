"""The window's own rules over a real server (issue 9, item 4; item 3's clipping of a block).

- ``transcript_window`` is a MUST bound like the token budget: a turn that cannot be fed within
  it is refused (FAILED_PRECONDITION / ``transcript_window_exceeded``), writing nothing;
- an entry is never emptied without the elision marker: the active turn is clipped fairly with
  the marker, or refused (``token_budget_exceeded``), writing nothing;
- ``omitted_events`` counts the events left out, ``summarized_events`` those a summary in the
  window stands in for;
- a clipped untrusted block keeps its opening line, preamble and closing line.
"""

from __future__ import annotations

import json

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.storage.keys import be32
from sidecar.text.fencing import KEYWORD, PREAMBLE, fence, is_fenced
from sidecar.transcript.schema import run_key
from tests.helpers import TENANT, call_error, ev

BLOCK_HEAD = f'<{KEYWORD} source="tool">\n{PREAMBLE}\n'
BLOCK_TAIL = f"\n</{KEYWORD}>"


def log_ids(stub, run_id: str) -> list[str]:
    return [e.event_id for e in stub.ListRunEvents(pb.ListRunEventsRequest(run_id=run_id, limit=1000)).events]


def refused_writing_nothing(stub, request: pb.AssembleContextRequest, reason: str) -> None:
    """The assembly is refused with ``reason``; the log and the persisted windows are unchanged."""
    before = log_ids(stub, request.run_id)
    assert call_error(stub.AssembleContext, request)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, reason)
    assert log_ids(stub, request.run_id) == before, "the turn's events were not written"
    code = call_error(stub.GetTranscriptWindow,
                      pb.GetTranscriptWindowRequest(run_id=request.run_id, iteration=request.iteration))[0]
    assert code == grpc.StatusCode.NOT_FOUND, "no window was persisted"


# -- transcript_window is a MUST bound ------------------------------------------------------------

def test_an_active_turn_longer_than_transcript_window_is_refused(start_server) -> None:
    stub = start_server(token_counter="chars", transcript_token_budget=10_000).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run", transcript_window=4))
    fits = stub.AssembleContext(pb.AssembleContextRequest(
        run_id="run", iteration=1, append_events=[ev(f"a{i}") for i in range(4)]))
    assert list(fits.event_ids) == ["a0", "a1", "a2", "a3"]
    refused_writing_nothing(stub, pb.AssembleContextRequest(
        run_id="run", iteration=2, append_events=[ev(f"b{i}") for i in range(7)]), "transcript_window_exceeded")
    # The refusal names the bound, so the host knows what to change.
    with pytest.raises(grpc.RpcError) as raised:
        stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=2,
                                                       append_events=[ev(f"b{i}") for i in range(7)]))
    assert "transcript_window" in raised.value.details() and "7" in raised.value.details()


def test_a_result_pulling_in_its_call_from_an_older_turn_respects_transcript_window(start_server) -> None:
    stub = start_server(token_counter="chars", transcript_token_budget=10_000).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run", transcript_window=4))
    stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1, append_events=[
        ev("u1"), ev("c1", role="assistant", type="tool_call", call_id="k", tool_name="search", content="{}")]))
    # Turn 2 is 4 events, but its result pulls in the call of turn 1: 5 events, over the bound.
    refused_writing_nothing(stub, pb.AssembleContextRequest(run_id="run", iteration=2, append_events=[
        ev("u2"), ev("r2", role="tool", type="tool_result", call_id="k"), ev("a2", role="assistant"), ev("x2")]),
        "transcript_window_exceeded")
    # Within the bound, the window never holds more events than it allows.
    fed = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=2, append_events=[
        ev("u2"), ev("r2", role="tool", type="tool_result", call_id="k"), ev("a2", role="assistant")]))
    assert list(fed.event_ids) == ["c1", "u2", "r2", "a2"]
    assert fed.omitted_events == 1  # u1


# -- never an entry emptied without a marker ------------------------------------------------------

def test_many_small_events_over_the_budget_are_refused_not_emptied(start_server) -> None:
    stub = start_server(token_counter="chars", transcript_token_budget=100).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run"))
    # 20 events of 10 chars: 200 chars over a budget of 100. A common cap of 5 chars leaves no
    # room for the elision marker, so no fair clipping exists: refused, not 20 empty entries.
    refused_writing_nothing(stub, pb.AssembleContextRequest(
        run_id="run", iteration=1, append_events=[ev(f"e{i}", content=f"event {i:04d}") for i in range(20)]),
        "token_budget_exceeded")


def test_an_active_turn_over_the_budget_is_clipped_fairly_with_the_marker(start_server) -> None:
    stub = start_server(token_counter="chars", transcript_token_budget=700).stub
    small = [ev(f"s{i}", content=f"{i}" * 100) for i in range(5)]
    result = ev("r", role="tool", type="tool_result", content="result line\n" * 100)
    answer = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1,
                                                            append_events=small + [result]))
    entries = {e.event_id: e for e in answer.entries}
    assert len(entries) == 6 and answer.token_count == sum(len(e.text) for e in answer.entries) <= 700
    # The small events fit whole; the block alone is clipped, to what the rest leaves (a common
    # cap of 100 would break its lines), keeping its own lines and carrying the marker.
    for e in small:
        assert (entries[e.event_id].text, entries[e.event_id].clipped_from_tokens) == (e.content, 0), "whole"
    clipped = entries["r"]
    assert clipped.clipped_from_tokens == len(fence(result.content)) and clipped.tokens == len(clipped.text)
    assert clipped.text.startswith(BLOCK_HEAD) and clipped.text.endswith(BLOCK_TAIL)
    assert "chars elided ...]" in clipped.text and is_fenced(clipped.text)
    assert 100 < clipped.tokens <= 700 - 500, "the block takes what the others leave"


# -- omitted_events and summarized_events ---------------------------------------------------------

def test_omitted_and_summarized_events_are_counted_apart(start_server) -> None:
    stub = start_server(token_counter="chars", transcript_token_budget=1000, keep_last_turns=2,
                        summarization=True, window_policy="max_fill").stub
    for turn in range(1, 11):
        stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn, append_events=[
            ev(f"u{turn}", content="x" * 10), ev(f"a{turn}", role="assistant", content="y" * 10)]))
    first = stub.RecordSummary(pb.RecordSummaryRequest(
        run_id="run", iteration=11, replaced_event_ids=["u1", "a1", "u2", "a2"], summary_text="s" * 21))
    second = stub.RecordSummary(pb.RecordSummaryRequest(
        run_id="run", iteration=11, replaced_event_ids=["u3", "a3", "u4", "a4"], summary_text="t" * 21))
    both = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=11,
                                                          append_events=[ev("u11", content="z" * 10)]))
    assert list(both.event_ids[:2]) == [first.summary_ref, second.summary_ref]
    assert (both.summarized_events, both.omitted_events) == (8, 0), "both summaries stand in: nothing left out"
    # 12 unsummarised events, u11 and the newer summary fit 155 chars; the older summary does not.
    tight = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=11, max_transcript_tokens=155))
    assert tight.event_ids[0] == second.summary_ref and len(tight.event_ids) == 14
    assert (tight.summarized_events, tight.omitted_events) == (4, 4), "u1-a2 are left out, u3-a4 summarised"
    # Without summaries in the window, every older host event is left out (the log's own
    # context.summarized entries are not events the host sent).
    tighter = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=11, max_transcript_tokens=50))
    assert list(tighter.event_ids) == ["u9", "a9", "u10", "a10", "u11"]
    assert (tighter.summarized_events, tighter.omitted_events) == (0, 16)


def test_a_window_persisted_before_summarized_events_reads_back(start_server) -> None:
    running = start_server(token_counter="chars", transcript_token_budget=1000, keep_last_turns=2,
                           summarization=True)
    stub = running.stub
    for turn in range(1, 5):
        stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn, append_events=[
            ev(f"u{turn}", content="x" * 10), ev(f"a{turn}", role="assistant", content="y" * 10)]))
    stub.RecordSummary(pb.RecordSummaryRequest(run_id="run", iteration=5, replaced_event_ids=["u1", "a1"],
                                               summary_text="summary"))
    fed = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=5, append_events=[ev("u5")]))
    assert (fed.summarized_events, fed.omitted_events) == (2, 0)
    # Rewrite the persisted record as the sidecar wrote it before the two counts were apart:
    # "omitted" counted every host event before the window, and "summarized" did not exist.
    store, key = running.services.store, run_key(TENANT, "run")
    with store.env.begin(write=True) as txn:
        record = json.loads(txn.get(key + be32(5), db=store.db["windows"]))
        del record["summarized"]
        record["omitted"] = 2
        txn.put(key + be32(5), json.dumps(record).encode(), db=store.db["windows"])
    again = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=5))
    assert list(again.event_ids) == list(fed.event_ids)
    assert (again.summarized_events, again.omitted_events) == (2, 0)


# -- a clipped untrusted block stays a block ------------------------------------------------------

def test_a_clipped_tool_result_keeps_its_block_whole(start_server, counters) -> None:
    stub = start_server(token_counter="o200k_base", transcript_token_budget=50).stub
    count = counters.get("o200k_base").count
    huge = "line of a very long tool result with numbers 12345 and words\n" * 400
    answer = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1, append_events=[
        ev("c", role="assistant", type="tool_call", call_id="k", tool_name="search", content="{}"),
        ev("r", role="tool", type="tool_result", call_id="k", content=huge)]))
    result = answer.entries[1]
    assert result.clipped_from_tokens == count(fence(huge))
    assert result.text.startswith(BLOCK_HEAD) and result.text.endswith(BLOCK_TAIL)
    content = result.text[len(BLOCK_HEAD):-len(BLOCK_TAIL)]
    assert "tokens elided ...]" in content and huge.startswith(content.split("\n[...")[0])
    assert is_fenced(result.text), "still exactly one block"
    assert result.tokens == count(result.text) and answer.token_count == sum(e.tokens for e in answer.entries) <= 50


def test_a_clipped_block_at_its_smallest_form_elides_its_content_alone(start_server) -> None:
    """A block's smallest clipped form is its lines around the marker of its *content* elided, so
    the common cap is measured against that: a block over the cap is fed exactly so, and the
    other events share all the rest. (Measured with the whole block's count, whose marker has one
    digit more here, the block was fed one unit over its smallest form and the reply one under
    the common cap.)"""
    stub = start_server(token_counter="chars", transcript_token_budget=252).stub
    question = "Turn 2: kettle warehouse policy?"  # 32 chars; fenced, 166
    reply = "Answer 2: " + "status of a kettle, 1234 invoices " * 5
    answer = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1, append_events=[
        ev("u", content=question, untrusted=True), ev("a", role="assistant", content=reply)]))
    block, clipped_reply = answer.entries
    smallest = f'<{KEYWORD} source="data">\n{PREAMBLE}\n\n[... {len(question)} chars elided ...]\n{BLOCK_TAIL}'
    assert block.clipped_from_tokens == len(fence(question, "data")) >= 100 > len(question)
    assert (block.text, block.tokens) == (smallest, len(smallest)), "the block at its smallest form"
    assert clipped_reply.clipped_from_tokens == len(reply) > 252 - len(smallest)
    assert clipped_reply.tokens == len(clipped_reply.text) == 252 - len(smallest), "the reply takes the rest"
    assert answer.token_count == 252


def test_a_block_that_cannot_keep_its_lines_within_the_budget_is_refused(start_server) -> None:
    stub = start_server(token_counter="o200k_base", transcript_token_budget=25).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run"))
    # The block's opening line, preamble, marker and closing line alone are over 25 tokens.
    refused_writing_nothing(stub, pb.AssembleContextRequest(run_id="run", iteration=1, append_events=[
        ev("r", role="tool", type="tool_result", content="word " * 2000)]), "token_budget_exceeded")


# -- a clipped tool call stays one JSON object ---------------------------------------------------

def rendered_calls(stub, run_id: str, iteration: int) -> tuple[dict, dict]:
    """The call's arguments as each render form feeds them: Anthropic's tool_use ``input`` (an
    object) and OpenAI's function_call ``arguments`` (a string), for the same iteration."""
    def body(form: str) -> dict:
        answer = stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=iteration, render=form))
        return json.loads(answer.rendered)

    uses = [block for message in body("anthropic_messages")["messages"] if isinstance(message["content"], list)
            for block in message["content"] if block["type"] == "tool_use"]
    calls = [item for item in body("openai_responses")["input"] if item.get("type") == "function_call"]
    return {u["id"]: u["input"] for u in uses}, {c["call_id"]: c["arguments"] for c in calls}


def test_a_clipped_tool_call_is_fed_as_one_json_object_in_both_forms(start_server, counters) -> None:
    stub = start_server(token_counter="o200k_base", transcript_token_budget=300).stub
    count = counters.get("o200k_base").count
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=pb.Profile(tools=[pb.ToolDefinition(
        name="write_file", description="Write a file.", parameters_json='{"type": "object"}')])))
    arguments = json.dumps({"path": "notes.txt", "content": 'a "quoted" line of the notes, with a \\ too\n' * 300})
    turn = [ev("u", content="Write the notes."),
            ev("c", role="assistant", type="tool_call", call_id="k", tool_name="write_file", content=arguments),
            ev("r", role="tool", type="tool_result", call_id="k", content="written")]
    rendered = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1, append_events=turn,
                                                              render="anthropic_messages")).rendered
    answer = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1))  # its entries
    entry = {e.event_id: e for e in answer.entries}["c"]
    assert entry.clipped_from_tokens == count(arguments) and entry.tokens == count(entry.text)
    assert answer.token_count == sum(e.tokens for e in answer.entries) <= 300
    # What is counted is what is fed: one JSON object naming the clip, its one string the
    # arguments' head, the elision marker and their tail.
    fed = json.loads(entry.text)
    assert list(fed) == ["clipped_arguments"]
    head, marker, tail = fed["clipped_arguments"].split("\n", 2)[0], "tokens elided ...]", arguments[-20:]
    assert arguments.startswith(head) and marker in fed["clipped_arguments"]
    assert fed["clipped_arguments"].endswith(tail)
    # Both forms feed it, re-assembled: Anthropic's input is that object, OpenAI's arguments its text.
    anthropic, openai = rendered_calls(stub, "run", 1)
    assert anthropic == {"k": fed} and openai == {"k": entry.text}
    assert json.loads(rendered) == json.loads(stub.AssembleContext(pb.AssembleContextRequest(
        run_id="run", iteration=1, render="anthropic_messages")).rendered), "the turn's body, given again"
    # The next turn keeps the call clipped (to half the budget at most): still one object.
    stub.AssembleContext(pb.AssembleContextRequest(
        run_id="run", iteration=2, append_events=[ev("u2", content="Thanks.")], render="anthropic_messages"))
    later = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=2))
    kept = {e.event_id: e for e in later.entries}["c"]
    assert kept.tokens == count(kept.text) <= 150 and list(json.loads(kept.text)) == ["clipped_arguments"]
    anthropic, openai = rendered_calls(stub, "run", 2)
    assert anthropic == {"k": json.loads(kept.text)} and openai == {"k": kept.text}
