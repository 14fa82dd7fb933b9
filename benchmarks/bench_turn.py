"""The turn, measured: AssembleContext and what it costs, one mode a question.

Every mode but ``events`` and ``commit`` times calls against a bare health Check or a baseline
measured in the same run, round by round, every call once per round in a rotating order, so the
drift of a shared (noisy) machine hits every figure alike. The sidecars are real: a process of
their own (``serve``, real LMDB, o200k counting), or the same domain built in this process where a
mode wraps its code in timers or a profiler. A turn is AssembleContext appending one ~190-token
event for a new iteration (count, one durable LMDB commit, persist the window, answer); the runs
are the corpus's (``_lib/workload.py``). The modes:

- ``latency``: the per-turn table. bare; assemble (re-assembling a persisted iteration: select,
  read, answer; nothing written) and turn at 8k and 32k budgets over runs of ``--sizes`` events;
  retokenize (what a host pays without the sidecar: tiktoken over its whole transcript each turn,
  measured in this process after the rounds). Through context_sidecar_client, as a host calls.
- ``trees``: two source trees side by side (``--before`` DIR, ``--after`` DIR, default this one;
  fastcore compiled in place in each: ``python setup.py build_ext --inplace``; an older commit's
  tree comes from ``git worktree add /tmp/before <commit>``): bare, assemble, turn, AppendEvents
  of 100, and a turn and RecordSummary on a run with 50 summaries in force. Read after / before.
- ``events``: in process, one assemble of a turn that holds N events of ~40 tokens (``--sizes``),
  all fed whole, then all clipped (a budget of half the turn's tokens); µs per event, the best of
  ``--repeat``: a column that grows with N is a step quadratic in the events of a turn.
- ``stages``: where a turn's time goes, stage by stage, each wrapped by a timer: the domain in
  this process, the ``--events`` corpus run (or ``--stacked N``: the run with N summaries in force,
  a RecordSummary folding one event in after each turn, not timed), ``--turns`` turns made on the
  domain directly (a hot loop, the floor of what Python costs; ``--sync on``: durable commits), or
  ``--served``: through the wire to the same domain serving in a process of its own (sync on), a
  bare Check beside each. Medians in µs per turn; a stage inside another is counted in both.
- ``profile``: cProfile around the servicer's method, per call kind (``--kinds``), ``--calls``
  calls each, the top ``--top`` entries by own and by cumulative time.
- ``commit``: a turn's durable commit beside one put of the same bytes: ``--turns`` turns' writes
  recorded in this process (sync off), then replayed durable into fresh environments as written,
  into one B-tree, and as one put of their bytes; ``--rounds`` rounds alternate the three ways.
- ``rendering``: a full profile (a ~2k-token system prompt, 40 tools, participants, agents,
  skills, a task, a loaded skill) at ``--budget`` over a run of ``--events`` events: the transcript
  only, its sections, rendered openai_responses and anthropic_messages, and a rendered turn.
- ``summaries``: a run with ``--stacked`` summaries in force: assemble, turn, RecordSummary
  (recursive, so the stack keeps its size); ``--sync off`` shows the sidecar's own work without
  the fsyncs; ``--before`` DIR runs a second tree side by side.
- ``observability``: a sidecar with metrics on, one with tracing on (``--otlp-endpoint``: exported
  there), one with neither: assemble and turn; read the ratios to neither.
- ``shared-store``: LMDB alone beside ``[storage] shared`` on a real PostgreSQL server: bare,
  assemble, turn, ListMemory over 1,000 entries; then the cold load of the run by new sidecars.

``--mode all`` runs every mode in turn (``--smoke`` only: the full runs are long).

    python -m benchmarks.bench_turn [--mode latency] [options] [--smoke]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, cast

import grpc
import lmdb
import psycopg
from context_sidecar_client import Client, fields
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc

from benchmarks._lib import corpus
from benchmarks._lib.harness import (
    READY,
    Samples,
    add_smoke_flag,
    channel_to,
    interleaved,
    print_table,
    serving,
    sidecar_address,
    sidecar_process,
    smoke,
    warm,
)
from benchmarks._lib.postgres import Postgres
from benchmarks._lib.workload import (
    APPENDED,
    BUDGET,
    RUN,
    STACKED_RUN,
    TOOLS,
    WARMUP,
    Calls,
    append_requests,
    bare_call,
    build_stacked,
    calls_for,
    last_iteration,
    load,
    profile,
    sidecar_flags,
    stacked_writes,
    summary_text,
    turn_request,
    writes_for,
)
from sidecar.settings import ContextSettings, load_settings
from sidecar.storage import environment, recording
from sidecar.storage.environment import Store
from sidecar.storage.keys import Txn
from sidecar.text.counting import Counters
from sidecar.text.encodings import load_encoding
from sidecar.transcript import transcripts, turn
from sidecar.transcript.log import NewEvent
from sidecar.transcript.summaries import SummaryRequest
from sidecar.transcript.transcripts import Transcripts
from sidecar.wire import messages, servicer, splice
from sidecar.wire import server as server_module

ROOT = Path(__file__).resolve().parent.parent
NEW_CONTENTS = 512  # the contents turns cycle through (corpus.contents(512, seed=7))


# What the modes share: sidecars side by side, and the domain built in this process.

@contextmanager
def side_by_side(sidecars: Mapping[str, tuple[Sequence[str], Path | None]],
                 calls_of: Callable[[str, grpc.Channel], Calls]) -> Iterator[Calls]:
    """A sidecar process per name (its flags, and the source tree it runs from: None, this one's
    installed sidecar), each with the calls ``calls_of`` makes on it, named "<sidecar> <call>"."""
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp, ExitStack() as stack:
        calls: Calls = {}
        for name, (flags, tree) in sidecars.items():
            channel = stack.enter_context(sidecar_process(Path(tmp) / name, flags, tree=tree))
            calls.update({f"{name} {kind}": call for kind, call in calls_of(name, channel).items()})
        yield calls


@contextmanager
def domain(sync: bool) -> Iterator[tuple[server_module.Services, pb_grpc.ContextSidecarStub, int]]:
    """A sidecar's domain built in this process (``serve``'s Services and server; real LMDB in a
    temporary folder, o200k counting, the 32k budget), and a real server over it: a stub to load
    runs through, and its port."""
    with tempfile.TemporaryDirectory(prefix="sidecar-in-process-") as tmp:
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
    """The one ~190-token event a turn of ``iteration`` appends, made on the domain directly."""
    return messages.new_event_from(pb.Event(event_id=f"stage-{iteration}", role="user",
                                            content=contents[iteration % len(contents)]))


def tree_of(path: Path | None) -> Path | None:
    return path.resolve() if path else None


# latency: the per-turn table.

BUDGETS = (8000, 32000)


def measure_latency(args: argparse.Namespace) -> None:
    sizes = [int(size) for size in args.sizes.split(",")]
    server_env = dict(item.split("=", 1) for item in args.server_env)
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        with sidecar_address(Path(tmp) / "lmdb", sidecar_flags(max(BUDGETS)), server_env) as address, \
                Client(address) as client, channel_to(address) as channel:
            report = latency_rounds(client, pb_grpc.ContextSidecarStub(channel), sizes, args.rounds, args.smoke)
    print_latency(report, sizes, args.markdown)


def latency_rounds(client: Client, stub: pb_grpc.ContextSidecarStub, sizes: list[int], rounds: int,
                   smoke_run: bool) -> dict:
    started = time.perf_counter()
    runs = {size: load(stub, size, run_id=f"run-{size}") for size in sizes}
    print(f"loaded {sum(sizes)} events in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    new_contents = corpus.contents(NEW_CONTENTS, seed=7)
    next_turn = {size: runs[size].last + 1 for size in sizes}
    windows: dict[tuple[int, int], pb.AssembleContextResponse] = {}

    def assemble(size: int, budget: int) -> Callable[[], pb.AssembleContextResponse]:
        # A fixed iteration per budget: re-assembling it reads and answers, and writes nothing.
        iteration = runs[size].last - (1 if budget == BUDGETS[0] else 0)
        return lambda: client.assemble_context(run_id=f"run-{size}", iteration=iteration,
                                               max_transcript_tokens=budget)

    def turn(size: int, budget: int) -> Callable[[], pb.AssembleContextResponse]:
        def call() -> pb.AssembleContextResponse:
            iteration = next_turn[size]
            next_turn[size] += 1
            event: fields.Event = {"event_id": f"turn-{budget}-{iteration}", "role": "user",
                     "content": new_contents[iteration % len(new_contents)]}
            return client.assemble_context(run_id=f"run-{size}", iteration=iteration, append_events=[event],
                                           max_transcript_tokens=budget)
        return call

    calls: dict[tuple[str, int, int], Callable[[], object]] = {("bare", 0, 0): client.check_health}
    for size in sizes:
        for budget in BUDGETS:
            calls[("assemble", size, budget)] = assemble(size, budget)
            calls[("turn", size, budget)] = turn(size, budget)
    for (kind, size, budget), call in calls.items():
        if kind == "assemble":
            windows[(size, budget)] = cast(pb.AssembleContextResponse, call())  # persists what is re-assembled
    samples = interleaved(calls, rounds)  # type: ignore[arg-type]  # keyed by tuples, not names

    encoding = load_encoding("o200k_base")
    retokenize = {}
    for size in sizes:
        texts = runs[size].texts
        retokenize[size] = Samples()
        for _ in range(1 if smoke_run else max(3, 30_000 // size)):
            begin = time.perf_counter()
            sum(len(encoding.encode_ordinary(text)) for text in texts)
            retokenize[size].seconds.append(time.perf_counter() - begin)
    return {"samples": samples, "windows": windows, "runs": runs, "retokenize": retokenize, "rounds": rounds}


def print_latency(report: dict, sizes: list[int], markdown: bool) -> None:
    samples, windows, runs, retokenize = report["samples"], report["windows"], report["runs"], report["retokenize"]
    bare = samples[("bare", 0, 0)]
    rows: list[tuple[str, str, float, float, float]] = [("bare RPC (health Check)", "", bare.p50, bare.p99, 1.0)]
    for size in sizes:
        for kind in ("assemble", "turn"):
            for budget in BUDGETS:
                s = samples[(kind, size, budget)]
                window = windows[(size, budget)]
                detail = f"{len(window.entries)} entries, {window.ByteSize() // 1024} KiB" if kind == "assemble" else ""
                rows.append((f"{kind} {budget // 1000}k @ {size // 1000}k events", detail, s.p50, s.p99,
                             s.p50 / bare.p50))
        r = retokenize[size]
        rows.append((f"retokenize baseline @ {size // 1000}k events", f"{len(r.seconds)} reps", r.p50, r.p99,
                     r.p50 / bare.p50))
    mean = sum(runs[size].mean_tokens for size in sizes) / len(sizes)
    print(f"\n{report['rounds']} interleaved rounds; events average {mean:.0f} o200k tokens; times in microseconds\n")
    if markdown:
        print_table(("call", "window", "p50 us", "p99 us", "p50 / bare p50"),
                    ((name, detail, f"{p50:,.0f}", f"{p99:,.0f}", f"{ratio:,.2f}")
                     for name, detail, p50, p99, ratio in rows))
    else:
        for name, detail, p50, p99, ratio in rows:
            print(f"{name:<34} {detail:<24} p50 {p50:>12,.0f}  p99 {p99:>12,.0f}  x{ratio:,.2f}")

    def p50_of(kind: str, size: int, budget: int) -> float:
        return float(samples[(kind, size, budget)].p50)

    print("\naims of the issue, as measured:")
    print("  assemble 32k p50 / bare p50 (aim <= 1.5): "
          + ", ".join(f"{size // 1000}k events {p50_of('assemble', size, 32000) / bare.p50:.2f}" for size in sizes))
    print("  turn 32k p50 / bare p50 (appends and commits too): "
          + ", ".join(f"{size // 1000}k events {p50_of('turn', size, 32000) / bare.p50:.2f}" for size in sizes))
    smallest, largest = min(sizes), max(sizes)
    for budget in BUDGETS:
        print(f"  assemble {budget // 1000}k p50 at {largest // 1000}k events / at {smallest // 1000}k events "
              f"(aim <= 1.1): {p50_of('assemble', largest, budget) / p50_of('assemble', smallest, budget):.2f}")
    for size in sizes:
        print(f"  retokenize p50 / assemble 32k p50 at {size // 1000}k events (aim >= 300 at 10k): "
              f"{retokenize[size].p50 / p50_of('assemble', size, 32000):,.0f}x; "
              f"/ turn 32k p50: {retokenize[size].p50 / p50_of('turn', size, 32000):,.0f}x")


# trees: two source trees side by side.

TREE_KINDS = ("bare", "assemble", "turn", "append 100", "stacked turn", "record")


def measure_trees(args: argparse.Namespace) -> None:
    trees = {"before": args.before, "after": args.after}
    new_contents = corpus.contents(NEW_CONTENTS, seed=7)
    with side_by_side({name: (sidecar_flags(), tree_of(tree)) for name, tree in trees.items()},
                      lambda _, channel: {**calls_for(channel, args.events, new_contents),
                                          **writes_for(channel, args.rounds)}) as calls:
        samples = interleaved(calls, args.rounds, WARMUP)
    print(f"\n{args.rounds} interleaved rounds, {args.events:,} events, {BUDGET // 1000}k budget; "
          f"before {args.before}, after {args.after}\n")
    print_table(("call", "before p50 us", "after p50 us", "after / before"),
                ((kind, f"{samples[f'before {kind}'].p50:,.0f}", f"{samples[f'after {kind}'].p50:,.0f}",
                  f"{samples[f'after {kind}'].p50 / samples[f'before {kind}'].p50:.2f}") for kind in TREE_KINDS))


# events: one turn that holds N events, in process.

TENANT = "bench"
WORDS_PER_EVENT = 40
MAX_BUDGET = 2**31 - 1


def turn_events(count: int) -> list[NewEvent]:
    rng = random.Random(count)
    return [NewEvent(f"e{i}", 1, "user" if i % 2 else "assistant", "message",
                     " ".join(rng.choice(corpus._WORDS) for _ in range(WORDS_PER_EVENT))) for i in range(count)]


def seconds_per_event(counters: Counters, events: list[NewEvent], budget: int | None, folder: Path) -> float:
    """One assemble of ``events`` as a new run's turn 1; ``budget`` None: one the turn fits."""
    store = Store(str(folder), map_size=4 << 30, sync=False)
    try:
        # The per-call caps are lifted: this measures the work per event, not the caps.
        domain_transcripts = Transcripts(store, counters, ContextSettings(
            transcript_token_budget=MAX_BUDGET, model_window_tokens=MAX_BUDGET,
            max_request_events=len(events), max_request_bytes=sum(len(e.content.encode()) for e in events)))
        if budget is not None:
            domain_transcripts.open_run(TENANT, "run", token_counter="o200k_base", transcript_token_budget=budget)
        started = time.perf_counter()
        assembled, _ = domain_transcripts.assemble(TENANT, "run", 1, events)
        elapsed = time.perf_counter() - started
        window = assembled.window
        assert len(window.event_ids) == len(events), "the whole turn is fed"
        assert bool(window.clips) == (budget is not None), "clipped exactly when the budget asks for it"
        return elapsed / len(events)
    finally:
        store.close()


