"""The workloads the benchmarks share, so that a figure of one is the same call as in another: the
corpus run and its per-turn calls, the run with summaries stacked, the full profile, the memory ref.

Every run is loaded through gRPC in batches of 500 corpus events (``corpus``), the same seed giving
the same bytes; a turn appends one ~190-token event for a new iteration.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import grpc
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks._lib import corpus

BUDGET = 32000
RUN = "run"
APPENDED = 100  # events per AppendEvents
APPENDS_RUN = "appends"
WARMUP = 20  # interleaved's warm-up calls of each

Calls = dict[str, Callable[[], object]]


def sidecar_flags(budget: int = BUDGET) -> list[str]:
    """``serve``'s flags for every benchmark's sidecar: o200k counting and the transcript budget."""
    return ["--token-counter", "o200k_base", "--transcript-token-budget", str(budget)]


def bare_call(channel: grpc.Channel) -> Callable[[], object]:
    """A health Check: the floor under any RPC."""
    health = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest()
    return lambda: health.Check(request)


# The corpus run and the per-turn calls on it.

class LoadedRun(NamedTuple):
    last: int  # the last iteration it holds
    texts: list[str]
    mean_tokens: float  # o200k tokens an event, as the sidecar counted them


def last_iteration(events: int) -> int:
    return (events - 1) // corpus.EVENTS_PER_TURN + 1


def load(stub: pb_grpc.ContextSidecarStub, events: int, run_id: str = RUN) -> LoadedRun:
    """Append the corpus run of ``events`` events (seeded by their number)."""
    batch: list[pb.Event] = []
    texts, tokens = [], 0
    for index, event in enumerate(corpus.events(events, seed=events)):
        batch.append(pb.Event(**event._asdict()))
        texts.append(event.content)
        if len(batch) == 500 or index == events - 1:
            answer = stub.AppendEvents(pb.AppendEventsRequest(run_id=run_id, events=batch))
            tokens += sum(result.tokens for result in answer.results)
            batch = []
    return LoadedRun(last_iteration(events), texts, tokens / events)


def turn_request(run_id: str, iteration: int, content: str, budget: int | None = BUDGET,
                 event_id: str = "") -> pb.AssembleContextRequest:
    """The per-turn call: AssembleContext appending one user event for a new iteration."""
    event = pb.Event(event_id=event_id or f"turn-{iteration}", role="user", content=content)
    request = pb.AssembleContextRequest(run_id=run_id, iteration=iteration, append_events=[event])
    if budget is not None:  # None: the run's own budget (the field is optional: unset, not 0)
        request.max_transcript_tokens = budget
    return request


def calls_for(channel: grpc.Channel, events: int, new_contents: list[str], budget: int = BUDGET) -> Calls:
    """Load the corpus run; then ``bare``, ``assemble`` (re-assembling its last iteration, the read
    path) and ``turn`` (one new event for a new iteration each call)."""
    stub = pb_grpc.ContextSidecarStub(channel)
    last = load(stub, events).last
    read = pb.AssembleContextRequest(run_id=RUN, iteration=last, max_transcript_tokens=budget)
    stub.AssembleContext(read)  # persists the window the rounds re-assemble
    next_turn = [last + 1]

    def turn() -> object:
        iteration = next_turn[0]
        next_turn[0] += 1
        return stub.AssembleContext(turn_request(RUN, iteration, new_contents[iteration % len(new_contents)], budget))

    return {"bare": bare_call(channel), "assemble": lambda: stub.AssembleContext(read), "turn": turn}


def append_requests(texts: list[str], count: int) -> Iterator[pb.AppendEventsRequest]:
    """``count`` AppendEvents of ``texts`` each, built before the rounds: a batch a new iteration."""
    return iter([pb.AppendEventsRequest(run_id=APPENDS_RUN, events=[
        pb.Event(event_id=f"b{batch}-{i}", iteration=batch, role="user" if i % 2 else "assistant", type="message",
                 content=text) for i, text in enumerate(texts)]) for batch in range(1, count + 1)])


def writes_for(channel: grpc.Channel, rounds: int, stacked: int = 50) -> Calls:
    """The other writing calls: AppendEvents of 100, and a turn and RecordSummary on a run with
    ``stacked`` summaries in force."""
    stub = pb_grpc.ContextSidecarStub(channel)
    appends = append_requests(corpus.contents(APPENDED, seed=13), WARMUP + rounds)
    writes = stacked_writes(stub, build_stacked(stub, stacked), corpus.contents(rounds + 64, seed=11))
    return {"append 100": lambda: stub.AppendEvents(next(appends)), "stacked turn": writes["turn"],
            "record": writes["record"]}


# The run with summaries stacked: ``stacked`` one-event summaries in force, then 100 events.

STACKED_RUN = "stacked"
UNSUMMARISED = 100  # events the rounds keep between the summaries and the verbatim floor


def summary_text(index: int) -> str:
    return (f"Summary {index}: the customer asked about order {index * 7}; the agent searched the refund policy, "
            f"found clause {index % 9}, and answered with the shipping status and the next steps.")


def build_stacked(stub: pb_grpc.ContextSidecarStub, stacked: int) -> dict[str, Any]:
    """The run: ``stacked`` one-event summaries in force, then ``UNSUMMARISED`` events; its state
    (the summaries' refs, the unsummarised events oldest first, the next iteration)."""
    stub.OpenRun(pb.OpenRunRequest(run_id=STACKED_RUN, summarization_supported=True, keep_last_turns=1))
    total = stacked + UNSUMMARISED
    events = [pb.Event(event_id=f"e{i}", iteration=1, role=e.role, type="message", content=e.content)
              for i, e in enumerate(corpus.events(total, seed=3))]
    for first in range(0, total, 500):
        stub.AppendEvents(pb.AppendEventsRequest(run_id=STACKED_RUN, events=events[first:first + 500]))
    stub.AssembleContext(pb.AssembleContextRequest(run_id=STACKED_RUN, iteration=1))
    refs = []
    for index in range(stacked):
        recorded = stub.RecordSummary(pb.RecordSummaryRequest(
            run_id=STACKED_RUN, iteration=index + 2, replaced_event_ids=[f"e{index}"],
            summary_text=summary_text(index)))
        refs.append(recorded.summary_ref)
        stub.AssembleContext(pb.AssembleContextRequest(run_id=STACKED_RUN, iteration=index + 2))
    # The unsummarised events, oldest first: each turn adds one, each record folds one in.
    return {"refs": refs, "unsummarised": deque(f"e{i}" for i in range(stacked, total)), "iteration": stacked + 2}


def stacked_writes(stub: pb_grpc.ContextSidecarStub, state: dict[str, Any], new_contents: list[str]) -> Calls:
    """The stacked run's writing calls: ``turn`` appends one event for a new iteration (its content
    from ``new_contents``); ``record`` folds the summary in force and the oldest unsummarised event
    into one summary (``recursive``), so as many turns as records keep the stack and the events at
    their size."""

    def turn() -> None:
        iteration = state["iteration"]
        stub.AssembleContext(pb.AssembleContextRequest(run_id=STACKED_RUN, iteration=iteration, append_events=[
            pb.Event(event_id=f"t{iteration}", role="user", content=new_contents[iteration % len(new_contents)])]))
        state["unsummarised"].append(f"t{iteration}")
        state["iteration"] += 1

    def record() -> None:
        folded = state["unsummarised"].popleft()
        recorded = stub.RecordSummary(pb.RecordSummaryRequest(
            run_id=STACKED_RUN, iteration=state["iteration"], strategy="recursive",
            replaced_event_ids=[state["refs"][-1], folded], summary_text=summary_text(len(state["refs"]))))
        state["refs"][-1] = recorded.summary_ref

    return {"turn": turn, "record": record}


# The full profile: a ~2k-token system prompt, 40 tools with JSON schemas, participants, three
# remote agents, a skills index.

TOOLS = 40


def profile(rng: random.Random) -> pb.Profile:
    prompt = "\n\n".join(corpus.prose(rng) for _ in range(10))  # ~2k tokens
    tools = []
    for i in range(TOOLS):
        params = {f"{rng.choice(corpus._NAMES)}_{k}": {"type": rng.choice(("string", "integer", "boolean")),
                                                       "description": corpus.prose(rng)[:80]}
                  for k in range(rng.randrange(2, 6))}
        tools.append(pb.ToolDefinition(name=f"tool_{i:02d}", description=corpus.prose(rng)[:160],
                                       parameters_json=json.dumps({"type": "object", "properties": params,
                                                                   "required": list(params)[:1]})))
    return pb.Profile(
        system_prompt=prompt, tools=tools,
        participants=[pb.Participant(role=r, description=corpus.prose(rng)[:120]) for r in ("planner", "executor")],
        agents=[pb.RemoteAgent(id=f"agent-{i}", name=f"Agent {i}", description=corpus.prose(rng)[:200],
                               skills=["search", "summarise"]) for i in range(3)],
        skills=[pb.SkillSummary(name=f"skill-{i}", description=corpus.prose(rng)[:100]) for i in range(5)])


# The memory ref: entries of ~190 tokens, each with a few words from a 5,000-word vocabulary of
# names, so queries have rare terms as well as common ones.

MEMORY_REF = "mem:agent-bench"
MEMORY_BUDGET = 2000
NAMES = [f"name{i:04d}" for i in range(5000)]
QUERY = f"refund {NAMES[17]} {NAMES[4242]}"  # one word in most entries, two rare ones


def entry_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{text} Related: {' '.join(rng.sample(NAMES, 3))}." for text in corpus.contents(count, seed)]


def load_memory(stub: pb_grpc.ContextSidecarStub, count: int) -> float:
    """PutMemory ``count`` entries into the memory ref; the seconds it took."""
    started = time.perf_counter()
    for i, text in enumerate(entry_texts(count, seed=1)):
        stub.PutMemory(pb.PutMemoryRequest(memory_ref=MEMORY_REF, content=text, entry_id=f"m{i}"))
    return time.perf_counter() - started
