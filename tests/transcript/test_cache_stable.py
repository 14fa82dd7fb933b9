"""The cache-stable window ([context] window_policy) and a compaction signal that does not nag,
through a real server: what a host sees turn after turn, recounted independently with tiktoken."""

from __future__ import annotations

import random

import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.text.fencing import fence
from tests.helpers import tool_turn

BUDGET = 4000
TRIM = 0.6
NO_CLEARING = {"enabled": False}
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega",
         "result", "value", "{", "}", "0123", "agent", "tool"]


def chat_turns(seed: int, turns: int) -> list[pb.Event]:
    """A user message and an answer a turn; some turns call a tool, answered in the same turn or
    the next (a group spanning two turns)."""
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    sent, pending = [], None
    for turn in range(1, turns + 1):
        sent.append(pb.Event(event_id=f"u{turn}", iteration=turn, role="user", content=text(rng.randrange(10, 80))))
        if pending:
            sent.append(pb.Event(event_id=f"r{turn}", iteration=turn, role="tool", type="tool_result",
                                 call_id=pending, content=text(rng.randrange(20, 200))))
            pending = None
        if rng.random() < 0.3:
            call_id = f"k{turn}"
            sent.append(pb.Event(event_id=f"c{turn}", iteration=turn, role="assistant", type="tool_call",
                                 call_id=call_id, tool_name="lookup", content=f'{{"q": "{text(3)}"}}'))
            if rng.random() < 0.5:
                sent.append(pb.Event(event_id=f"r{turn}a", iteration=turn, role="tool", type="tool_result",
                                     call_id=call_id, content=text(rng.randrange(20, 300))))
            else:
                pending = call_id
        sent.append(pb.Event(event_id=f"a{turn}", iteration=turn, role="assistant",
                             content=text(rng.randrange(10, 120))))
    return sent


def fed_tokens(count, events: list[pb.Event]) -> list[int]:
    """Each event's count as fed (a tool result inside the untrusted-data block), recounted here."""
    return [count(fence(e.content) if e.role == "tool" else e.content) for e in events]


def run_turns(stub, run_id: str, sent: list[pb.Event], turns: range) -> dict[int, pb.AssembleContextResponse]:
    answers = {}
    for turn in turns:
        answers[turn] = stub.AssembleContext(pb.AssembleContextRequest(
            run_id=run_id, iteration=turn, append_events=[e for e in sent if e.iteration == turn]))
    return answers


def check_rules(answer: pb.AssembleContextResponse, sent: list[pb.Event], tokens: list[int], count) -> int:
    """Every rule of the window on one turn; returns the seq of its first entry."""
    turn = answer.iteration
    prefix = [e for e in sent if e.iteration <= turn]
    first = answer.omitted_events
    assert list(answer.event_ids) == [e.event_id for e in prefix[first:]], "a contiguous recent tail"
    assert answer.token_count == sum(count(entry.text) for entry in answer.entries) == sum(tokens[first:len(prefix)])
    assert answer.token_count <= BUDGET
    assert {e.event_id for e in prefix if e.iteration == turn} <= set(answer.event_ids), "the active turn is in"
    inside = set(answer.event_ids)
    for call_id in {e.call_id for e in prefix if e.call_id}:
        members = {e.event_id for e in prefix if e.call_id == call_id}
        assert members <= inside or not members & inside, f"group {call_id} split"
    return first


def starts_of(answers: dict[int, pb.AssembleContextResponse]) -> list[int]:
    return [answers[turn].omitted_events for turn in sorted(answers)]


def test_a_long_run_keeps_its_start_until_the_budget_forces_one_big_step(start_server, counters) -> None:
    count = counters.get("o200k_base").count
    sent = chat_turns(10, 200)
    tokens = fed_tokens(count, sent)
    # Clearing off: this test holds the start's rule over the host's own events (clearing with it
    # is tested in test_clearing.py).
    stable = start_server(token_counter="o200k_base", transcript_token_budget=BUDGET, clearing=NO_CLEARING).stub
    answers = run_turns(stable, "run", sent, range(1, 201))
    moves = 0
    for turn in range(2, 201):
        before, now = answers[turn - 1].omitted_events, check_rules(answers[turn], sent, tokens, count)
        end = sum(1 for e in sent if e.iteration <= turn)
        if now == before:
            continue
        moves += 1
        assert now > before, "the start only moves forward"
        # It moved because the window from the old start would have passed the budget ...
        assert sum(tokens[before:end]) > BUDGET, f"turn {turn}: moved while everything fitted"
        # ... in one step, to the oldest start within trim_to_fraction of it (an older one would
        # pass that, or is in a tool call group that must come whole).
        assert answers[turn].token_count <= TRIM * BUDGET
        assert answers[turn].token_count + tokens[now - 1] > TRIM * BUDGET or sent[now - 1].call_id
    assert answers[200].omitted_events > 0, "the run outgrew the budget"

    # The same run under max_fill: the start moves on almost every turn once the budget is full.
    max_fill = start_server(token_counter="o200k_base", transcript_token_budget=BUDGET, window_policy="max_fill",
                            clearing=NO_CLEARING).stub
    filled = starts_of(run_turns(max_fill, "run", sent, range(1, 201)))
    filled_moves = sum(1 for a, b in zip(filled, filled[1:]) if a != b)
    assert filled_moves >= 120 and moves <= 25, (moves, filled_moves)  # measured: 20 against 146


