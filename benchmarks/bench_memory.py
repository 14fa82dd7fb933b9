"""Memory: ListMemory over 100k entries, PutMemory throughput, and redaction cost per MB.

Against a real sidecar process, in one run:

- load: 100k entries of ~190 o200k tokens into one memory ref (prose, JSON and code, each with
  a few words from a 5,000-word vocabulary of names, so queries have rare terms as well as
  common ones), through PutMemory by a sidecar started with --no-sync (loading only);
- then, with a sidecar on the same store and sync on (the default), round by round: a bare
  RPC (health Check), ListMemory by recency with a 2,000-token budget, ListMemory by relevance
  (BM25) with the same budget and a three-word query (one common word, two rarer ones);
- PutMemory throughput: durable puts into another ref, one call after another;
- redaction, in this process: MB/s of the sidecar's redactor with 1 and with 1,000 registered
  secrets, next to the plain way (``str.replace`` for each secret) on the same text.

    python -m benchmarks.bench_memory [--entries 100000] [--rounds 300] [--puts 1000]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks._lib import corpus
from benchmarks._lib.harness import add_smoke_flag, interleaved, sidecar_process, smoke
from benchmarks._lib.workload import MEMORY_BUDGET as BUDGET
from benchmarks._lib.workload import MEMORY_REF as REF
from benchmarks._lib.workload import QUERY, entry_texts, load_memory
from sidecar.text.redaction import Redactor


def redaction_rates(megabytes: float = 4) -> dict[str, float]:
    """MB/s of the redactor with 1 and 1,000 secrets, and of str.replace per secret."""
    rng = random.Random(5)
    text = ("\n".join(corpus.contents(4000, seed=9)) * 8)[: int(megabytes * (1 << 20))]
    secrets = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-_") for _ in range(rng.randrange(16, 48)))
               for _ in range(1000)]
    rates = {}
    for count in (1, 1000):
        redactor = Redactor(detectors=False)
        redactor.register("t", "", [(f"s{i}", value) for i, value in enumerate(secrets[:count])])
        redactor.redact("t", "", "warm up the matcher")
        # Defaults bind this iteration's redactor and count (each closure runs within its iteration anyway).
        rates[f"redactor, {count} secret(s)"] = _rate(lambda redactor=redactor: redactor.redact("t", "", text),
                                                     len(text))

        def plain(count: int = count) -> str:
            out = text
            for i, value in enumerate(secrets[:count]):
                out = out.replace(value, f"[REDACTED:s{i}]")
            return out

        rates[f"str.replace loop, {count} secret(s)"] = _rate(plain, len(text))
    rates["detectors only"] = _rate(lambda: Redactor().redact("t", "", text), len(text))
    return rates


def _rate(work, size: int, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        work()
        times.append(time.perf_counter() - begin)
    return size / (1 << 20) / sorted(times)[repeats // 2]


def measure(entries: int, rounds: int, puts: int, megabytes: float) -> None:
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        storage = Path(tmp) / "lmdb"
        with sidecar_process(storage, ["--no-sync"]) as channel:
            seconds = load_memory(pb_grpc.ContextSidecarStub(channel), entries)
        print(f"loaded {entries} entries in {seconds:.1f} s (PutMemory, --no-sync)")
        with sidecar_process(storage, []) as channel:
            stub = pb_grpc.ContextSidecarStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            recency = pb.ListMemoryRequest(memory_ref=REF, token_budget=BUDGET)
            relevance = pb.ListMemoryRequest(memory_ref=REF, token_budget=BUDGET, rank="relevance", query=QUERY)
            sample = {"recency": stub.ListMemory(recency), "relevance": stub.ListMemory(relevance)}
            samples = interleaved({"bare": lambda: health.Check(health_pb2.HealthCheckRequest()),
                                   "recency": lambda: stub.ListMemory(recency),
                                   "relevance": lambda: stub.ListMemory(relevance)}, rounds)
            texts = entry_texts(puts, seed=2)
            put_times = []
            begin = time.perf_counter()
            for i, text in enumerate(texts):
                start = time.perf_counter()
                stub.PutMemory(pb.PutMemoryRequest(memory_ref="mem:puts", content=text, entry_id=f"p{i}"))
                put_times.append(time.perf_counter() - start)
            put_seconds = time.perf_counter() - begin
    bare = samples["bare"].p50
    print(f"\n{rounds} interleaved rounds over {entries} entries; budget {BUDGET} o200k tokens\n")
    print("| call | answer | p50 us | p99 us | p50 / bare p50 |\n|---|---|---:|---:|---:|")
    print(f"| bare RPC (health Check) | | {bare:,.0f} | {samples['bare'].p99:,.0f} | 1.00 |")
    for name in ("recency", "relevance"):
        answer = sample[name]
        detail = f"{len(answer.entries)} entries, {answer.tokens_used} tokens"
        print(f"| ListMemory {name} | {detail} | {samples[name].p50:,.0f} | {samples[name].p99:,.0f} | "
              f"{samples[name].p50 / bare:.2f} |")
    put_times.sort()
    print(f"\nPutMemory, durable, one after another: {puts / put_seconds:,.0f} puts/s; "
          f"p50 {put_times[len(put_times) // 2] * 1e6:,.0f} us, "
          f"p99 {put_times[int(len(put_times) * .99)] * 1e6:,.0f} us")
    rates = redaction_rates(megabytes)
    print(f"\n| redaction of {megabytes:g} MB of text | MB/s |\n|---|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:,.1f} |")
    print(f"\nredactor cost per MB, 1,000 secrets / 1 secret: "
          f"{rates['redactor, 1 secret(s)'] / rates['redactor, 1000 secret(s)']:.2f} (aim <= 1.5); "
          "str.replace loop, 1,000 / 1: "
          f"{rates['str.replace loop, 1 secret(s)'] / rates['str.replace loop, 1000 secret(s)']:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--puts", type=int, default=1000)
    add_smoke_flag(parser)
    args = smoke(parser.parse_args(), entries=50, rounds=1, puts=5)
    measure(args.entries, args.rounds, args.puts, 0.05 if args.smoke else 4)


if __name__ == "__main__":
    main()