def measure_events(args: argparse.Namespace) -> None:
    counters = Counters()
    count = counters.get("o200k_base").count
    print(f"{'events':>8} {'tokens':>10} {'whole us/event':>15} {'clipped us/event':>17}")
    with tempfile.TemporaryDirectory() as scratch:
        for n in (int(size) for size in args.sizes.split(",")):
            events = turn_events(n)
            tokens = sum(count(e.content) for e in events)
            best: dict[str, float] = {}
            for attempt in range(args.repeat):
                for kind, budget in (("whole", None), ("clipped", tokens // 2)):
                    spent = seconds_per_event(counters, events, budget, Path(scratch) / f"{n}-{kind}-{attempt}")
                    best[kind] = min(best.get(kind, spent), spent)
            print(f"{n:>8} {tokens:>10} {best['whole'] * 1e6:>15.1f} {best['clipped'] * 1e6:>17.1f}", flush=True)


# stages: where a turn's time goes.

_stage_samples: dict[str, list[float]] = {}

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
STAGE_WARMUP = 100  # turns that warm the caches and are not counted


def timed(name: str, function: Callable) -> Callable:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _stage_samples.setdefault(name, []).append(time.perf_counter() - started)
    return call


def fold_one(services: server_module.Services, state: dict, appended: str, next_iteration: int,
             stacked: int) -> None:
    """A RecordSummary of the summary in force and the oldest unsummarised event, into one: the
    stack keeps its depth, and the events their number, however many turns run."""
    state["unsummarised"].append(appended)
    request = SummaryRequest(next_iteration, (state["refs"][-1], state["unsummarised"].popleft()),
                             summary_text(stacked), "recursive")
    state["refs"][-1] = services.transcripts.record_summary("default", STACKED_RUN, request)[0].ref


def serve_timed() -> None:
    """``--served``'s sidecar: the domain with its stages timed, serving until its parent says
    ``report`` on stdin (then it prints the stages' medians as JSON); ``clear`` drops what was
    timed so far (the load, the warm-up)."""
    with domain(sync=True) as (_, _, port):
        print(f"{READY}127.0.0.1:{port}", flush=True)
        for line in sys.stdin:
            if line.strip() == "clear":
                _stage_samples.clear()
            elif line.strip() == "report":
                break
    print(json.dumps({name: [statistics.median(samples) * 1e6, len(samples)]
                      for name, samples in _stage_samples.items()}))


def served_stages(turns: int, events: int) -> None:
    """Turns made through the wire on a sidecar of its own process, its stages timed there."""
    command = [sys.executable, "-m", "benchmarks.bench_turn", "--mode", "stages", "--serve-timed"]
    with serving(command, READY, cwd=ROOT, told=True) as sidecar, channel_to(sidecar.address) as channel:
        calls = calls_for(channel, events, corpus.contents(NEW_CONTENTS, seed=7))
        for _ in range(warm(STAGE_WARMUP)):
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


def measure_stages(args: argparse.Namespace) -> None:
    for owner, attribute, name in STAGES:
        setattr(owner, attribute, timed(name, getattr(owner, attribute)))
    if args.serve_timed:
        return serve_timed()
    if args.served:
        return served_stages(args.turns, args.events)
    warmup = warm(STAGE_WARMUP)
    with domain(args.sync == "on") as (services, stub, _):
        if args.stacked:
            run_id, state = STACKED_RUN, build_stacked(stub, args.stacked)
            iteration = state["iteration"] - 1
        else:
            run_id, state, iteration = RUN, {}, load(stub, args.events).last
        contents = corpus.contents(NEW_CONTENTS, seed=7)
        whole: list[float] = []
        for number in range(args.turns + warmup):
            iteration += 1
            event = turn_event(contents, iteration)
            started = time.perf_counter()
            assembly, appended = services.transcripts.assemble("default", run_id, iteration, [event], BUDGET)
            splice.assembled(assembly, appended)
            whole.append(time.perf_counter() - started)
            if args.stacked:  # its writes are not the turn's: what the stages timed of it is dropped
                timed_before = {name: len(samples) for name, samples in _stage_samples.items()}
                fold_one(services, state, event.event_id, iteration + 1, args.stacked)
                for name, samples in _stage_samples.items():
                    del samples[timed_before.get(name, 0):]
            if number == warmup - 1:
                _stage_samples.clear()
                whole.clear()
    shape = f"the run with {args.stacked} summaries in force" if args.stacked else f"a {args.events:,}-event run"
    print(f"{args.turns} turns of one event on {shape}, 32k budget, sync {args.sync}; median µs per turn\n")
    print(f"{'the whole turn':<46} {statistics.median(whole) * 1e6:8.1f}")
    for _, _, name in STAGES:
        samples = _stage_samples.get(name, [])
        if samples:
            print(f"{name:<46} {statistics.median(samples) * 1e6:8.1f}  ({len(samples) / args.turns:.1f} a turn)")


# profile: cProfile around the servicer's method, per call kind.

PROFILE_KINDS = ("assemble", "turn", "assemble 50 summaries", "record", "append 100")
# The kind being profiled: (its RPC, the profile collecting its calls); other calls run unprofiled.
RPC_OF = {"assemble": "AssembleContext", "turn": "AssembleContext", "assemble 50 summaries": "AssembleContext",
          "record": "RecordSummary", "append 100": "AppendEvents"}
_profiling: dict[str, cProfile.Profile] = {}


def profiled(method: Callable) -> Callable:
    @functools.wraps(method)
    def call(self: servicer.ContextSidecarServicer, request: object, context: grpc.ServicerContext) -> object:
        profile_now = _profiling.get(method.__name__)
        if profile_now is None:
            return method(self, request, context)
        profile_now.enable()
        try:
            return method(self, request, context)
        finally:
            profile_now.disable()
    return call


def profiled_call(kind: str, channel: grpc.Channel, made: Calls, events: int, calls: int) -> Callable[[], object]:
    """The call of ``kind``; the runs it needs are loaded once, on the first kind that asks."""
    stub = pb_grpc.ContextSidecarStub(channel)
    contents = corpus.contents(NEW_CONTENTS, seed=7)
    if kind in ("assemble", "turn") and "assemble" not in made:
        made.update(calls_for(channel, events, contents))
    if kind in ("assemble 50 summaries", "record") and "record" not in made:
        state = build_stacked(stub, 50)
        writes = stacked_writes(stub, state, contents)
        pinned = pb.AssembleContextRequest(run_id=STACKED_RUN, iteration=state["iteration"] - 1)
        made["assemble 50 summaries"] = lambda: stub.AssembleContext(pinned)
        # A new turn first, unprofiled, so there is always an event to fold in.
        made["record"] = lambda: (writes["turn"](), writes["record"]())
    if kind == "append 100":
        appends = append_requests(corpus.contents(APPENDED, seed=13), WARMUP + calls)
        made[kind] = lambda: stub.AppendEvents(next(appends))
    if kind not in made:
        raise SystemExit(f"unknown kind {kind!r}: one of {', '.join(PROFILE_KINDS)}")
    return made[kind]


def measure_profile(args: argparse.Namespace) -> None:
    for name in set(RPC_OF.values()):
        setattr(servicer.ContextSidecarServicer, name, profiled(getattr(servicer.ContextSidecarServicer, name)))
    # Sync on, as served; summarization off but for the run that asks for it.
    with domain(sync=True) as (_, _, port), channel_to(f"127.0.0.1:{port}") as channel:
        made: Calls = {}
        for kind in args.kinds.split(","):
            call = profiled_call(kind, channel, made, args.events, args.calls)
            for _ in range(warm(WARMUP)):
                call()
            _profiling[RPC_OF[kind]] = profile_now = cProfile.Profile()
            for _ in range(args.calls):
                call()
            _profiling.clear()
            print_profile(kind, profile_now, args.calls, args.top)


def print_profile(kind: str, profile_now: cProfile.Profile, calls: int, top: int) -> None:
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(profile_now, stream=out).strip_dirs().sort_stats(order)
        stats.print_stats(top)
        body = out.getvalue()
        body = body[body.index("   ncalls"):] if "   ncalls" in body else body
        total = stats.total_tt  # type: ignore[attr-defined]  # pstats keeps it, its stubs do not say so
        print(f"\n## {kind}: {calls} calls, top {top} by {order} (total {total * 1e6 / calls:,.0f} µs "
              f"a call inside the servicer)\n{body}")


# commit: a turn's durable commit beside one put of the same bytes.

Write = tuple[str, bytes, bytes | None]  # database, key, value (None: deleted)
WAYS = ("as written", "one B-tree", "one put")


@contextmanager
def recorded(transactions: list[list[Write]]) -> Iterator[None]:
    """Every write transaction of the store, its writes appended to ``transactions`` once committed."""
    write_local = environment.Store._write_local

    def recording_write(store: environment.Store, work: Callable, ceiling: int, then: Callable | None = None) -> object:
        writes: list[Write] = []

        def work_recorded(txn: lmdb.Transaction) -> object:
            through = recording.RecordingTxn(cast(Txn, txn), store._names)
            result = work(through)
            writes[:] = [(db, key, value) for records in through.changes().values() for db, key, value in records]
            return result

        result = write_local(store, work_recorded, ceiling, then)
        transactions.append(writes)
        return result

    environment.Store._write_local = recording_write  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        environment.Store._write_local = write_local  # type: ignore[method-assign]


def record_turns(turns: int, events: int) -> tuple[list[list[Write]], list[list[Write]]]:
    """The transactions that load the run, and those of ``turns`` turns on it."""
    transactions: list[list[Write]] = []
    with domain(sync=False) as (services, stub, _), recorded(transactions):
        last = load(stub, events).last
        loaded = len(transactions)
        contents = corpus.contents(NEW_CONTENTS, seed=7)
        for iteration in range(last + 1, last + 1 + turns):
            services.transcripts.assemble("default", RUN, iteration, [turn_event(contents, iteration)], BUDGET)
    return transactions[:loaded], transactions[loaded:]


def replayed(way: str, loading: list[list[Write]], turns: list[list[Write]]) -> float:
    """The median durable commit of ``turns`` replayed ``way``, after ``loading``, in µs."""
    names = sorted({db for writes in loading + turns for db, _, _ in writes})
    commits: list[float] = []
    with tempfile.TemporaryDirectory(prefix="sidecar-turn-commit-") as path:
        for durable in (False, True):  # the loading not durable (not timed), the turns durable
            env = lmdb.open(path, map_size=8 << 30, max_dbs=len(names) + 1, sync=durable, metasync=durable)
            databases = {name: env.open_db(name.encode()) for name in names}
            one = env.open_db(b"one")
            for number, writes in enumerate(turns if durable else loading):
                txn = env.begin(write=True)
                if durable and way == "one put":
                    payload = sum(len(key) + len(value or b"") for _, key, value in writes)
                    txn.put(b"floor-%08d" % number, b"x" * payload, db=one)
                else:
                    for db, key, value in writes:
                        into, key = (databases[db], key) if way == "as written" else (one, db.encode() + b"\0" + key)
                        if value is None:
                            txn.delete(key, db=into)
                        else:
                            txn.put(key, value, db=into)
                started = time.perf_counter()
                txn.commit()
                if durable:
                    commits.append(time.perf_counter() - started)
            env.close()
    return statistics.median(commits) * 1e6


def measure_commit(args: argparse.Namespace) -> None:
    loading, turns = record_turns(args.turns, args.events)
    written = sorted(len(writes) for writes in turns)
    databases = sorted(len({db for db, _, _ in writes}) for writes in turns)
    payload = sorted(sum(len(key) + len(value or b"") for _, key, value in writes) for writes in turns)
    figures: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            figures[way].append(replayed(way, loading, turns))
    print(f"{args.turns} turns of one event on a {args.events:,}-event run, each replayed as one durable commit; "
          f"a turn writes (median) {statistics.median(written):.0f} records into "
          f"{statistics.median(databases):.0f} databases, {statistics.median(payload):,.0f} bytes of keys and values\n")
    print(f"{'commit':<14} {'median µs':>10}  {'/ one put':>9}   rounds")
    floor = statistics.median(figures["one put"])
    for way in WAYS:
        median = statistics.median(figures[way])
        print(f"{way:<14} {median:10.0f}  {median / floor:9.2f}   {' '.join(f'{x:.0f}' for x in figures[way])}")


# rendering: a full profile and the providers' renderings.

def rendering_events(events: int) -> list[pb.Event]:
    return [pb.Event(event_id=e.event_id, iteration=e.iteration, role=e.role, type=e.type, content=e.content,
                     call_id=e.call_id, tool_name="tool_00" if e.type == "tool_call" else "")
            for e in corpus.events(events, seed=5)]


def measure_rendering(args: argparse.Namespace) -> None:
    rounds, budget = args.rounds, args.budget
    rng = random.Random(9)
    full_profile = profile(rng)
    task = pb.Task(task_id="bench-task", goal=corpus.prose(rng)[:300], acceptance_criteria=["cited", "tested"],
                   plan="\n".join(f"{i}. {corpus.prose(rng)[:100]}" for i in range(1, 8)))
    log = rendering_events(args.events)
    last = last_iteration(args.events)
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        with sidecar_process(Path(tmp) / "lmdb", sidecar_flags(budget)) as channel:
            stub = pb_grpc.ContextSidecarStub(channel)
            stub.OpenRun(pb.OpenRunRequest(run_id="plain"))
            stub.OpenRun(pb.OpenRunRequest(run_id="full", profile=full_profile, task=task))
            stub.LoadSkill(pb.LoadSkillRequest(run_id="full", skill=pb.LoadedSkill(
                name="skill-0", body="\n".join(corpus.prose(rng) for _ in range(2)))))
            for run in ("plain", "full"):
                for first in range(0, len(log), 400):
                    stub.AppendEvents(pb.AppendEventsRequest(run_id=run, events=log[first:first + 400]))
                stub.AssembleContext(pb.AssembleContextRequest(run_id=run, iteration=last))
            next_turn = [last + 1]
            new_contents = corpus.contents(rounds + 64, seed=13)

            def rendered_turn() -> None:
                request = turn_request_rendered(next_turn[0], new_contents)
                stub.AssembleContext(request)
                next_turn[0] += 1

            def assemble(run: str, render: str = "") -> Callable[[], object]:
                request = pb.AssembleContextRequest(run_id=run, iteration=last, render=render)
                return lambda: stub.AssembleContext(request)

            shown = stub.AssembleContext(pb.AssembleContextRequest(run_id="full", iteration=last))
            rendered = stub.AssembleContext(pb.AssembleContextRequest(run_id="full", iteration=last,
                                                                      render="openai_responses"))
            calls = {"bare": bare_call(channel), "plain": assemble("plain"), "sections": assemble("full"),
                     "openai": assemble("full", "openai_responses"),
                     "anthropic": assemble("full", "anthropic_messages"), "turn": rendered_turn}
            samples = interleaved(calls, rounds)

    static = sum(s.tokens for s in shown.sections if s.stability == "static")
    print(f"\n{rounds} interleaved rounds; transcript budget {budget}; window of iteration {last}: "
          f"{len(shown.entries)} entries, {shown.token_count} transcript tokens, {shown.window_tokens} in all "
          f"({static} in static sections, {shown.tools_tokens} in {TOOLS} tools); "
          f"openai body {len(rendered.rendered.encode()) // 1024} KiB\n")
    bare, plain = samples["bare"].p50, samples["plain"].p50
    labels = [("bare", "bare RPC (health Check)"), ("plain", "AssembleContext, transcript only (no profile)"),
              ("sections", "AssembleContext, full profile: sections"),
              ("openai", "... rendered openai_responses"), ("anthropic", "... rendered anthropic_messages"),
              ("turn", "turn: append + persist + openai_responses")]
    print_table(("call", "p50 us", "p99 us", "p50 / bare", "p50 / transcript only"),
                ((label, f"{samples[name].p50:,.0f}", f"{samples[name].p99:,.0f}", f"{samples[name].p50 / bare:.2f}",
                  f"{samples[name].p50 / plain:.2f}") for name, label in labels))


def turn_request_rendered(iteration: int, new_contents: list[str]) -> pb.AssembleContextRequest:
    """The full run's turn, rendered openai_responses, at the run's own budget."""
    request = turn_request("full", iteration, new_contents[iteration % len(new_contents)], budget=None,
                           event_id=f"t{iteration}")
    request.render = "openai_responses"
    return request


# summaries: a run with summaries stacked.

SUMMARY_KINDS = ("bare", "assemble", "turn", "record")


class Stacked:
    """The stacked run built on one sidecar, and the calls the rounds time there."""

    def __init__(self, channel: grpc.Channel, stacked: int, new_contents: list[str]) -> None:
        self.stub = pb_grpc.ContextSidecarStub(channel)
        self.bare = bare_call(channel)
        self.state = build_stacked(self.stub, stacked)
        self.writes = stacked_writes(self.stub, self.state, new_contents)
        # Re-assembling this iteration reads a window with every summary in force.
        self.pinned = self.state["iteration"] - 1
        self.window = self.assemble(self.pinned)

    def assemble(self, iteration: int) -> pb.AssembleContextResponse:
        return self.stub.AssembleContext(pb.AssembleContextRequest(run_id=STACKED_RUN, iteration=iteration))

    def calls(self) -> Calls:
        return {"bare": self.bare, "assemble": lambda: self.assemble(self.pinned), **self.writes}

    def shape(self) -> str:
        """What the pinned window holds, and how many summaries the newest one still has."""
        in_window = summaries_in(self.window)
        still = summaries_in(self.assemble(self.state["iteration"] - 1))
        return (f"{in_window} summaries in the re-assembled window ({len(self.window.entries)} entries, "
                f"{self.window.token_count} tokens); {still} at the end of the rounds")


def summaries_in(window: pb.AssembleContextResponse) -> int:
    return sum(1 for entry in window.entries if entry.type == "context.summary")


def measure_summaries(args: argparse.Namespace) -> None:
    """Every kind of call on one sidecar per tree (one: the installed sidecar), in the same rounds."""
    rounds, stacked = args.rounds, args.stacked
    flags = ["--no-sync"] if args.sync == "off" else []
    trees = {"before": tree_of(args.before), "after": tree_of(args.after)} if args.before else {"sidecar": None}
    new_contents = corpus.contents(rounds + 64, seed=11)
    workloads: dict[str, Stacked] = {}

    def stacked_on(name: str, channel: grpc.Channel) -> Calls:
        workloads[name] = Stacked(channel, stacked, new_contents)
        return workloads[name].calls()

    sidecars = {name: ([*sidecar_flags(), "--summarization", *flags], tree) for name, tree in trees.items()}
    with side_by_side(sidecars, stacked_on) as calls:
        samples = interleaved(calls, rounds)
        shapes = {name: workload.shape() for name, workload in workloads.items()}

    print(f"\nsidecar flags: {' '.join(flags) or '(defaults: sync on)'}; {rounds} interleaved rounds")
    for name, tree in trees.items():
        print(f"{name}{f' ({tree})' if tree else ''}: {shapes[name]}")
    labels = {"bare": "bare RPC (health Check)", "assemble": f"AssembleContext, {stacked} summaries (read)",
              "turn": "AssembleContext, append + persist (turn)", "record": "RecordSummary (recursive)"}

    def to_bare(tree: str, kind: str) -> float:
        return float(samples[f"{tree} {kind}"].p50 / samples[f"{tree} bare"].p50)

    print()
    if len(trees) == 1:
        print_table(("call", "p50 us", "p99 us", "p50 / bare p50"),
                    ((labels[kind], f"{samples[f'sidecar {kind}'].p50:,.0f}", f"{samples[f'sidecar {kind}'].p99:,.0f}",
                      f"{to_bare('sidecar', kind):.2f}") for kind in SUMMARY_KINDS))
        return
    print_table(("call", "before p50 us", "before / bare", "after p50 us", "after / bare", "after / before"),
                ((labels[kind], f"{samples[f'before {kind}'].p50:,.0f}", f"{to_bare('before', kind):.2f}",
                  f"{samples[f'after {kind}'].p50:,.0f}", f"{to_bare('after', kind):.2f}",
                  f"{samples[f'after {kind}'].p50 / samples[f'before {kind}'].p50:.2f}") for kind in SUMMARY_KINDS))


# observability: metrics and tracing on, against neither.

def measure_observability(args: argparse.Namespace) -> None:
    tracing = ["--tracing", *(["--otlp-endpoint", args.otlp_endpoint] if args.otlp_endpoint else [])]
    kinds: dict[str, list[str]] = {"neither": [], "metrics": ["--metrics-listen", "127.0.0.1:0"], "tracing": tracing}
    new_contents = corpus.contents(NEW_CONTENTS, seed=7)

    def watched(_: str, channel: grpc.Channel) -> Calls:
        return {kind: call for kind, call in calls_for(channel, args.events, new_contents).items() if kind != "bare"}

    with side_by_side({name: ([*sidecar_flags(), *flags], None) for name, flags in kinds.items()}, watched) as calls:
        samples = interleaved(calls, args.rounds)
    print(f"\n{args.rounds} interleaved rounds, {args.events:,} events, {BUDGET // 1000}k budget; p50 us\n")

    def row(kind: str) -> tuple[str, ...]:
        p50 = {name: samples[f"{name} {kind}"].p50 for name in kinds}
        return (kind, f"{p50['neither']:,.0f}", f"{p50['metrics']:,.0f}", f"{p50['tracing']:,.0f}",
                f"{p50['metrics'] / p50['neither']:.3f}", f"{p50['tracing'] / p50['neither']:.3f}")

    print_table(("call", "neither", "metrics on", "tracing on", "metrics / neither", "tracing / neither"),
                (row(kind) for kind in ("assemble", "turn")))


# shared-store: [storage] shared on PostgreSQL, against LMDB alone.

MEMORY_ENTRIES = 1_000


def memory_call(channel: grpc.Channel, entries: int) -> Callable[[], object]:
    stub = pb_grpc.ContextSidecarStub(channel)
    for index, content in enumerate(corpus.contents(entries, seed=11)):
        stub.PutMemory(pb.PutMemoryRequest(memory_ref="team", entry_id=f"m{index}", content=content[:400]))
    request = pb.ListMemoryRequest(memory_ref="team", limit=20)
    return lambda: stub.ListMemory(request)


def measure_shared_store(args: argparse.Namespace) -> None:
    new_contents = corpus.contents(NEW_CONTENTS, seed=7)
    entries = 20 if args.smoke else MEMORY_ENTRIES

    def with_memory(_: str, channel: grpc.Channel) -> Calls:
        return {**calls_for(channel, args.events, new_contents), "list memory": memory_call(channel, entries)}

    postgres = Postgres()
    try:
        url = postgres.database()
        shared_flags = [*sidecar_flags(), "--shared", url]
        with side_by_side({"lmdb": (sidecar_flags(), None), "shared": (shared_flags, None)}, with_memory) as calls:
            samples = interleaved(calls, args.rounds)
        read = pb.AssembleContextRequest(run_id=RUN, iteration=last_iteration(args.events),
                                         max_transcript_tokens=BUDGET)
        cold: list[float] = []
        warm_loads: list[float] = []
        with tempfile.TemporaryDirectory(prefix="sidecar-shared-") as tmp:
            for index in range(args.cold):
                with sidecar_process(Path(tmp) / f"cold{index}", shared_flags) as channel:
                    stub = pb_grpc.ContextSidecarStub(channel)
                    for times in (cold, warm_loads):
                        begin = time.perf_counter()
                        stub.AssembleContext(read)
                        times.append(time.perf_counter() - begin)
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT count(*), sum(length(value)) FROM context_sidecar_records "
                                "WHERE unit = %s", (b"rdefault\0" + RUN.encode() + b"\0",)).fetchone()
            assert rows is not None
    finally:
        postgres.close()
    print(f"\n{args.rounds} interleaved rounds, {args.events:,} events, {BUDGET // 1000}k budget, "
          f"{entries:,} memory entries; p50 us\n")
    bare = samples["shared bare"].p50

    def row(kind: str) -> tuple[str, ...]:
        alone, shared = samples[f"lmdb {kind}"].p50, samples[f"shared {kind}"].p50
        return (kind, f"{alone:,.0f}", f"{shared:,.0f}", f"{shared / alone:.2f}", f"{shared / bare:.2f}")

    print_table(("call", "LMDB alone", "shared store", "shared / LMDB alone", "shared / bare"),
                (row(kind) for kind in ("bare", "assemble", "turn", "list memory")))
    cold_ms, warm_ms = sorted(cold)[len(cold) // 2] * 1e3, sorted(warm_loads)[len(warm_loads) // 2] * 1e3
    print(f"\ncold load of the {args.events:,}-event run ({rows[0]:,} records, {rows[1] / 1e6:.1f} MB in PostgreSQL): "
          f"first AssembleContext {cold_ms:,.0f} ms, the next {warm_ms:,.1f} ms (median of {args.cold})")


# The modes: what each measures, the options it takes with their defaults, and its tiny sizes.

class Mode:
    def __init__(self, measure: Callable[[argparse.Namespace], None], defaults: dict[str, Any],
                 tiny: dict[str, Any]) -> None:
        self.measure, self.defaults, self.tiny = measure, defaults, tiny


MODES = {
    "latency": Mode(measure_latency, {"sizes": "1000,10000,100000", "rounds": 300, "server_env": [],
                                      "markdown": False}, {"sizes": "100,200", "rounds": 1}),
    "trees": Mode(measure_trees, {"before": None, "after": ROOT, "events": 10_000, "rounds": 300},
                  {"before": ROOT, "events": 200, "rounds": 1}),
    "events": Mode(measure_events, {"sizes": "1000,4000,16000,64000", "repeat": 3}, {"sizes": "50,100", "repeat": 1}),
    "stages": Mode(measure_stages, {"turns": 1000, "events": 10_000, "sync": "off", "stacked": 0, "served": False,
                                    "serve_timed": False}, {"turns": 2, "events": 200}),
    "profile": Mode(measure_profile, {"calls": 300, "top": 15, "events": 10_000, "kinds": ",".join(PROFILE_KINDS)},
                    {"calls": 2, "top": 3, "events": 200}),
    "commit": Mode(measure_commit, {"turns": 300, "rounds": 3, "events": 10_000},
                   {"turns": 2, "rounds": 1, "events": 200}),
    "rendering": Mode(measure_rendering, {"rounds": 300, "budget": 8000, "events": 240}, {"rounds": 1, "events": 40}),
    "summaries": Mode(measure_summaries, {"rounds": 300, "stacked": 50, "sync": "on", "before": None, "after": ROOT},
                      {"rounds": 1, "stacked": 3}),
    "observability": Mode(measure_observability, {"events": 10_000, "rounds": 400, "otlp_endpoint": ""},
                          {"events": 200, "rounds": 1}),
    "shared-store": Mode(measure_shared_store, {"events": 10_000, "rounds": 300, "cold": 3},
                         {"events": 200, "rounds": 1, "cold": 1}),
}
OPTIONS = sorted({name for mode in MODES.values() for name in mode.defaults})


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    made.add_argument("--mode", choices=[*MODES, "all"], default="latency", help="what to measure (default latency)")
    # Every option's default is its mode's (MODES); an option the mode does not take is refused.
    made.add_argument("--rounds", type=int, help="interleaved rounds of every call (commit: rounds of replays)")
    made.add_argument("--events", type=int, help="events in the run (default 10,000; rendering 240)")
    made.add_argument("--sizes", help="latency: events per run; events: events in the turn (comma-separated)")
    made.add_argument("--turns", type=int, help="stages, commit: turns made")
    made.add_argument("--repeat", type=int, help="events: runs per size; the best is shown")
    made.add_argument("--budget", type=int, help="rendering: the transcript token budget")
    made.add_argument("--sync", choices=("on", "off"), help="stages (default off), summaries (default on): "
                      "durable commits")
    made.add_argument("--stacked", type=int, help="summaries in force (summaries: 50; stages: 0, the corpus run)")
    made.add_argument("--served", action="store_true", default=None, help="stages: the turns through the wire")
    made.add_argument("--serve-timed", action="store_true", default=None, help=argparse.SUPPRESS)  # --served's sidecar
    made.add_argument("--before", type=Path, help="trees, summaries: the tree to compare against")
    made.add_argument("--after", type=Path, help="trees, summaries: the changed tree (default this one)")
    made.add_argument("--calls", type=int, help="profile: calls of each kind, profiled")
    made.add_argument("--top", type=int, help="profile: entries printed per kind and order")
    made.add_argument("--kinds", help=f"profile: of {','.join(PROFILE_KINDS)}")
    made.add_argument("--server-env", action="append", metavar="NAME=VALUE",
                      help="latency: environment for the sidecar process (e.g. MALLOC_MMAP_THRESHOLD_=...)")
    made.add_argument("--markdown", action="store_true", default=None, help="latency: print the table as Markdown")
    made.add_argument("--otlp-endpoint", help="observability: export the traced sidecar's spans here")
    made.add_argument("--cold", type=int, help="shared-store: sidecars timed on their cold load of the run")
    add_smoke_flag(made)
    return made


def arguments_for(mode_name: str, given: argparse.Namespace, made: argparse.ArgumentParser) -> argparse.Namespace:
    """The mode's arguments: those given, else its tiny sizes under --smoke, else its defaults."""
    mode = MODES[mode_name]
    foreign = [name for name in OPTIONS if getattr(given, name) is not None and name not in mode.defaults]
    if foreign:
        made.error(f"--mode {mode_name} takes none of: " + ", ".join("--" + name.replace("_", "-") for name in foreign))
    args = argparse.Namespace(mode=mode_name, smoke=given.smoke)
    for name, default in mode.defaults.items():
        setattr(args, name, getattr(given, name) if getattr(given, name) is not None else default)
    smoke(args, **{name: value for name, value in mode.tiny.items() if getattr(given, name) is None})
    if mode_name == "trees" and args.before is None:
        made.error("--mode trees needs --before DIR")
    return args


# ``--mode all --smoke``: every mode, and the variants of stages, each in a process of its own (stages,
# profile and commit wrap the sidecar's classes in this process).
SMOKE_RUNS = [*([name] for name in MODES), ["stages", "--served"], ["stages", "--stacked", "3"]]


def smoke_all() -> None:
    failed = []
    for run in SMOKE_RUNS:
        command = [sys.executable, "-m", "benchmarks.bench_turn", "--mode", *run, "--smoke"]
        print(f"\n# {' '.join(command[2:])}", flush=True)
        started = time.perf_counter()
        if subprocess.run(command, cwd=ROOT).returncode:
            failed.append(" ".join(run))
        print(f"# {time.perf_counter() - started:.1f} s", flush=True)
    if failed:
        raise SystemExit(f"failed: {'; '.join(failed)}")


def main() -> None:
    made = parser()
    given = made.parse_args()
    if given.mode == "all":
        if not given.smoke or any(getattr(given, name) is not None for name in OPTIONS):
            made.error("--mode all runs every mode with its tiny sizes: --smoke, and no other option")
        return smoke_all()
    MODES[given.mode].measure(arguments_for(given.mode, given, made))


if __name__ == "__main__":
    main()
