"""Re-assembling a settled iteration: an answer kept and given again is the answer a sidecar that
keeps none gives (restarted on the same folder with --reassembly-cache 0), byte for byte,
whatever was written in between; and what can make the same window feed otherwise is seen at once.
And a window's entries kept from one read back to the next are the run's own."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.helpers import PROFILE, Sidecar, call_error, open_full, tool_turn

ASSEMBLE = "/contextsidecar.v1.ContextSidecar/AssembleContext"
FLAGS = ("--token-counter", "chars", "--transcript-token-budget", "20000")
KEEPING_NONE = (*FLAGS, "--reassembly-cache", "0")
RENDERS = ("", "openai_responses", "anthropic_messages")


def as_sent(channel: grpc.Channel, request: pb.AssembleContextRequest) -> bytes:
    """The answer's bytes as the sidecar sent them."""
    return channel.unary_unary(ASSEMBLE, request_serializer=pb.AssembleContextRequest.SerializeToString)(request)


def afresh(tmp_path: Path, requests: list[pb.AssembleContextRequest]) -> list[bytes]:
    """The answers a sidecar that keeps none gives, restarted on the folder of the one stopped."""
    restarted = Sidecar(tmp_path, *KEEPING_NONE)
    try:
        return [as_sent(restarted.channel, request) for request in requests]
    finally:
        restarted.stop()


def requests_for(run_id: str, iterations: range) -> list[pb.AssembleContextRequest]:
    """Each iteration asked for again in each render form; every other one under a tighter cap
    than it was assembled under (its window is then chosen again, and persisted, once)."""
    return [pb.AssembleContextRequest(run_id=run_id, iteration=i, render=render,
                                      **({"max_transcript_tokens": 15000} if i % 2 else {}))
            for i in iterations for render in RENDERS]


def played(stub, run_id: str, turns: int, texts_of: int = 0) -> str:
    """A run of tool turns (its results cleared and clipped as the window fills) with a summary of
    the first three turns recorded after the fifth; the summary's ref. ``texts_of``: another
    run's texts (the turns ``texts_of`` + 1, ...), under the same ids."""
    open_full(stub, run_id, summarization_supported=True, keep_last_turns=1)
    ref = ""
    for turn in range(1, turns + 1):
        events = tool_turn(turn + texts_of)
        for event in events:
            event.event_id = event.event_id[0] + str(turn)
            event.call_id = event.call_id and f"k{turn}"
        stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=turn, append_events=events))
        if turn == 5:
            ref = stub.RecordSummary(pb.RecordSummaryRequest(
                run_id=run_id, iteration=turn + 1, summary_text="Turns 1-3: searched, read two files, answered.",
                replaced_event_ids=[f"{kind}{t}" for t in (1, 2, 3) for kind in "ucra"])).summary_ref
    return ref


def test_a_settled_iteration_is_answered_again_as_a_sidecar_that_kept_nothing_answers_it(tmp_path: Path):
    first = Sidecar(tmp_path, *FLAGS)
    try:
        played(first.stub, "run", 14)
        requests = requests_for("run", range(1, 14))
        for request in requests:  # the capped ones chosen under their cap
            as_sent(first.channel, request)
        answers = [as_sent(first.channel, request) for request in requests]
        again = [as_sent(first.channel, request) for request in requests]
        # Written in between: more turns, another run; the settled iterations feed what they fed.
        for turn in (15, 16):
            first.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn,
                                                                 append_events=tool_turn(turn)))
        played(first.stub, "other", 3)
        after_writes = [as_sent(first.channel, request) for request in requests]
    finally:
        first.stop()
    assert len({len(answer) for answer in answers}) > 10  # the requests ask for different answers
    for request, answer, second, third, fresh in zip(requests, answers, again, after_writes,
                                                      afresh(tmp_path, requests)):
        assert answer == second == third == fresh, (request.iteration, request.render, request.max_transcript_tokens)


