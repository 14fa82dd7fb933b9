"""Summaries in the domain, over real LMDB: recording, validating, standing in, compaction."""

from __future__ import annotations

import json

import pytest

from sidecar.errors import Conflict, ValidationError
from sidecar.transcript import NewEvent, SummaryRequest
from sidecar.untrusted import fence
from tests.conftest import TENANT, assemble


def event(event_id: str, iteration: int, content: str = "x" * 10, role: str = "user", type: str = "message",
          call_id: str = "") -> NewEvent:
    return NewEvent(event_id, iteration, role, type, content, call_id)


def log_ids(transcripts, run_id: str = "run") -> list[str]:
    return [e.event_id for e in transcripts.list_events(TENANT, run_id, 0, 1000)[0]]


@pytest.fixture
def run(make_transcripts):
    """A chars run with summarization on, 10 turns of two 10-char events (u<i>, a<i>), assembled."""
    transcripts = make_transcripts(transcript_token_budget=1000, keep_last_turns=2)
    transcripts.open_run(TENANT, "run", token_counter="chars", summarization=True)
    for turn in range(1, 11):
        assemble(transcripts, TENANT, "run", turn, [event(f"u{turn}", turn), event(f"a{turn}", turn, role="assistant")])
    return transcripts


def summarise(transcripts, ids, iteration=11, text="the summary", strategy=""):
    return transcripts.record_summary(TENANT, "run", SummaryRequest(iteration, tuple(ids), text, strategy))


def test_a_summary_is_recorded_announced_and_stands_in(run) -> None:
    summary, entry, created = summarise(run, ["u1", "a1", "u2", "a2"], text="Turns 1-2: greetings.")
    assert created and summary.tokens_before == 40 and summary.tokens_after == len("Turns 1-2: greetings.")
    # The log announces it, after the host's events, with RFC 0111's payload and no text.
    assert log_ids(run)[-1] == entry.event_id and entry.type == "context.summarized"
    assert json.loads(entry.content) == {
        "iteration": 11, "replacedTurns": ["u1", "a1", "u2", "a2"], "summaryRef": summary.ref,
        "tokenCounter": "chars", "tokensBefore": 40, "tokensAfter": 21}
    assert "greetings" not in entry.content
    assert run.get_artifact(TENANT, "run", summary.ref).content == "Turns 1-2: greetings."
    # From iteration 11 on it stands in for the turns it replaced, as the oldest entry.
    window, _ = assemble(run, TENANT, "run", 11, [event("u11", 11)])
    assert window.event_ids == [summary.ref] + [f"{p}{t}" for t in range(3, 11) for p in "ua"] + ["u11"]
    first = window.entries()[0]
    assert (first.event.type, first.text, first.tokens, first.event.role) == (
        "context.summary", "Turns 1-2: greetings.", 21, "system")
    assert window.token_count == sum(e.tokens for e in window.entries())
    # Iterations assembled before it never change.
    assert run.transcript_window(TENANT, "run", 10).event_ids[:2] == ["u1", "a1"]


def test_a_retry_returns_the_same_summary_and_writes_nothing(run) -> None:
    first, _, _ = summarise(run, ["u1", "a1"])
    length = len(log_ids(run))
    again, entry, created = summarise(run, ["u1", "a1"])
    assert (again.ref, created, entry.event_id) == (first.ref, False, log_ids(run)[-1])
    assert len(log_ids(run)) == length
    with pytest.raises(Conflict) as raised:
        summarise(run, ["u1", "a1"], text="another text")
    assert raised.value.violations[0].field == "summary_text"


@pytest.mark.parametrize("ids, iteration, field, words", [
    (["u1", "nope"], 11, "replaced_event_ids[1]", "not an event"),
    (["a1", "u2"], 11, "replaced_event_ids[0]", "not the next unsummarised"),
    (["u1", "u2"], 11, "replaced_event_ids[1]", "not the next unsummarised"),
    ([f"{p}{t}" for t in range(1, 11) for p in "ua"], 11, "replaced_event_ids[18]", "floor"),
    (["u1"], 10, "iteration", "not yet assembled"),
    (["sidecar:summary:0:abc", "u1"], 11, "replaced_event_ids[0]", "only recursive"),
])
def test_invalid_ranges_name_the_offending_ids_and_write_nothing(run, ids, iteration, field, words) -> None:
    length = len(log_ids(run))
    with pytest.raises(ValidationError) as raised:
        summarise(run, ids, iteration=iteration)
    fields = [v.field for v in raised.value.violations]
    assert field in fields, fields
    assert words in raised.value.message
    assert len(log_ids(run)) == length


def test_the_verbatim_floor_is_the_larger_of_turns_and_tokens(make_transcripts) -> None:
    transcripts = make_transcripts(transcript_token_budget=1000, keep_last_turns=1, keep_last_tokens=35)
    transcripts.open_run(TENANT, "run", token_counter="chars", summarization=True)
    for turn in range(1, 5):
        assemble(transcripts, TENANT, "run", turn, [event(f"u{turn}", turn), event(f"a{turn}", turn)])
    # keep_last_turns=1 protects turn 5 (empty); 35 tokens protect a4, u4, a3 and u3 (40 >= 35).
    with pytest.raises(ValidationError) as raised:
        summarise(transcripts, ["u1", "a1", "u2", "a2", "u3"], iteration=5)
    assert [v.field for v in raised.value.violations] == ["replaced_event_ids[4]"]
    assert summarise(transcripts, ["u1", "a1", "u2", "a2"], iteration=5)[2]


