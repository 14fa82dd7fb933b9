"""RecordSummary and AssembleContext on a run with 50 stacked summaries, against the bare RPC.

A real sidecar process; one run of ~190-token events with 50 summaries in force (each ~60
tokens, all in the window together with ~100 unsummarised events, under a 32k budget). Then,
round by round, every call once in a rotating order:

- bare: a health Check, the floor under any RPC;
- assemble: AssembleContext re-assembling an iteration with the 50 summaries in its window
  (read path: nothing written);
- turn: AssembleContext appending one event for a new iteration (count, durable commit, persist
  the window with its 50 summaries);
- record: RecordSummary of the summary in force plus the oldest unsummarised event
  (``recursive``, so the stack stays at 50): validate, durable commit.

    python -m benchmarks.summaries [--rounds 300] [--stacked 50] [--no-sync]
"""

from __future__ import annotations

import argparse
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import corpus
from benchmarks.harness import interleaved, sidecar_process
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.pb.contextsidecar.v1 import sidecar_pb2_grpc as pb_grpc

BUDGET = 32000
UNSUMMARISED = 100  # events the rounds keep between the summaries and the verbatim floor
RUN = "stacked"


def summary_text(index: int) -> str:
    return (f"Summary {index}: the customer asked about order {index * 7}; the agent searched the refund policy, "
            f"found clause {index % 9}, and answered with the shipping status and the next steps.")


def build(stub: pb_grpc.ContextSidecarStub, stacked: int) -> dict:
    """The run: ``stacked`` one-event summaries in force, then ``UNSUMMARISED`` events."""
    stub.OpenRun(pb.OpenRunRequest(run_id=RUN, summarization_supported=True, keep_last_turns=1))
    total = stacked + UNSUMMARISED
    events = [pb.Event(event_id=f"e{i}", iteration=1, role=e.role, type="message", content=e.content)
              for i, e in enumerate(corpus.events(total, seed=3))]
    for first in range(0, total, 500):
        stub.AppendEvents(pb.AppendEventsRequest(run_id=RUN, events=events[first:first + 500]))
    stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=1))
    refs = []
    for index in range(stacked):
        recorded = stub.RecordSummary(pb.RecordSummaryRequest(
            run_id=RUN, iteration=index + 2, replaced_event_ids=[f"e{index}"], summary_text=summary_text(index)))
        refs.append(recorded.summary_ref)
        stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=index + 2))
    # The unsummarised events, oldest first: each turn adds one, each record folds one in.
    return {"refs": refs, "unsummarised": deque(f"e{i}" for i in range(stacked, total)), "iteration": stacked + 2}


def writing_calls(stub: pb_grpc.ContextSidecarStub, state: dict,
                  new_contents: list[str]) -> dict[str, Callable[[], object]]:
    """The run's writing calls: ``turn`` appends one event for a new iteration (its content from
    ``new_contents``); ``record`` folds the summary in force and the oldest unsummarised event into
    one summary (``recursive``), so as many turns as records keep the stack and the events at
    their size."""

    def turn() -> None:
        iteration = state["iteration"]
        stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=iteration, append_events=[
            pb.Event(event_id=f"t{iteration}", role="user", content=new_contents[iteration % len(new_contents)])]))
        state["unsummarised"].append(f"t{iteration}")
        state["iteration"] += 1

    def record() -> None:
        # The summary in force folded with the next event: the stack keeps its size.
        folded = state["unsummarised"].popleft()
        recorded = stub.RecordSummary(pb.RecordSummaryRequest(
            run_id=RUN, iteration=state["iteration"], strategy="recursive",
            replaced_event_ids=[state["refs"][-1], folded], summary_text=summary_text(len(state["refs"]))))
        state["refs"][-1] = recorded.summary_ref

    return {"turn": turn, "record": record}


def measure(rounds: int, stacked: int, extra_flags: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        with sidecar_process(Path(tmp) / "lmdb", ["--token-counter", "o200k_base", "--transcript-token-budget",
                                                  str(BUDGET), "--summarization", *extra_flags]) as channel:
            stub = pb_grpc.ContextSidecarStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            state = build(stub, stacked)
            # Re-assembling this iteration reads a window with every summary in force.
            pinned = state["iteration"] - 1
            window = stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=pinned))
            in_window = sum(1 for entry in window.entries if entry.type == "context.summary")
            writes = writing_calls(stub, state, corpus.contents(rounds + 64, seed=11))

            calls = {"bare": lambda: health.Check(health_pb2.HealthCheckRequest()),
                     "assemble": lambda: stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=pinned)),
                     **writes}
            samples = interleaved(calls, rounds)
            last = stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=state["iteration"] - 1))
            still = sum(1 for entry in last.entries if entry.type == "context.summary")

    bare = samples["bare"].p50
    print(f"\nsidecar flags: {' '.join(extra_flags) or '(defaults: sync on)'}")
    print(f"{rounds} interleaved rounds; {in_window} summaries in the re-assembled window "
          f"({len(window.entries)} entries, {window.token_count} tokens); {still} at the end of the rounds\n")
    print("| call | p50 us | p99 us | p50 / bare p50 |\n|---|---:|---:|---:|")
    for name, label in [("bare", "bare RPC (health Check)"),
                        ("assemble", f"AssembleContext, {in_window} summaries (read)"),
                        ("turn", "AssembleContext, append + persist (turn)"), ("record", "RecordSummary (recursive)")]:
        s = samples[name]
        print(f"| {label} | {s.p50:,.0f} | {s.p99:,.0f} | {s.p50 / bare:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--stacked", type=int, default=50, help="summaries in force")
    parser.add_argument("--no-sync", action="store_true",
                        help="run the sidecar with --no-sync, to see its own work without the fsyncs")
    args = parser.parse_args()
    measure(args.rounds, args.stacked, ["--no-sync"] if args.no_sync else [])


if __name__ == "__main__":
    main()
