"""Sync vs grpc.aio servers on the per-turn path: measure, then pick on the numbers.

Three server kinds, each a real server in its own subprocess over its own temporary LMDB
folder, all serving the same domain code (sidecar.wire.servicer over sidecar.transcript.transcripts):

  sync            what production runs: ``sidecar.server.build_server`` + ``start``, i.e.
                  ``grpc.server(ThreadPoolExecutor)``.
  aio-inline      ``grpc.aio.server``; every handler is an ``async def`` that calls the same
                  synchronous servicer method directly on the event loop.
  aio-threadpool  ``grpc.aio.server(migration_thread_pool=ThreadPoolExecutor(...))`` with the sync
                  handlers registered unchanged: grpc runs them in that pool.

The client (this process, one channel per server, one call in flight at a time) loads the same
deterministic run into each server, then times three calls, p50 and p99 in microseconds:

  bare   grpc.health.v1.Health/Check: the RPC machinery alone.
  read   AssembleContext re-assembling an already-assembled iteration of the N-event run at a
         32000-token budget: the window is persisted and unchanged, so nothing is written.
  write  a per-turn AssembleContext appending one new ~200-token event for a new iteration:
         tokenizing, a durable LMDB commit (sync = true, the default), persisting the window.

Rounds are interleaved (every round calls every server kind and call type once, in a rotating
order) so that the drift of a shared, noisy machine hits every kind alike; only medians and p99
are reported, never means. Each kind's p50 is also given as a ratio to the sync server's p50 for
the same call, with a 95% interval bootstrapped over rounds.

Run from the repository root, with the project's virtualenv active (the events are
``benchmarks._lib.corpus``'s, as in bench_turn):

    python -m benchmarks.bench_server_kinds [--events 10000] [--rounds 400]

(``--serve KIND --storage DIR`` is the subprocess entry: it runs one server and prints
``context-sidecar serving on HOST:PORT`` when ready.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from benchmarks._lib import corpus
from benchmarks._lib.harness import add_smoke_flag, smoke
from sidecar.settings import ContextSettings, ServerSettings, Settings, StorageSettings
from sidecar.wire.server import SERVICE_NAME, Services, bound_address, build_server, servicer_for, start
from sidecar.wire.servicer import add_servicer_to_server

KINDS = ("sync", "aio-inline", "aio-threadpool")
CALLS = ("bare", "read", "write")
READY = "context-sidecar serving on "
RUN_ID = "bench-run"
BUDGET = 32000
BATCH = 500  # events per AppendEvents while loading


# -- the servers (subprocess side) -------------------------------------------------------------

def server_settings(storage: str) -> Settings:
    """Production defaults (durable commits, 8 workers, 32000-token budget, o200k_base) on a
    free loopback port and a private folder."""
    return Settings(server=ServerSettings(listen="127.0.0.1:0"), storage=StorageSettings(path=storage),
                    context=ContextSettings())


def announce(settings: Settings, port: int) -> None:
    # The one stdout line the benchmark waits for; it names the port chosen for :0.
    print(f"{READY}{bound_address(settings.server.listen, port)}", flush=True)


def serve_sync(settings: Settings, services: Services) -> None:
    """Exactly what production builds, stopped on SIGTERM."""
    server, port, health_servicer = build_server(settings, services)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    start(server, health_servicer)
    announce(settings, port)
    stopping.wait()
    server.stop(0).wait()


def on_the_loop(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Awaitable[Any]]:
    """``add_servicer_to_server``'s wrap hook for aio-inline: a coroutine handler (so grpc.aio
    calls it on the event loop, not in a pool) that runs the synchronous domain call inline.

    The servicer's error wrapper (sidecar.status.answers_errors) calls
    ``context.abort_with_status`` synchronously, which under aio returns a coroutine nobody
    awaits: errors would not be answered properly. That is acceptable here only because no call
    in this benchmark fails; a real aio server would need an async error wrapper.
    """
    async def handler(request: Any, context: Any) -> Any:
        return behavior(request, context)
    return handler


async def serve_aio(kind: str, settings: Settings, services: Services) -> None:
    """The same registrations as build_server, on a grpc.aio server."""
    limit = settings.server.max_message_bytes
    pool = (futures.ThreadPoolExecutor(max_workers=settings.server.max_workers, thread_name_prefix="rpc")
            if kind == "aio-threadpool" else None)
    server = grpc.aio.server(
        migration_thread_pool=pool,
        options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                 ("grpc.so_reuseport", 0)])
    servicer = servicer_for(settings, services)
    health_servicer: Any
    if kind == "aio-inline":
        # add_servicer_to_server is typed for the sync server; an aio server takes the same handlers.
        add_servicer_to_server(servicer, server, on_the_loop)  # type: ignore[arg-type]
        # grpcio-health-checking ships an asyncio HealthServicer (grpc_health.v1.health.aio; not in its stubs).
        health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    else:
        # Handlers "as they are": the sync ContextSidecar methods and production's sync health
        # servicer, all run in the migration pool, so the bare call also pays the pool hop
        # that every handler of this kind pays.
        add_servicer_to_server(servicer, server)  # type: ignore[arg-type]  # as above
        health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    # enable_server_reflection registers its asyncio servicer on an aio server by itself.
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server)
    port = server.add_insecure_port(settings.server.listen)
    await server.start()
    for name in ("", SERVICE_NAME):
        result = health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        if asyncio.iscoroutine(result):  # the asyncio servicer's set() is a coroutine
            await result
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    announce(settings, port)
    await stopping.wait()
    await server.stop(0)
    if pool is not None:
        pool.shutdown(wait=True)


def serve(kind: str, storage: str) -> int:
    settings = server_settings(storage)
    services = Services.open(settings)
    try:
        if kind == "sync":
            serve_sync(settings, services)
        else:
            asyncio.run(serve_aio(kind, settings, services))
    finally:
        services.close()
    return 0


# -- the run every server is loaded with ------------------------------------------------------

def run_events(count: int, seed: int) -> list[pb.Event]:
    return [pb.Event(**event._asdict()) for event in corpus.events(count, seed)]


def turn_events(count: int, seed: int) -> list[pb.Event]:
    """The write path's new events, one per call, identical for every server kind; iteration 0
    means "the iteration being assembled"."""
    return [pb.Event(event_id=f"w{i}", role="user", content=text)
            for i, text in enumerate(corpus.contents(count, seed + 1))]


# -- the client (benchmark side) --------------------------------------------------------------

@dataclass
class Target:
    """One server kind: its process, its channel and what the next write-path call sends."""

    kind: str
    process: subprocess.Popen
    channel: grpc.Channel
    stub: pb_grpc.ContextSidecarStub
    health: health_pb2_grpc.HealthStub
    read_iteration: int = 0
    next_iteration: int = 0
    writes: int = 0
    samples: dict[str, list[float]] = field(default_factory=lambda: {call: [] for call in CALLS})


def launch(kind: str, storage: Path, timeout: float = 60.0) -> Target:
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_server_kinds", "--serve", kind, "--storage", str(storage)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    # readline() would block forever on a server that hangs while starting.
    assert process.stdout is not None  # a pipe: stdout=PIPE
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    if not line.startswith(READY):
        process.kill()
        raise RuntimeError(f"{kind} server did not start: {line!r}")
    channel = grpc.insecure_channel(line[len(READY):].strip())
    grpc.channel_ready_future(channel).result(timeout=timeout)
    return Target(kind, process, channel, pb_grpc.ContextSidecarStub(channel), health_pb2_grpc.HealthStub(channel))


def stop(target: Target) -> None:
    target.channel.close()
    target.process.send_signal(signal.SIGTERM)
    try:
        target.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        target.process.kill()
        target.process.wait()


def load(target: Target, events: list[pb.Event]) -> tuple[list[int], pb.AssembleContextResponse, float]:
    """Open the run, append ``events`` in batches, assemble the last iteration once (so the
    read path finds its window persisted): (tokens per event, that window, seconds taken)."""
    started = time.perf_counter()
    target.stub.OpenRun(pb.OpenRunRequest(run_id=RUN_ID, token_counter="o200k_base", transcript_token_budget=BUDGET))
    tokens: list[int] = []
    for first in range(0, len(events), BATCH):
        answer = target.stub.AppendEvents(pb.AppendEventsRequest(run_id=RUN_ID, events=events[first:first + BATCH]))
        tokens += [result.tokens for result in answer.results]
    target.read_iteration = events[-1].iteration
    target.next_iteration = target.read_iteration + 1
    window = target.stub.AssembleContext(read_request(target))
    return tokens, window, time.perf_counter() - started


def read_request(target: Target) -> pb.AssembleContextRequest:
    # Iteration and budget never change: a different max_transcript_tokens for the same
    # iteration would re-plan the window and rewrite it, turning the read path into a write.
    return pb.AssembleContextRequest(run_id=RUN_ID, iteration=target.read_iteration, max_transcript_tokens=BUDGET)


def timed_call(target: Target, call: str, new_events: list[pb.Event]) -> float:
    """One call, built before the clock starts; seconds spent in the blocking stub call."""
    if call == "bare":
        method, request = target.health.Check, health_pb2.HealthCheckRequest(service="")
    elif call == "read":
        method, request = target.stub.AssembleContext, read_request(target)
    else:
        # A new iteration every time: the run grows by one event per call.
        request = pb.AssembleContextRequest(run_id=RUN_ID, iteration=target.next_iteration,
                                            append_events=[new_events[target.writes]],
                                            max_transcript_tokens=BUDGET)
        method = target.stub.AssembleContext
        target.next_iteration += 1
        target.writes += 1
    started = time.perf_counter()
    answer = method(request)
    elapsed = time.perf_counter() - started
    if call == "write" and answer.appended[0].already_recorded:
        raise AssertionError(f"{target.kind}: the write path wrote nothing")
    return elapsed


def round_order(round_index: int) -> list[tuple[int, str]]:
    """Every (kind, call) once. Call types rotate every round and kinds every third round, so
    over nine rounds each kind takes each position and follows each neighbour equally often
    (a plain rotation of one fixed list would always put the same call before a given kind's
    write, e.g. another server's fsync)."""
    calls = CALLS[round_index % 3:] + CALLS[:round_index % 3]
    shift = (round_index // 3) % len(KINDS)
    kinds = list(range(len(KINDS)))[shift:] + list(range(len(KINDS)))[:shift]
    return [(kind, call) for call in calls for kind in kinds]


def run_rounds(targets: list[Target], rounds: int, new_events: list[pb.Event], record: bool) -> None:
    for round_index in range(rounds):
        for kind, call in round_order(round_index):
            elapsed = timed_call(targets[kind], call, new_events)
            if record:
                targets[kind].samples[call].append(elapsed * 1e6)


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def ratio_interval(samples: list[float], baseline: list[float], rng: random.Random,
                   resamples: int = 1000) -> tuple[float, float]:
    """95% bootstrap interval of median(samples) / median(baseline), resampling whole rounds
    (sample i of both lists comes from the same round, so shared drift stays paired)."""
    n = len(samples)
    ratios = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        ratios.append(statistics.median([samples[i] for i in picks]) / statistics.median([baseline[i] for i in picks]))
    ratios.sort()
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def report(targets: list[Target], seed: int) -> None:
    rng = random.Random(seed)
    sync = targets[0].samples
    print(f"\n{'call':<6} {'server kind':<15} {'p50 us':>9} {'p99 us':>9}   p50 / sync p50 (95% CI)")
    for call in CALLS:
        for target in targets:
            samples = target.samples[call]
            ratio = statistics.median(samples) / statistics.median(sync[call])
            interval = "" if target.kind == "sync" else "({:.2f}-{:.2f})".format(
                *ratio_interval(samples, sync[call], rng))
            print(f"{call:<6} {target.kind:<15} {statistics.median(samples):>9.1f} {p99(samples):>9.1f}"
                  f"   x{ratio:<5.2f} {interval}".rstrip())
    verdict = []
    for target in targets[1:]:
        ratios = ", ".join(f"x{statistics.median(target.samples[call]) / statistics.median(sync[call]):.2f} ({call})"
                           for call in CALLS)
        verdict.append(f"{target.kind} p50 / sync p50: {ratios}")
    print("\nverdict: " + "; ".join(verdict) + "  (below x1.00: faster than sync)")


def benchmark(event_count: int, rounds: int, warmup: int, seed: int) -> None:
    events = run_events(event_count, seed)
    new_events = turn_events(warmup + rounds, seed)
    print(f"grpcio {grpc.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
          f"{event_count} events in {events[-1].iteration} iterations, budget {BUDGET} tokens; "
          f"{warmup} warm-up + {rounds} measured rounds", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="server-kinds-"))
    targets: list[Target] = []
    try:
        for kind in KINDS:
            targets.append(launch(kind, folder / kind))
        loaded = [load(target, events) for target in targets]
        tokens, window, _ = loaded[0]
        # Same events, same counter: every server must hold the same run and the same window.
        assert all(other_tokens == tokens and other_window == window for other_tokens, other_window, _ in loaded)
        print(f"loaded: mean {statistics.mean(tokens):.0f} o200k tokens per event (min {min(tokens)}, max "
              f"{max(tokens)}, from AppendEvents); read-path window: {len(window.entries)} entries, "
              f"{window.token_count} tokens, {window.omitted_events} older events omitted; load time "
              + ", ".join(f"{t.kind} {seconds:.1f} s" for t, (_, _, seconds) in zip(targets, loaded)), flush=True)
        run_rounds(targets, warmup, new_events, record=False)
        run_rounds(targets, rounds, new_events, record=True)  # continues where the warm-up stopped
        # The read path must have stayed a read: the window it returns is still the loaded one.
        for target in targets:
            if target.stub.AssembleContext(read_request(target)) != window:
                raise AssertionError(f"{target.kind}: the read-path window changed")
        report(targets, seed)
    finally:
        for target in targets:
            stop(target)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10000, help="events in the loaded run (default 10000)")
    parser.add_argument("--rounds", type=int, default=400, help="measured rounds (default 400)")
    parser.add_argument("--warmup", type=int, default=30, help="unrecorded rounds first (default 30)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the generated events (default 1)")
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--storage", help=argparse.SUPPRESS)
    add_smoke_flag(parser)
    args = smoke(parser.parse_args(), events=50, rounds=2, warmup=1)
    if args.serve:
        return serve(args.serve, args.storage)
    if args.events < 1 or args.rounds < 2:
        parser.error("--events must be at least 1 and --rounds at least 2")
    benchmark(args.events, args.rounds, args.warmup, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
