"""What watching the sidecar costs: AssembleContext with metrics on, and with tracing on, against
neither, side by side in one run.

Three sidecars from this tree run at once (real processes, real LMDB, o200k counting): one with
neither, one with ``--metrics-listen 127.0.0.1:0`` (Prometheus metrics recorded and served), one with
``--tracing`` (a span per RPC and per phase of the turn, made and ended; exported only when
``--otlp-endpoint`` is given, so the export's own cost lands on the sidecar's batch thread, not on
the call). Each receives the same 10,000-event run; every call of every sidecar is timed once per
round in a rotating order, so the drift of a shared machine hits them alike:

- assemble: AssembleContext re-assembling a persisted iteration (the read path);
- turn: AssembleContext appending one new event for a new iteration (the per-turn call).

The figures to read are the ratios to the sidecar with neither (aims: metrics <= 1.05x, tracing
<= 1.15x).

    python -m benchmarks.observability [--events 10000] [--rounds 400] [--otlp-endpoint URL]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from benchmarks import corpus
from benchmarks.compare_trees import BUDGET, calls_for
from benchmarks.harness import interleaved, sidecar_process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000, help="events in each sidecar's run")
    parser.add_argument("--rounds", type=int, default=400, help="interleaved rounds of every call")
    parser.add_argument("--otlp-endpoint", default="", help="export the traced sidecar's spans here")
    args = parser.parse_args()
    base = ["--token-counter", "o200k_base", "--transcript-token-budget", str(BUDGET)]
    tracing = ["--tracing", *(["--otlp-endpoint", args.otlp_endpoint] if args.otlp_endpoint else [])]
    kinds = {"neither": [], "metrics": ["--metrics-listen", "127.0.0.1:0"], "tracing": tracing}
    new_contents = corpus.contents(512, seed=7)
    with tempfile.TemporaryDirectory(prefix="sidecar-observability-") as tmp, ExitStack() as stack:
        calls: dict[str, Callable[[], object]] = {}
        for name, flags in kinds.items():
            channel = stack.enter_context(sidecar_process(Path(tmp) / name, [*base, *flags]))
            for kind, call in calls_for(channel, args.events, new_contents).items():
                if kind != "bare":
                    calls[f"{name} {kind}"] = call
        samples = interleaved(calls, args.rounds)
    print(f"\n{args.rounds} interleaved rounds, {args.events:,} events, {BUDGET // 1000}k budget; p50 us\n")
    print("| call | neither | metrics on | tracing on | metrics / neither | tracing / neither |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in ("assemble", "turn"):
        p50 = {name: samples[f"{name} {kind}"].p50 for name in kinds}
        print(f"| {kind} | {p50['neither']:,.0f} | {p50['metrics']:,.0f} | {p50['tracing']:,.0f} | "
              f"{p50['metrics'] / p50['neither']:.3f} | {p50['tracing'] / p50['neither']:.3f} |")


if __name__ == "__main__":
    main()
