"""A pause longer than the provider's cache TTL ([render]): the next request re-bills its whole
prefix whatever it holds, so the turn takes then the big steps the budget would soon force (the
cache-stable start's move, a clearing) and says why nothing repeats (cache_expired). Over a real
server whose clock the test sets: no test waits for minutes."""

from __future__ import annotations

import json

import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

BUDGET = 3000
TTL = 300  # Anthropic's 5 minutes
PAUSE_AT = 8  # the turn that comes after a pause: the window then holds 0.6-0.8 of the budget


class Clock:
    """Seconds since the epoch, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def turn(i: int) -> list[pb.Event]:
    call_id = f"toolu_{i:04d}"
    return [pb.Event(event_id=f"u{i}", role="user", content=f"question {i}: " + "q" * 40),
            pb.Event(event_id=f"c{i}", role="assistant", type="tool_call", call_id=call_id, tool_name="search",
                     content=json.dumps({"q": f"q{i}"})),
            pb.Event(event_id=f"r{i}", role="tool", type="tool_result", call_id=call_id, content="r" * 90),
            pb.Event(event_id=f"a{i}", role="assistant", content=f"answer {i}")]


def play(stub, run_id: str, clock: Clock, turns: int, pause: float, form: str = "anthropic_messages",
         pause_at: int = PAUSE_AT) -> list[pb.AssembleContextResponse]:
    """``turns`` turns 10 seconds apart, but ``pause`` seconds before turn ``pause_at``."""
    answers = []
    for i in range(1, turns + 1):
        clock.now += pause if i == pause_at else 10
        answers.append(stub.AssembleContext(pb.AssembleContextRequest(
            run_id=run_id, iteration=i, append_events=turn(i), render=form)))
    return answers


def cleared(answer: pb.AssembleContextResponse) -> int:
    return answer.rendered.count("[tool result cleared to save context")


@pytest.mark.parametrize("clearing", [True, False])
def test_a_turn_after_the_cache_expired_takes_the_pending_steps(start_server, clearing: bool) -> None:
    clock = Clock()
    stub = start_server(clock=clock, token_counter="chars", transcript_token_budget=BUDGET,
                        window_policy="cache_stable", trim_to_fraction=0.6,
                        clearing={"enabled": clearing, "keep_recent": 1},
                        render={"anthropic_cache_ttl_seconds": TTL}).stub
    warm = play(stub, "warm", clock, PAUSE_AT, pause=10)
    cold = play(stub, "cold", clock, PAUSE_AT, pause=TTL + 1)
    before, warm_turn, cold_turn = cold[PAUSE_AT - 2], warm[PAUSE_AT - 1], cold[PAUSE_AT - 1]
    assert [a.event_ids for a in warm[:-1]] == [a.event_ids for a in cold[:-1]], "the same runs until the pause"
    assert before.token_count > 0.6 * BUDGET, "the window had passed trim_to_fraction: a step was pending"
    # Warm, the turn only appends: the whole previous request repeats.
    assert warm_turn.cache.break_reason == "" and warm_turn.event_ids[0] == before.event_ids[0]
    assert cleared(warm_turn) == cleared(before)
    # Cold, nothing is read from the cache: the turn takes the step the budget would force later.
    assert (cold_turn.cache.break_reason, cold_turn.cache.stable_prefix_tokens, cold_turn.cache.break_at) == \
        ("cache_expired", 0, 0)
    if clearing:
        # Old results are cleared now; the recent turns' results never are, so when clearing the
        # older ones does not bring the window within trim_to_fraction, its start moves too.
        assert cleared(cold_turn) > cleared(before) or cold_turn.event_ids[0] != before.event_ids[0], \
            "old tool results are cleared now, or the window's start moved"
    else:
        assert cold_turn.event_ids[0] != before.event_ids[0], "the window's start moved now"
    assert cold_turn.token_count <= 0.6 * BUDGET + sum(e.tokens for e in cold_turn.appended)
    # The next turn, warm again, repeats the cold one.
    clock.now += 10
    after = stub.AssembleContext(pb.AssembleContextRequest(
        run_id="cold", iteration=PAUSE_AT + 1, append_events=turn(PAUSE_AT + 1), render="anthropic_messages"))
    assert after.cache.break_reason == ""
    # The decision is kept with the window: assembled again, much later, the iteration is the same.
    clock.now += 10 * TTL
    again = stub.AssembleContext(pb.AssembleContextRequest(run_id="cold", iteration=PAUSE_AT,
                                                           render="anthropic_messages"))
    assert (again.event_ids, again.rendered, again.cache) == (cold_turn.event_ids, cold_turn.rendered, cold_turn.cache)


def test_each_provider_has_its_own_ttl_and_the_plain_form_none(start_server) -> None:
    clock = Clock()
    stub = start_server(clock=clock, token_counter="chars", transcript_token_budget=BUDGET,
                        window_policy="cache_stable", clearing={"enabled": True, "keep_recent": 1},
                        render={"anthropic_cache_ttl_seconds": TTL, "openai_cache_ttl_seconds": 3600}).stub
    reasons = {}
    for form in ("anthropic_messages", "openai_responses", ""):
        reasons[form] = play(stub, form or "plain", clock, PAUSE_AT, pause=TTL + 1, form=form)[-1].cache.break_reason
    assert reasons == {"anthropic_messages": "cache_expired", "openai_responses": "", "": ""}


def test_a_replay_fork_is_fed_its_source_windows_whatever_its_pauses(start_server) -> None:
    clock = Clock()
    stub = start_server(clock=clock, token_counter="chars", transcript_token_budget=BUDGET,
                        window_policy="cache_stable", clearing={"enabled": True, "keep_recent": 1},
                        render={"anthropic_cache_ttl_seconds": TTL}).stub
    source = play(stub, "source", clock, PAUSE_AT + 4, pause=TTL + 1)
    assert source[PAUSE_AT - 1].cache.break_reason == "cache_expired"
    for pause in (10, TTL + 1):
        # A fork paused nowhere the source did not, then one paused where the source paused.
        stub.ForkRun(pb.ForkRunRequest(source_run_id="source", from_seq=0, mode="replay", new_run_id=f"fork{pause}"))
        fork = []
        for i in range(1, PAUSE_AT + 5):
            clock.now += 10 if i != 3 else pause  # a pause at turn 3: the source had none there
            fork.append(stub.AssembleContext(pb.AssembleContextRequest(
                run_id=f"fork{pause}", iteration=i, append_events=turn(i), render="anthropic_messages")))
        assert [(a.event_ids, a.rendered, a.cache) for a in fork] == \
            [(a.event_ids, a.rendered, a.cache) for a in source]


def test_the_built_in_summariser_summarises_on_a_cold_turn_what_it_soon_would(start_server) -> None:
    """Its summary is fed in the cold request itself: from trim_to_fraction on, not the trigger."""
    clock = Clock()
    stub = start_server(clock=clock, token_counter="chars", transcript_token_budget=BUDGET,
                        window_policy="cache_stable", trim_to_fraction=0.6, compaction_fraction=0.75,
                        summarization=True, summariser="extractive", keep_last_turns=1,
                        clearing={"enabled": False}, render={"anthropic_cache_ttl_seconds": TTL}).stub
    pause_at = 7  # the window then holds between 0.6 and 0.75 of the budget
    warm = play(stub, "warm", clock, pause_at, pause=10, pause_at=pause_at)
    cold = play(stub, "cold", clock, pause_at, pause=TTL + 1, pause_at=pause_at)
    assert 0.6 * BUDGET < warm[-1].token_count <= 0.75 * BUDGET
    assert warm[-1].summarized_events == 0 and warm[-1].cache.break_reason == ""
    assert cold[-1].summarized_events > 0, "summarised now, fed in this request"
    assert cold[-1].cache.break_reason == "cache_expired"
    window = stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="cold", iteration=pause_at))
    assert len(window.summarized_ranges) == 1