def test_a_summary_artifact_deleted_is_seen_by_the_next_re_assembly(tmp_path: Path):
    sidecar = Sidecar(tmp_path, *FLAGS, "--transcript-token-budget", "200000")  # the window reaches the summary
    try:
        ref = played(sidecar.stub, "run", 8)
        request = pb.AssembleContextRequest(run_id="run", iteration=6)
        sent = as_sent(sidecar.channel, request)
        assert ref in pb.AssembleContextResponse.FromString(sent).event_ids  # the settled iteration feeds the summary
        assert as_sent(sidecar.channel, request) == sent
        sidecar.stub.DeleteArtifact(pb.DeleteArtifactRequest(run_id="run", artifact_id=ref))
        assert call_error(sidecar.stub.AssembleContext, request)[:2] == (
            grpc.StatusCode.FAILED_PRECONDITION, "replay_context_summary_unavailable")
    finally:
        sidecar.stop()


@pytest.mark.parametrize("change", ["profile", "run deleted and opened again"])
def test_a_re_assembly_after_the_run_changed_under_it_answers_for_the_run_as_it_is(tmp_path: Path, change: str):
    sidecar = Sidecar(tmp_path, *FLAGS)
    try:
        played(sidecar.stub, "run", 4)
        request = pb.AssembleContextRequest(run_id="run", iteration=2)
        before = as_sent(sidecar.channel, request)
        assert as_sent(sidecar.channel, request) == before
        if change == "profile":
            profile = pb.Profile()
            profile.CopyFrom(PROFILE)
            profile.system_prompt = "You are a careful reviewer of pull requests."
            sidecar.stub.UpdateProfile(pb.UpdateProfileRequest(run_id="run", profile=profile))
        else:
            sidecar.stub.DeleteRun(pb.DeleteRunRequest(run_id="run"))
            played(sidecar.stub, "run", 4, texts_of=100)
        after = as_sent(sidecar.channel, request)
    finally:
        sidecar.stop()
    assert [after] == afresh(tmp_path, [request])
    assert after != before


def test_an_iteration_assembled_again_with_events_and_the_one_after_it_are_answered_as_they_are_now(
        tmp_path: Path):
    """Events added to an earlier iteration (which the host may still do while the log is behind
    the last assembly) give it a new window, and the next iteration's cache report for a render
    form other than its own is measured against that new window (persisted in that form)."""
    sidecar = Sidecar(tmp_path, *FLAGS)
    requests = [pb.AssembleContextRequest(run_id="run", iteration=3),
                pb.AssembleContextRequest(run_id="run", iteration=4),
                pb.AssembleContextRequest(run_id="run", iteration=4, render="openai_responses")]
    try:
        open_full(sidecar.stub, "run")
        for turn in (1, 2):
            sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn,
                                                                   append_events=tool_turn(turn)))
        for turn in (3, 4, 5):  # turns that added nothing (the host had nothing new)
            sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn))
        before = [as_sent(sidecar.channel, request) for request in requests * 2]
        sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=3, render="openai_responses",
                                                               append_events=[
            pb.Event(event_id="late", role="user", content="One more thing about turn three: " + "detail " * 300)]))
        after = [as_sent(sidecar.channel, request) for request in requests]
    finally:
        sidecar.stop()
    assert before[:3] == before[3:]
    assert after == afresh(tmp_path, requests)
    assert after[0] != before[0] and after[2] != before[2]  # the new window, and the report against it


