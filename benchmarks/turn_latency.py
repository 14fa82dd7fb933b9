"""Per-turn latency of AssembleContext against a real sidecar process, beside its baselines.

Measured in one run, round by round, every call once per round in a rotating order, so the
machine's drift (it is shared and noisy) hits every figure alike:

- bare: a health Check, the floor under any per-turn RPC on this machine;
- assemble: AssembleContext re-assembling a persisted iteration (the read path: select, read,
  answer; nothing written) at 8k and 32k budgets over runs of 1k, 10k and 100k events of
  ~190 o200k tokens each (prose, JSON, code);
- turn: AssembleContext that appends one new ~190-token event for a new iteration, the real
  per-turn call: count its tokens, one durable LMDB commit, persist the window, answer;
- retokenize: what a host pays without the sidecar, tiktoken over its whole transcript each
  turn (measured in this process, after the rounds).

Every call goes through sidecar.client, as a host's would (a few microseconds a call above the
raw stubs: ``benchmarks.clients`` compares the clients).

    python -m benchmarks.turn_latency [--sizes 1000,10000,100000] [--rounds 300] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import corpus
from benchmarks.harness import Samples, interleaved, sidecar_address
from sidecar.client import Client
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.text.encodings import load_encoding

BUDGETS = (8000, 32000)


def load_run(client: Client, run_id: str, size: int) -> tuple[list[str], float]:
    """Append ``size`` events through gRPC; return their contents and their mean token count."""
    texts, tokens = [], 0
    batch: list[dict] = []
    for event in corpus.events(size, seed=size):
        batch.append(event._asdict())
        texts.append(event.content)
        if len(batch) == 500 or len(texts) == size:
            answer = client.append_events(run_id=run_id, events=batch)
            tokens += sum(result.tokens for result in answer.results)
            batch = []
    return texts, tokens / size


def measure(args: argparse.Namespace) -> None:
    sizes = [int(size) for size in args.sizes.split(",")]
    server_env = dict(item.split("=", 1) for item in args.server_env)
    flags = ["--token-counter", "o200k_base", "--transcript-token-budget", str(max(BUDGETS))]
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        with sidecar_address(Path(tmp) / "lmdb", flags, server_env) as address, Client(address) as client:
            report = run_rounds(client, sizes, args.rounds)
    print_report(report, sizes, args.markdown)


def run_rounds(client: Client, sizes: list[int], rounds: int) -> dict:
    started = time.perf_counter()
    runs = {}
    for size in sizes:
        texts, mean_tokens = load_run(client, f"run-{size}", size)
        runs[size] = {"texts": texts, "mean_tokens": mean_tokens, "last": (size - 1) // corpus.EVENTS_PER_TURN + 1}
    print(f"loaded {sum(sizes)} events in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    new_contents = corpus.contents(512, seed=7)
    next_turn = {size: runs[size]["last"] + 1 for size in sizes}
    windows: dict[tuple[int, int], pb.AssembleContextResponse] = {}

    def assemble(size: int, budget: int):
        # A fixed iteration per budget: re-assembling it reads and answers, and writes nothing.
        iteration = runs[size]["last"] - (1 if budget == BUDGETS[0] else 0)
        return lambda: client.assemble_context(run_id=f"run-{size}", iteration=iteration,
                                               max_transcript_tokens=budget)

    def turn(size: int, budget: int):
        def call() -> pb.AssembleContextResponse:
            iteration = next_turn[size]
            next_turn[size] += 1
            event = {"event_id": f"turn-{budget}-{iteration}", "role": "user",
                     "content": new_contents[iteration % len(new_contents)]}
            return client.assemble_context(run_id=f"run-{size}", iteration=iteration, append_events=[event],
                                           max_transcript_tokens=budget)
        return call

    calls = {("bare", 0, 0): client.check_health}
    for size in sizes:
        for budget in BUDGETS:
            calls[("assemble", size, budget)] = assemble(size, budget)
            calls[("turn", size, budget)] = turn(size, budget)
    for (kind, size, budget), call in calls.items():
        if kind == "assemble":
            windows[(size, budget)] = call()  # persists the window the rounds re-assemble
    samples = interleaved(calls, rounds)

    encoding = load_encoding("o200k_base")
    retokenize = {}
    for size in sizes:
        texts = runs[size]["texts"]
        retokenize[size] = Samples()
        for _ in range(max(3, 30_000 // size)):
            begin = time.perf_counter()
            sum(len(encoding.encode_ordinary(text)) for text in texts)
            retokenize[size].seconds.append(time.perf_counter() - begin)
    return {"samples": samples, "windows": windows, "runs": runs, "retokenize": retokenize, "rounds": rounds}


def print_report(report: dict, sizes: list[int], markdown: bool) -> None:
    samples, windows, runs, retokenize = report["samples"], report["windows"], report["runs"], report["retokenize"]
    bare = samples[("bare", 0, 0)]
    rows = [("bare RPC (health Check)", "", bare.p50, bare.p99, 1.0)]
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
    mean = sum(runs[size]["mean_tokens"] for size in sizes) / len(sizes)
    print(f"\n{report['rounds']} interleaved rounds; events average {mean:.0f} o200k tokens; times in microseconds\n")
    if markdown:
        print("| call | window | p50 us | p99 us | p50 / bare p50 |\n|---|---|---:|---:|---:|")
        for name, detail, p50, p99, ratio in rows:
            print(f"| {name} | {detail} | {p50:,.0f} | {p99:,.0f} | {ratio:,.2f} |")
    else:
        for name, detail, p50, p99, ratio in rows:
            print(f"{name:<34} {detail:<24} p50 {p50:>12,.0f}  p99 {p99:>12,.0f}  x{ratio:,.2f}")

    def p50(kind: str, size: int, budget: int) -> float:
        return samples[(kind, size, budget)].p50

    print("\naims of the issue, as measured:")
    print("  assemble 32k p50 / bare p50 (aim <= 1.5): "
          + ", ".join(f"{size // 1000}k events {p50('assemble', size, 32000) / bare.p50:.2f}" for size in sizes))
    print("  turn 32k p50 / bare p50 (appends and commits too): "
          + ", ".join(f"{size // 1000}k events {p50('turn', size, 32000) / bare.p50:.2f}" for size in sizes))
    smallest, largest = min(sizes), max(sizes)
    for budget in BUDGETS:
        print(f"  assemble {budget // 1000}k p50 at {largest // 1000}k events / at {smallest // 1000}k events "
              f"(aim <= 1.1): {p50('assemble', largest, budget) / p50('assemble', smallest, budget):.2f}")
    for size in sizes:
        print(f"  retokenize p50 / assemble 32k p50 at {size // 1000}k events (aim >= 300 at 10k): "
              f"{retokenize[size].p50 / p50('assemble', size, 32000):,.0f}x; "
              f"/ turn 32k p50: {retokenize[size].p50 / p50('turn', size, 32000):,.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="events per run, comma-separated")
    parser.add_argument("--rounds", type=int, default=300, help="interleaved rounds of every call")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment for the sidecar process (e.g. MALLOC_MMAP_THRESHOLD_=...)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    measure(parser.parse_args())


if __name__ == "__main__":
    main()