def test_a_tool_call_is_never_split_from_its_result(make_transcripts) -> None:
    transcripts = make_transcripts(transcript_token_budget=1000, keep_last_turns=1)
    transcripts.open_run(TENANT, "run", token_counter="chars", summarization=True)
    assemble(transcripts, TENANT, "run", 1, [event("u1", 1), event("c1", 1, call_id="k", type="tool_call"),
                                            event("r1", 1, role="tool", call_id="k", type="tool_result")])
    assemble(transcripts, TENANT, "run", 2, [event("u2", 2)])
    with pytest.raises(ValidationError) as raised:
        summarise(transcripts, ["u1", "c1"], iteration=3)
    assert "'r1'" in raised.value.message
    assert summarise(transcripts, ["u1", "c1", "r1"], iteration=3)[2]


def test_a_run_without_summarization_refuses_summaries(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    assemble(transcripts, TENANT, "plain", 1, [event("u1", 1)])
    with pytest.raises(ValidationError) as raised:
        transcripts.record_summary(TENANT, "plain", SummaryRequest(2, ("u1",), "s", ""))
    assert raised.value.violations[0].field == "run_id"


def test_summaries_stack_and_recursive_ones_fold_the_previous_in(run) -> None:
    first, _, _ = summarise(run, ["u1", "a1"], text="one")
    second, _, _ = summarise(run, ["u2", "a2"], text="two")
    window, _ = assemble(run, TENANT, "run", 11)
    assert window.event_ids[:3] == [first.ref, second.ref, "u3"]
    with pytest.raises(ValidationError):  # a sliding-window summary cannot replace summaries
        summarise(run, [second.ref, "u3", "a3"], iteration=12, text="three")
    with pytest.raises(ValidationError):  # only the newest summaries, in order
        summarise(run, [first.ref, "u3", "a3"], iteration=12, text="three", strategy="recursive")
    third, _, _ = summarise(run, [second.ref, "u3", "a3"], iteration=12, text="one two three", strategy="recursive")
    assert third.replaced_turns == (second.ref, "u3", "a3") and third.tokens_before == 3 + 20
    window, _ = assemble(run, TENANT, "run", 12)
    assert window.event_ids[:3] == [first.ref, third.ref, "u4"]
    ranges = run.transcript_window(TENANT, "run", 12).summarized_ranges
    assert [(r.summary_ref, r.replaced_turns) for r in ranges] == [
        (first.ref, ("u1", "a1")), (third.ref, (second.ref, "u3", "a3"))]
    # The window of iteration 11 still has what it had.
    assert run.transcript_window(TENANT, "run", 11).event_ids[:3] == [first.ref, second.ref, "u3"]


def test_compaction_is_signalled_and_its_candidates_are_accepted(make_transcripts) -> None:
    # A turn is u (10 chars), c (10) and r, a tool result: fed inside the untrusted-data block.
    turn_tokens = 20 + len(fence("x" * 10))
    budget = turn_tokens * 20 // 3  # compaction is due past 0.75 of it: 5 turns
    transcripts = make_transcripts(transcript_token_budget=budget, keep_last_turns=2, compaction_fraction=0.75)
    transcripts.open_run(TENANT, "run", token_counter="chars", summarization=True)
    signals = []
    for turn in range(1, 9):
        window, _ = assemble(transcripts, TENANT, "run", turn, [
            event(f"u{turn}", turn), event(f"c{turn}", turn, type="tool_call", call_id=f"k{turn}"),
            event(f"r{turn}", turn, role="tool", type="tool_result", call_id=f"k{turn}")])
        signals.append(window.compaction)
    assert not signals[0].due and signals[-1].due  # 8 turns > 5 turns' worth
    due = signals[-1]
    # The oldest half of what may be summarised (turns 7-8 are the verbatim floor), groups whole.
    assert due.candidate_ids == ("u1", "c1", "r1", "u2", "c2", "r2", "u3", "c3", "r3")
    assert due.tokens_before == 3 * turn_tokens
    summary, _, _ = transcripts.record_summary(TENANT, "run", SummaryRequest(9, due.candidate_ids, "s" * 20, ""))
    assert summary.tokens_before == 3 * turn_tokens
    window, _ = assemble(transcripts, TENANT, "run", 9, [event("u9", 9)])
    assert window.event_ids[0] == summary.ref and window.token_count == 20 + 5 * turn_tokens + 10
    # Still due (5 turns and u9 unsummarised), and the candidates now start where the summary ended.
    assert window.compaction.candidate_ids[:3] == ("u4", "c4", "r4")


def test_the_built_in_summariser_keeps_a_long_run_in_budget(make_transcripts, counters) -> None:
    transcripts = make_transcripts(transcript_token_budget=300, keep_last_turns=2, summariser="extractive")
    transcripts.open_run(TENANT, "run", token_counter="o200k_base", summarization=True)
    count = counters.get("o200k_base").count
    for turn in range(1, 41):
        window, _ = assemble(transcripts, TENANT, "run", turn, [
            event(f"u{turn}", turn, f"Question {turn}: how should the agent handle case {turn * 13}?"),
            event(f"a{turn}", turn, f"Answer {turn}: it follows policy {turn % 7} and logs the outcome.",
                  role="assistant")])
        assert window.token_count == sum(count(e.text) for e in window.entries()) <= 300
        assert f"u{turn}" in window.event_ids and f"a{turn - 1}" in window.event_ids[1:] if turn > 1 else True
    summaries = [e for e in window.entries() if e.event.type == "context.summary"]
    assert summaries, "the sidecar summarised by itself"
    assert summaries[0].text.startswith("Summary of ")
    assert transcripts.get_artifact(TENANT, "run", summaries[0].event.event_id).content == summaries[0].text
    assert any(e.type == "context.summarized" for e in transcripts.list_events(TENANT, "run", 0, 1000)[0])