def test_a_run_deleted_and_opened_again_feeds_its_own_events_from_the_same_start(start_server):
    """A window's entries read back for one turn are kept for the next (only the new ones are
    read); a run deleted and opened again under the same id starts at the same seq with other
    events, which are what it is fed."""
    sidecar = start_server(token_counter="chars", transcript_token_budget=100000)

    def play(texts: str) -> pb.AssembleContextResponse:
        sidecar.stub.OpenRun(pb.OpenRunRequest(run_id="run"))
        for turn in (1, 2, 3):
            event = pb.Event(event_id=f"e{turn}", role="user", content=f"{texts} {turn}")
            answer = sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn,
                                                                            append_events=[event]))
        return answer

    first = play("first life, turn")
    sidecar.stub.DeleteRun(pb.DeleteRunRequest(run_id="run"))
    second = play("other life, turn")
    assert [entry.text for entry in first.entries] == [f"first life, turn {t}" for t in (1, 2, 3)]
    assert [entry.text for entry in second.entries] == [f"other life, turn {t}" for t in (1, 2, 3)]
    assert [entry.text for entry in sidecar.stub.AssembleContext(
        pb.AssembleContextRequest(run_id="run", iteration=2)).entries] == [f"other life, turn {t}" for t in (1, 2)]


def test_a_window_whose_start_moves_on_feeds_the_entries_from_its_new_start(start_server):
    """The entries kept from one read back serve a later window starting further on (a budget
    that drops the oldest turns, summaries moving the floor up): every turn is fed what reading
    its window afresh (GetTranscriptWindow) gives, and its own newest events."""
    sidecar = start_server(token_counter="chars", transcript_token_budget=400)
    stub = sidecar.stub
    open_full(stub, "run", summarization_supported=True, keep_last_turns=1)
    starts, unsummarised, in_force = set(), [], []
    for turn in range(1, 41):
        events = [pb.Event(event_id=f"{kind}{turn}", role=role, content=f"{kind}{turn} " + "x" * 40)
                  for kind, role in (("u", "user"), ("a", "assistant"))]
        answer = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn, append_events=events))
        fresh = stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="run", iteration=turn))
        assert list(answer.event_ids) == list(fresh.event_ids)
        assert [(e.event_id, e.text) for e in answer.entries] == [(e.event_id, e.rendered) for e in fresh.entries]
        assert [e.event_id for e in answer.entries][-2:] == [f"u{turn}", f"a{turn}"]
        starts.add(next(e for e in answer.event_ids if not e.startswith("sidecar:")))
        unsummarised += [f"u{turn}", f"a{turn}"]
        if turn % 4 == 0:  # the oldest two turns not summarised yet, folded into the summary in force
            replaced, unsummarised = unsummarised[:4], unsummarised[4:]
            in_force = [stub.RecordSummary(pb.RecordSummaryRequest(
                run_id="run", iteration=turn + 1, summary_text=f"up to turn {turn}", strategy="recursive",
                replaced_event_ids=in_force + replaced)).summary_ref]
    assert len(starts) > 10  # the window's start moved on, turn after turn


@pytest.mark.parametrize("change", ["events appended", "the window before it chosen again"])
def test_the_newest_iteration_again_after_what_its_plan_reads_changed(tmp_path: Path, change: str):
    """The newest iteration's answer is kept too, while nothing its window is chosen from changed:
    events appended to it (AppendEvents, no assembly), or the window before it chosen again (under
    a tighter cap), which a cache-stable window starts from."""
    sidecar = Sidecar(tmp_path, *FLAGS)
    newest = pb.AssembleContextRequest(run_id="run", iteration=5)
    try:
        open_full(sidecar.stub, "run")
        for turn in (1, 2, 3):
            sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn,
                                                                   append_events=tool_turn(turn)))
        sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=4))
        sidecar.stub.AssembleContext(newest)
        before = [as_sent(sidecar.channel, newest) for _ in range(2)]
        if change == "events appended":
            sidecar.stub.AppendEvents(pb.AppendEventsRequest(run_id="run", events=[
                pb.Event(event_id="late", iteration=5, role="user", content="And one more question.")]))
        else:
            sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=4,
                                                                   max_transcript_tokens=3000))
        after = as_sent(sidecar.channel, newest)
    finally:
        sidecar.stop()
    assert before[0] == before[1]
    assert [after] == afresh(tmp_path, [newest])
    assert after != before[0]
