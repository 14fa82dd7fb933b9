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

With ``--before DIR`` a second sidecar runs from the source tree DIR (fastcore compiled in place
there, as for ``benchmarks.compare_trees``) on a run of its own, and its calls join the same
rotating rounds: the table gives each tree's figures side by side and after p50 / before p50.

    python -m benchmarks.summaries [--rounds 300] [--stacked 50] [--no-sync] [--before DIR [--after DIR]]
"""

from __future__ import annotations

import argparse
import tempfile
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import corpus
from benchmarks.harness import Samples, interleaved, sidecar_process
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.pb.contextsidecar.v1 import sidecar_pb2_grpc as pb_grpc

BUDGET = 32000
UNSUMMARISED = 100  # events the rounds keep between the summaries and the verbatim floor
RUN = "stacked"
KINDS = ("bare", "assemble", "turn", "record")


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


class Stacked:
    """One sidecar with the run built on it, and the calls the rounds time there."""

    def __init__(self, channel: grpc.Channel, stacked: int, new_contents: list[str]) -> None:
        self.stub = pb_grpc.ContextSidecarStub(channel)
        self.health = health_pb2_grpc.HealthStub(channel)
        self.state = build(self.stub, stacked)
        self.writes = writing_calls(self.stub, self.state, new_contents)
        # Re-assembling this iteration reads a window with every summary in force.
        self.pinned = self.state["iteration"] - 1
        self.window = self.assemble(self.pinned)

    def assemble(self, iteration: int) -> pb.AssembleContextResponse:
        return self.stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=iteration))

    def calls(self) -> dict[str, Callable[[], object]]:
        return {"bare": lambda: self.health.Check(health_pb2.HealthCheckRequest()),
                "assemble": lambda: self.assemble(self.pinned), **self.writes}

    def shape(self) -> str:
        """What the pinned window holds, and how many summaries the newest one still has."""
        in_window = summaries_in(self.window)
        still = summaries_in(self.assemble(self.state["iteration"] - 1))
        return (f"{in_window} summaries in the re-assembled window ({len(self.window.entries)} entries, "
                f"{self.window.token_count} tokens); {still} at the end of the rounds")


def summaries_in(window: pb.AssembleContextResponse) -> int:
    return sum(1 for entry in window.entries if entry.type == "context.summary")


def measure(rounds: int, stacked: int, flags: list[str], trees: dict[str, Path | None]) -> None:
    """Time every kind of call on one sidecar per tree (``None``: the installed one), all in the
    same rotating rounds."""
    sidecar_flags = ["--token-counter", "o200k_base", "--transcript-token-budget", str(BUDGET), "--summarization",
                     *flags]
    new_contents = corpus.contents(rounds + 64, seed=11)
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp, ExitStack() as stack:
        workloads: dict[str, Stacked] = {}
        calls: dict[str, Callable[[], object]] = {}
        for name, tree in trees.items():
            channel = stack.enter_context(sidecar_process(Path(tmp) / name, sidecar_flags, tree=tree))
            workloads[name] = Stacked(channel, stacked, new_contents)
            calls.update({f"{name} {kind}": call for kind, call in workloads[name].calls().items()})
        samples = interleaved(calls, rounds)
        shapes = {name: workload.shape() for name, workload in workloads.items()}

    print(f"\nsidecar flags: {' '.join(flags) or '(defaults: sync on)'}; {rounds} interleaved rounds")
    for name, tree in trees.items():
        print(f"{name}{f' ({tree})' if tree else ''}: {shapes[name]}")
    labels = {"bare": "bare RPC (health Check)", "assemble": f"AssembleContext, {stacked} summaries (read)",
              "turn": "AssembleContext, append + persist (turn)", "record": "RecordSummary (recursive)"}
    if len(trees) == 1:
        (name,) = trees
        print("\n| call | p50 us | p99 us | p50 / bare p50 |\n|---|---:|---:|---:|")
        for kind in KINDS:
            s = samples[f"{name} {kind}"]
            print(f"| {labels[kind]} | {s.p50:,.0f} | {s.p99:,.0f} | {s.p50 / samples[f'{name} bare'].p50:.2f} |")
        return
    print("\n| call | before p50 us | before / bare | after p50 us | after / bare | after / before |\n"
          "|---|---:|---:|---:|---:|---:|")
    for kind in KINDS:
        before, after = samples[f"before {kind}"], samples[f"after {kind}"]
        print(f"| {labels[kind]} | {before.p50:,.0f} | {to_bare(samples, 'before', before):.2f} | "
              f"{after.p50:,.0f} | {to_bare(samples, 'after', after):.2f} | {after.p50 / before.p50:.2f} |")


def to_bare(samples: dict[str, Samples], tree: str, call: Samples) -> float:
    return call.p50 / samples[f"{tree} bare"].p50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--stacked", type=int, default=50, help="summaries in force")
    parser.add_argument("--no-sync", action="store_true",
                        help="run the sidecar with --no-sync, to see its own work without the fsyncs")
    parser.add_argument("--before", type=Path, help="a source tree to run side by side with, as the baseline")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="with --before: the changed tree (default: this one)")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()} if args.before else {"sidecar": None}
    measure(args.rounds, args.stacked, ["--no-sync"] if args.no_sync else [], trees)


if __name__ == "__main__":
    main()
