"""Where a turn's time goes, stage by stage, without a profiler: the turn's own work in a hot loop.

``profile_calls`` says which functions a call spends its time in, inflated by the profiler; this
times the stages of a turn as they run, with nothing in between: a sidecar's domain is built in
this process (``Services.open``, real LMDB, o200k counting, a 32k budget), loaded with the
10,000-event run of ``compare_trees`` through a real server, and then turns of one ~190-token
event are made directly on the domain (``Transcripts.assemble``, then the wire's encoding of the
answer), each stage wrapped by a timer. Medians in µs per turn; a stage inside another is counted
in both. ``--sync`` makes each commit durable (the commit is then most of a turn).

``--stacked``: the run of ``summaries`` instead, with 50 summaries in force, and after each turn a
RecordSummary folding the summary in force and the oldest unsummarised event into one (not
timed), so every turn walks the stack, and its window's floor moves on a turn at a time.

A hot loop is the floor of what Python costs here. ``--served`` times the same stages as a host's
turns meet them: the sidecar (the same domain, sync on, its stages timed) serves in a process of
its own, and this one loads the run and makes the turns through the wire, a bare health Check
beside each (``compare_trees``' calls, interleaved); the call inside the server (the servicer's
method) is a stage of its own, and the call and the bare RPC as the host timed them are printed
under the stages. A hot loop understates what the same work costs served: between a durable
commit's waits on the disk and the other processes' calls, its caches are cold (docs/speed.md).

    python -m benchmarks.turn_stages [--turns 1000] [--events 10000] [--sync] [--stacked | --served]
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from benchmarks import corpus, summaries
from benchmarks.compare_trees import BUDGET, RUN, STACKED, calls_for, load
from benchmarks.harness import READY, channel_to, interleaved, serving
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.pb.contextsidecar.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.settings import load_settings
from sidecar.storage import environment
from sidecar.transcript import transcripts, turn
from sidecar.transcript.log import NewEvent
from sidecar.transcript.summaries import SummaryRequest
from sidecar.wire import messages, servicer, splice
from sidecar.wire import server as server_module

_samples: dict[str, list[float]] = {}

# (module or class, attribute, stage name): what is timed, outermost first.
STAGES: tuple[tuple[Any, str, str], ...] = (
    (servicer.ContextSidecarServicer, "AssembleContext", "the call inside the server (--served)"),
    (transcripts.Transcripts, "_appender", "count the events (outside the write lock)"),
    (environment.Store, "_write_local", "write transaction, commit included"),
    (turn.Turn, "_write", "  its work, commit excluded"),
    (turn.Turn, "_refeed", "    clearing and kept clips"),
    (turn, "plan", "    choose the window"),
    (turn.Turn, "_decide_compaction", "    decide compaction"),
    (turn.Turn, "_persist", "    persist the window"),
    (turn, "window_record", "      its record"),
    (turn, "from_record", "      read it back"),
    (turn.Turn, "_cache_state", "      the cache report"),
    (turn.Turn, "_answer", "the answer (sections)"),
    (splice, "assembled", "its encoding"),
)


def timed(name: str, function: Callable) -> Callable:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _samples.setdefault(name, []).append(time.perf_counter() - started)
    return call


@contextmanager
def domain(sync: bool) -> Iterator[tuple[server_module.Services, pb_grpc.ContextSidecarStub, int]]:
    """A sidecar's domain built in this process (real LMDB in a temporary folder, o200k counting,
    the 32k budget), and a real server over it: a stub to load runs through, and its port."""
    with tempfile.TemporaryDirectory(prefix="sidecar-stages-") as tmp:
        settings = load_settings(env={}, overrides={
            ("storage", "path"): str(Path(tmp) / "lmdb"), ("server", "listen"): "127.0.0.1:0",
            ("storage", "sync"): sync, ("context", "token_counter"): "o200k_base",
            ("context", "transcript_token_budget"): BUDGET})
        services = server_module.Services.open(settings)
        server, port, health = server_module.build_server(settings, services)
        server_module.start(server, health)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            yield services, pb_grpc.ContextSidecarStub(channel), port
        finally:
            channel.close()
            server.stop(None).wait()
            services.close()


def turn_event(contents: list[str], iteration: int) -> NewEvent:
    """The one ~190-token event a turn of ``iteration`` appends."""
    return messages.new_event_from(pb.Event(event_id=f"stage-{iteration}", role="user",
                                            content=contents[iteration % len(contents)]))


def fold_one(services: server_module.Services, state: dict, appended: str, next_iteration: int) -> None:
    """A RecordSummary of the summary in force and the oldest unsummarised event, into one: the
    stack keeps its depth, and the events their number, however many turns run."""
    state["unsummarised"].append(appended)
    request = SummaryRequest(next_iteration, (state["refs"][-1], state["unsummarised"].popleft()),
                             summaries.summary_text(STACKED), "recursive")
    state["refs"][-1] = services.transcripts.record_summary("default", summaries.RUN, request)[0].ref


def serve_timed() -> None:
    """``--served``'s sidecar: the domain with its stages timed, serving until its parent says
    ``report`` on stdin (then it prints the stages' medians as JSON); ``clear`` drops what was
    timed so far (the load, the warm-up)."""
    with domain(sync=True) as (_, _, port):
        print(f"{READY}127.0.0.1:{port}", flush=True)
        for line in sys.stdin:
            if line.strip() == "clear":
                _samples.clear()
            elif line.strip() == "report":
                break
    print(json.dumps({name: [statistics.median(samples) * 1e6, len(samples)] for name, samples in _samples.items()}))


def served(turns: int, events: int) -> None:
    """Turns made through the wire on a sidecar of its own process, its stages timed there."""
    command = [sys.executable, "-m", "benchmarks.turn_stages", "--serve-timed"]
    with serving(command, READY, cwd=Path(__file__).resolve().parent.parent, told=True) as sidecar, \
            channel_to(sidecar.address) as channel:
        calls = calls_for(channel, events, corpus.contents(512, seed=7))
        for _ in range(100):  # the first 100 warm the caches and are not counted
            calls["turn"]()
        assert sidecar.process.stdin is not None and sidecar.process.stdout is not None
        sidecar.process.stdin.write("clear\n")
        sidecar.process.stdin.flush()
        host = interleaved({"bare": calls["bare"], "turn": calls["turn"]}, turns, warmup=0,
                           shuffle=random.Random(7))
        sidecar.process.stdin.write("report\n")
        sidecar.process.stdin.flush()
        stages = json.loads(sidecar.process.stdout.readline())
    print(f"{turns} turns of one event on a {events:,}-event run through the wire, 32k budget, sync on; "
          f"median µs per turn\n")
    for _, _, name in STAGES:
        if name in stages:
            print(f"{name:<46} {stages[name][0]:8.1f}  ({stages[name][1] / turns:.1f} a turn)")
    print(f"{'the turn as the host timed it':<46} {host['turn'].p50:8.1f}\n{'a bare health Check':<46} "
          f"{host['bare'].p50:8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--sync", action="store_true", help="durable commits, as served by default")
    run = parser.add_mutually_exclusive_group()
    run.add_argument("--stacked", action="store_true", help="the run with 50 summaries in force")
    run.add_argument("--served", action="store_true", help="the turns through the wire, to a sidecar process")
    parser.add_argument("--serve-timed", action="store_true", help=argparse.SUPPRESS)  # --served's sidecar
    args = parser.parse_args()
    for owner, attribute, name in STAGES:
        setattr(owner, attribute, timed(name, getattr(owner, attribute)))
    if args.serve_timed:
        return serve_timed()
    if args.served:
        return served(args.turns, args.events)
    with domain(args.sync) as (services, stub, _):
        if args.stacked:
            run_id, state = summaries.RUN, summaries.build(stub, STACKED)
            iteration = state["iteration"] - 1
        else:
            run_id, state, iteration = RUN, {}, load(stub, args.events)
        contents = corpus.contents(512, seed=7)
        whole: list[float] = []
        for number in range(args.turns + 100):  # the first 100 warm the caches and are not counted
            iteration += 1
            event = turn_event(contents, iteration)
            started = time.perf_counter()
            assembly, appended = services.transcripts.assemble("default", run_id, iteration, [event], BUDGET)
            splice.assembled(assembly, appended)
            whole.append(time.perf_counter() - started)
            if args.stacked:  # its writes are not the turn's: what the stages timed of it is dropped
                timed_before = {name: len(samples) for name, samples in _samples.items()}
                fold_one(services, state, event.event_id, iteration + 1)
                for name, samples in _samples.items():
                    del samples[timed_before.get(name, 0):]
            if number == 99:
                _samples.clear()
                whole.clear()
    shape = f"the run with {STACKED} summaries in force" if args.stacked else f"a {args.events:,}-event run"
    print(f"{args.turns} turns of one event on {shape}, 32k budget, "
          f"sync {'on' if args.sync else 'off'}; median µs per turn\n")
    print(f"{'the whole turn':<46} {statistics.median(whole) * 1e6:8.1f}")
    for _, _, name in STAGES:
        samples = _samples.get(name, [])
        if samples:
            print(f"{name:<46} {statistics.median(samples) * 1e6:8.1f}  ({len(samples) / args.turns:.1f} a turn)")


if __name__ == "__main__":
    main()