def test_re_assembly_and_a_replay_fork_reproduce_the_starts(start_server, counters) -> None:
    sent = chat_turns(11, 120)
    stub = start_server(token_counter="o200k_base", transcript_token_budget=1500).stub
    answers = run_turns(stub, "source", sent, range(1, 121))
    starts = starts_of(answers)
    assert len(set(starts)) > 3, "the start moved several times"
    # Re-assembling old iterations (nothing new) gives back exactly what was fed.
    for turn in (17, 60, 119):
        again = stub.AssembleContext(pb.AssembleContextRequest(run_id="source", iteration=turn))
        assert list(again.event_ids) == list(answers[turn].event_ids)
        seam = stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="source", iteration=turn))
        assert list(seam.event_ids) == list(answers[turn].event_ids)
    # A replay fork from mid-run, its host sending the same turns again, sees the same windows.
    from_seq = next(entry.seq for entry in answers[61].entries if entry.event_id == "u61")
    stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=from_seq, mode="replay", new_run_id="replay"))
    replayed = run_turns(stub, "replay", sent, range(61, 121))
    for turn in range(61, 121):
        assert list(replayed[turn].event_ids) == list(answers[turn].event_ids), turn
        assert replayed[turn].token_count == answers[turn].token_count


def host_summarises(stub, run_id: str, turns: int,
                    event_words: int) -> tuple[int, int, list[pb.AssembleContextResponse]]:
    """The host summarises whenever compaction is due, with a fixed short text; returns the
    summaries recorded, the turns on which a summary was fed, and every answer."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
    recorded = fed = 0
    answers = []
    asked: dict[int, str] = {}  # the iteration a summary was recorded for -> its ref
    for turn in range(1, turns + 1):
        new = [pb.Event(event_id=f"e{turn}-{k}", role="user" if k == 0 else "assistant",
                        content=" ".join(words[(turn * 2 + k + i) % len(words)] for i in range(event_words)))
               for k in range(2)]
        answer = stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=turn, append_events=new))
        answers.append(answer)
        fed += any(entry.type == "context.summary" for entry in answer.entries)
        assert turn not in asked or asked[turn] in answer.event_ids, f"the summary asked for is fed at {turn}"
        if answer.compaction.due and answer.compaction.candidate_event_ids:
            asked[turn + 1] = stub.RecordSummary(pb.RecordSummaryRequest(
                run_id=run_id, iteration=turn + 1, replaced_event_ids=answer.compaction.candidate_event_ids,
                summary_text="Earlier turns: the user and the assistant went through the letters.")).summary_ref
            recorded += 1
    return recorded, fed, answers


@pytest.mark.parametrize("policy", ["cache_stable", "max_fill"])
def test_compaction_is_asked_for_a_third_as_often(start_server, counters, policy: str) -> None:
    """800 tokens, 2 events of ~60 tokens a turn, 100 turns: the old signal asked for a summary
    on 96 turns (a trigger of 600 tokens that the 4 protected turns' 480 kept crossing); now a
    summary is asked for once a trigger's worth of new transcript has come, and each is fed in the
    next window (it replaces what lies before the recent turns, no more)."""
    stub = start_server(token_counter="o200k_base", transcript_token_budget=800, summarization=True,
                        window_policy=policy).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run"))
    recorded, fed, answers = host_summarises(stub, "run", 100, 48)
    count = counters.get("o200k_base").count
    assert all(55 <= count(e.text) <= 65 for a in answers[:5] for e in a.entries), "~60-token events"
    # Measured: 16 (the trigger on all the unsummarised transcript instead of what came after the
    # last summary: 32; the signal before this change: 96 on turns like these).
    assert 10 <= recorded <= 20, recorded
    # Measured: 23 (cache_stable), 32 (max_fill); 39 and 48 when a summary replaced all it could,
    # leaving the window its protected turns (the fill windows keep now: test_recent_turns.py).
    assert fed >= 20, f"summaries were fed on {fed} of 100 turns"
    due = [a.compaction.due for a in answers]
    assert not any(a and b for a, b in zip(due, due[1:])), "never asked on two turns running"
    assert all(not a.compaction.reason for a in answers)


def test_protected_turns_over_the_trigger_are_said_once(start_server) -> None:
    """Turns of 300 chars at a 1,000-char budget with 10 turns kept verbatim: from turn 3 the
    protected turns alone (900, then more) pass the trigger (750): the answer says so once, not
    due, then stays quiet."""
    stub = start_server(token_counter="chars", transcript_token_budget=1000, summarization=True,
                        keep_last_turns=10).stub
    answers = [stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn, append_events=[
        pb.Event(event_id=f"u{turn}", role="user", content="x" * 150),
        pb.Event(event_id=f"a{turn}", role="assistant", content="y" * 150)])) for turn in range(1, 6)]
    assert [a.compaction.due for a in answers] == [False] * 5
    reasons = [a.compaction.reason for a in answers]
    assert reasons[2].startswith("protected_turns_exceed_trigger: ") and reasons[:2] + reasons[3:] == [""] * 4
    assert "hold 900 tokens, over the compaction trigger of 750" in reasons[2]
    # Re-assembling the turn that said it gives the same answer.
    again = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=3))
    assert again.compaction.reason == reasons[2]


def test_a_replay_fork_reproduces_starts_clearings_and_summaries_together(start_server) -> None:
    """The defaults together (cache_stable, clearing on, summaries recorded whenever due) on a
    tool-heavy run: a replay fork from mid-run whose host sends the same turns and asks for the
    same summaries is fed the source's windows byte for byte, and its log holds the same
    clearings and summaries at the same seqs."""
    sidecar = start_server(token_counter="o200k_base", transcript_token_budget=16_000, summarization=True,
                           keep_last_turns=3)
    stub = sidecar.stub

    def play(run_id: str, turns: range) -> dict[int, pb.AssembleContextResponse]:
        answers = {}
        for turn in turns:
            answers[turn] = stub.AssembleContext(pb.AssembleContextRequest(
                run_id=run_id, iteration=turn,
                append_events=[pb.Event(iteration=turn, **{f.name: v for f, v in e.ListFields()})
                               for e in tool_turn(turn)]))
            if answers[turn].compaction.due:
                stub.RecordSummary(pb.RecordSummaryRequest(
                    run_id=run_id, iteration=turn + 1, replaced_event_ids=answers[turn].compaction.candidate_event_ids,
                    summary_text=f"What happened up to turn {turn}: refunds and orders were looked up."))
        return answers

    source = play("source", range(1, 41))
    log = stub.ListRunEvents(pb.ListRunEventsRequest(run_id="source", limit=1000)).events
    kinds = {e.type for e in log}
    assert {"context.cleared", "context.summarized"} <= kinds, kinds
    starts = {answer.entries[0].event_id for answer in source.values()}
    assert len(starts) > 2, "the start moved"
    # Fork where the source's window already feeds cleared results, so the fork must carry them.
    placeholder = "[tool result cleared"
    first = next(turn for turn in range(10, 40) if any(e.text.startswith(placeholder) for e in source[turn].entries))
    from_seq = next(e.seq for e in log if e.event_id == f"u{first + 1}")
    stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=from_seq, mode="replay", new_run_id="fork"))
    fork = play("fork", range(first + 1, 41))
    for turn in range(first + 1, 41):
        assert [(e.event_id, e.text, e.tokens) for e in fork[turn].entries] == \
            [(e.event_id, e.text, e.tokens) for e in source[turn].entries], turn
    fork_log = stub.ListRunEvents(pb.ListRunEventsRequest(run_id="fork", limit=1000)).events
    assert [(e.seq, e.event_id, e.type) for e in fork_log] == [(e.seq, e.event_id, e.type) for e in log]


def test_no_summary_is_asked_for_that_could_not_bring_the_transcript_under_the_trigger(start_server) -> None:
    """Tool results of 200-4,000 tokens at an 800-token budget: the protected turns alone pass
    the trigger on every turn, so a summary of the older ones could never help. Compaction is not
    asked for; the answer says why once, not every turn."""
    stub = start_server(token_counter="o200k_base", transcript_token_budget=800, summarization=True).stub
    due, reasons = 0, []
    for turn in range(1, 31):
        answer = stub.AssembleContext(pb.AssembleContextRequest(
            run_id="run", iteration=turn,
            append_events=[pb.Event(iteration=turn, **{f.name: v for f, v in e.ListFields()})
                           for e in tool_turn(turn)]))
        due += answer.compaction.due
        if answer.compaction.reason:
            reasons.append((turn, answer.compaction.reason.split(":")[0]))
        assert answer.token_count <= 800
    assert due == 0
    assert [reason for _, reason in reasons] == ["protected_turns_exceed_trigger"], reasons
