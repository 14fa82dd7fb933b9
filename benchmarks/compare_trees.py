"""Per-turn latency of two source trees of the sidecar, side by side in one run: is a change slower?

A restructuring, a refactor or a speed fix is judged against the tree before it, on the same
machine at the same moment: both sidecars run at once (each a real process from its own tree,
real LMDB, o200k counting), receive the same run, and every call of both is timed once per round
in a rotating order, so the drift of a shared machine hits both alike. The calls:

- bare: a health Check, the floor under any RPC;
- assemble: AssembleContext re-assembling a persisted iteration (the read path);
- turn: AssembleContext appending one new ~190-token event for a new iteration (count, one
  durable commit, persist the window, answer): the real per-turn call;
- append 100: AppendEvents of 100 new events (a batch a new iteration), on a run of its own;
- stacked turn and record: on a run with 50 summaries in force (``summaries``), a turn of one
  event, and RecordSummary folding the summary in force and the oldest unsummarised event into
  one (``recursive``), so the run keeps its shape round after round.

The figure to read is after p50 / before p50 per call: 1.00 is no change. Both trees need fastcore
compiled in place (``python setup.py build_ext --inplace``); a tree of an older commit is made with
``git worktree add /tmp/before <commit>``.

    python -m benchmarks.compare_trees --before /tmp/before [--after .] [--events 10000] [--rounds 300]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import corpus, summaries
from benchmarks.harness import interleaved, sidecar_process
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.pb.contextsidecar.v1 import sidecar_pb2_grpc as pb_grpc

BUDGET = 32000
RUN = "run"
STACKED = 50  # summaries in force on the run RecordSummary writes
APPENDED = 100  # events per AppendEvents
APPENDS_RUN = "appends"
WARMUP = 20  # interleaved's warm-up calls of each
KINDS = ("bare", "assemble", "turn", "append 100", "stacked turn", "record")


def load(stub: pb_grpc.ContextSidecarStub, events: int) -> int:
    """Append the corpus run; the last iteration it holds."""
    batch: list[pb.Event] = []
    for index, event in enumerate(corpus.events(events, seed=events)):
        batch.append(pb.Event(**event._asdict()))
        if len(batch) == 500 or index == events - 1:
            stub.AppendEvents(pb.AppendEventsRequest(run_id=RUN, events=batch))
            batch = []
    return (events - 1) // corpus.EVENTS_PER_TURN + 1


def calls_for(channel, events: int, new_contents: list[str]) -> dict[str, Callable[[], object]]:
    stub, health = pb_grpc.ContextSidecarStub(channel), health_pb2_grpc.HealthStub(channel)
    last = load(stub, events)
    read = pb.AssembleContextRequest(run_id=RUN, iteration=last, max_transcript_tokens=BUDGET)
    stub.AssembleContext(read)  # persists the window the rounds re-assemble
    next_turn = [last + 1]

    def turn() -> object:
        iteration = next_turn[0]
        next_turn[0] += 1
        event = pb.Event(event_id=f"turn-{iteration}", role="user", content=new_contents[iteration % len(new_contents)])
        return stub.AssembleContext(pb.AssembleContextRequest(
            run_id=RUN, iteration=iteration, append_events=[event], max_transcript_tokens=BUDGET))

    return {"bare": lambda: health.Check(health_pb2.HealthCheckRequest()),
            "assemble": lambda: stub.AssembleContext(read), "turn": turn}


def append_requests(texts: list[str], count: int) -> Iterator[pb.AppendEventsRequest]:
    """``count`` AppendEvents of ``texts`` each, built before the rounds: a batch a new iteration."""
    return iter([pb.AppendEventsRequest(run_id=APPENDS_RUN, events=[
        pb.Event(event_id=f"b{batch}-{i}", iteration=batch, role="user" if i % 2 else "assistant", type="message",
                 content=text) for i, text in enumerate(texts)]) for batch in range(1, count + 1)])


def writes_for(channel, rounds: int) -> dict[str, Callable[[], object]]:
    """The other writing calls: AppendEvents of 100, and a turn and RecordSummary on a run with
    summaries in force."""
    stub = pb_grpc.ContextSidecarStub(channel)
    appends = append_requests(corpus.contents(APPENDED, seed=13), WARMUP + rounds)
    stacked = summaries.writing_calls(stub, summaries.build(stub, STACKED), corpus.contents(rounds + 64, seed=11))
    return {"append 100": lambda: stub.AppendEvents(next(appends)), "stacked turn": stacked["turn"],
            "record": stacked["record"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the tree to compare against")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parent.parent, help="the changed tree")
    parser.add_argument("--events", type=int, default=10_000, help="events in the run")
    parser.add_argument("--rounds", type=int, default=300, help="interleaved rounds of every call")
    args = parser.parse_args()
    flags = ["--token-counter", "o200k_base", "--transcript-token-budget", str(BUDGET)]
    new_contents = corpus.contents(512, seed=7)
    with tempfile.TemporaryDirectory(prefix="sidecar-compare-") as tmp, ExitStack() as stack:
        calls: dict[str, Callable[[], object]] = {}
        for name, tree in (("before", args.before), ("after", args.after)):
            channel = stack.enter_context(sidecar_process(Path(tmp) / name, flags, tree=tree.resolve()))
            tree_calls = {**calls_for(channel, args.events, new_contents), **writes_for(channel, args.rounds)}
            for kind, call in tree_calls.items():
                calls[f"{name} {kind}"] = call
        samples = interleaved(calls, args.rounds, WARMUP)
    print(f"\n{args.rounds} interleaved rounds, {args.events:,} events, {BUDGET // 1000}k budget; "
          f"before {args.before}, after {args.after}\n")
    print("| call | before p50 us | after p50 us | after / before |\n|---|---:|---:|---:|")
    for kind in KINDS:
        before, after = samples[f"before {kind}"].p50, samples[f"after {kind}"].p50
        print(f"| {kind} | {before:,.0f} | {after:,.0f} | {after / before:.2f} |")


if __name__ == "__main__":
    main()
