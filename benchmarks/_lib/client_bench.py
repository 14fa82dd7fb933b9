"""The clients' common bench protocol, through context_sidecar_client: what one call costs a host.

Every client (Python here, clients/node/bench.js, clients/go's cmd/bench, clients/java's Bench)
runs the same program against a sidecar that is already running, so one run of
``benchmarks.bench_clients`` compares them on one server:

1. OpenRun "bench-<lang>" (token_counter o200k_base, transcript_token_budget 8000);
2. AppendEvents of 200 events: event i (0-based) has id "e<i>", iteration i // 4 + 1, role
   user / assistant alternately, and 60 words joined by spaces, drawn from WORDS (24 words) by
   the C library's old rand(): state = i + 1, then per word state = (state * 1103515245 + 12345)
   mod 2**31 and the word WORDS[(state >> 16) % 24] (the same text in every language);
3. AssembleContext of the last iteration (50) once: it persists the window;
4. N rounds of grpc.health.v1.Health/Check then AssembleContext(iteration 50,
   max_transcript_tokens 8000), which re-assembles and writes nothing, each call timed;
5. one line of JSON: {"client": "python", "health_p50_us": ..., "assemble_p50_us": ..., "rounds": N}.

Re-running against the same sidecar is fine: the run is confirmed and the events answer
already_recorded. ``--stubs`` reports the same calls through the generated stubs instead, with
requests built once (client "python-stubs"), and times context_sidecar_client's in the same rounds, in a
rotating order (``client_health_p50_us``, ``client_assemble_p50_us``): the difference is what the
client itself costs, free of the drift between two runs.

    python -m benchmarks._lib.client_bench --target 127.0.0.1:50051 [--rounds 300] [--stubs]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import grpc
from context_sidecar_client import Client
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks._lib.harness import interleaved
from sidecar.bench.report import percentile

WORDS = ("refund policy kettle order shipping invoice customer damaged clause days warranty receipt the a "
         "within agent reads file calls tool search summary token cache").split()
EVENTS, PER_TURN, BUDGET = 200, 4, 8000


def content(i: int) -> str:
    words, state = [], i + 1
    for _ in range(60):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        words.append(WORDS[(state >> 16) % len(WORDS)])
    return " ".join(words)


def p50_us(seconds: list[float]) -> float:
    return percentile(seconds, 0.5) * 1e6


def timed(health: Callable[[], object], assemble: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Each call's p50 over ``rounds`` rounds of one call each, in this order."""
    seconds: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for call, kept in ((health, seconds[0]), (assemble, seconds[1])):
            started = time.perf_counter()
            call()
            kept.append(time.perf_counter() - started)
    return p50_us(seconds[0]), p50_us(seconds[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the sidecar's address, HOST:PORT")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--stubs", action="store_true", help="time the generated stubs, not context_sidecar_client")
    args = parser.parse_args()
    name = "python-stubs" if args.stubs else "python"
    run_id, last = f"bench-{name}", (EVENTS - 1) // PER_TURN + 1
    with Client(args.target) as client:
        client.open_run(run_id=run_id, token_counter="o200k_base", transcript_token_budget=BUDGET)
        client.append_events(run_id=run_id, events=[
            {"event_id": f"e{i}", "iteration": i // PER_TURN + 1, "role": ("user", "assistant")[i % 2],
             "content": content(i)} for i in range(EVENTS)])
        client.assemble_context(run_id=run_id, iteration=last)
        assemble = lambda: client.assemble_context(  # noqa: E731
            run_id=run_id, iteration=last, max_transcript_tokens=BUDGET)
        if not args.stubs:
            health_p50, assemble_p50 = timed(client.check_health, assemble, args.rounds)
            print(json.dumps({"client": name, "health_p50_us": round(health_p50, 1),
                              "assemble_p50_us": round(assemble_p50, 1), "rounds": args.rounds}))
            return
        with grpc.insecure_channel(args.target) as channel:
            stub, health = pb_grpc.ContextSidecarStub(channel), health_pb2_grpc.HealthStub(channel)
            check = health_pb2.HealthCheckRequest()
            read = pb.AssembleContextRequest(run_id=run_id, iteration=last, max_transcript_tokens=BUDGET)
            samples = interleaved({"health": lambda: health.Check(check),
                                   "assemble": lambda: stub.AssembleContext(read),
                                   "client_health": client.check_health, "client_assemble": assemble},
                                  args.rounds, warmup=0)
    print(json.dumps({"client": name, **{f"{call}_p50_us": round(samples[call].p50, 1) for call in samples},
                      "rounds": args.rounds}))


if __name__ == "__main__":
    main()
