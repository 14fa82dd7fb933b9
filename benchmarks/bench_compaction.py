"""Memory compaction: how long distilling 1,000 entries takes, and what the background job costs
the per-turn reads while it runs.

Two sidecar processes in turn, each under the same load: a feeder thread puts ~190-token
entries into one ref at a steady rate while the benchmark times ListMemory (recency, 2,000-token
budget) on another ref of 2,000 entries. In the first, compaction is off; in the second, the
background job runs every 0.2 s and distils the fed ref whenever it passes 200 entries (all but
the newest 50). Then a third sidecar (sync on, its job idle) times CompactMemory of 1,000 entries.

    python -m benchmarks.bench_compaction [--samples 1500] [--feed-rate 150]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc

from benchmarks._lib import corpus
from benchmarks._lib.harness import Samples, add_smoke_flag, sidecar_process, smoke

READ_REF, FED_REF, BULK_REF = "mem:read", "mem:fed", "mem:bulk"
READ_ENTRIES, BULK_ENTRIES = 2000, 1000  # in the read ref; compacted at once
JOB = ["--compaction-enabled", "--compaction-interval-seconds", "0.2", "--compaction-min-entries", "200",
       "--compaction-keep-recent", "50", "--compaction-max-input-entries", "1000",
       "--compaction-token-budget", "4000"]


def put_all(stub: pb_grpc.ContextSidecarStub, ref: str, texts: list[str], prefix: str) -> None:
    for i, text in enumerate(texts):
        stub.PutMemory(pb.PutMemoryRequest(memory_ref=ref, content=text, entry_id=f"{prefix}{i}"))


def phase(storage: Path, flags: list[str], samples: int, feed_rate: float, read: int) -> dict:
    with sidecar_process(storage, ["--no-sync", *flags]) as channel:
        stub = pb_grpc.ContextSidecarStub(channel)
        put_all(stub, READ_REF, corpus.contents(read, seed=1), "r")
        put_all(stub, FED_REF, corpus.contents(180, seed=4), "pre")  # the job starts soon after feeding
        stop = threading.Event()
        fed = [0]

        def feed() -> None:
            texts = corpus.contents(4000, seed=2)
            while not stop.is_set():
                stub.PutMemory(pb.PutMemoryRequest(memory_ref=FED_REF, content=texts[fed[0] % len(texts)],
                                                   entry_id=f"f{fed[0]}"))
                fed[0] += 1
                time.sleep(1 / feed_rate)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        time.sleep(1.0)
        request = pb.ListMemoryRequest(memory_ref=READ_REF, token_budget=2000)
        reads = Samples()
        for _ in range(samples):
            begin = time.perf_counter()
            stub.ListMemory(request)
            reads.seconds.append(time.perf_counter() - begin)
            time.sleep(0.002)
        stop.set()
        feeder.join()
        events = stub.ListMemoryEvents(pb.ListMemoryEventsRequest(memory_ref=FED_REF, limit=1000)).events
    return {"reads": reads, "fed": fed[0], "compactions": len(events)}


def compact_1000(storage: Path, entries: int) -> tuple[float, dict]:
    """CompactMemory of ``entries`` entries (1,000) (sync on), on a sidecar whose job will not run meanwhile."""
    flags = ["--compaction-enabled", "--compaction-interval-seconds", "3600", "--compaction-max-input-entries", "1000",
             "--compaction-token-budget", "4000"]
    with sidecar_process(storage, flags) as channel:
        stub = pb_grpc.ContextSidecarStub(channel)
        put_all(stub, BULK_REF, corpus.contents(entries, seed=3), "b")
        begin = time.perf_counter()
        done = stub.CompactMemory(pb.CompactMemoryRequest(memory_ref=BULK_REF,
                                                          source_ids=[f"b{i}" for i in range(entries)]))
        return time.perf_counter() - begin, json.loads(done.event.json)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1500)
    parser.add_argument("--feed-rate", type=float, default=150, help="puts per second into the fed ref")
    add_smoke_flag(parser)
    args = smoke(parser.parse_args(), samples=5)
    read, bulk = (100, 50) if args.smoke else (READ_ENTRIES, BULK_ENTRIES)
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        idle = phase(Path(tmp) / "idle", [], args.samples, args.feed_rate, read)
        busy = phase(Path(tmp) / "busy", JOB, args.samples, args.feed_rate, read)
        seconds, event = compact_1000(Path(tmp) / "bulk", bulk)
    print(f"\n{args.samples} ListMemory calls per phase, while {args.feed_rate:.0f} puts/s feed another ref\n")
    print("| phase | compactions | p50 us | p99 us |\n|---|---:|---:|---:|")
    for name, result in (("job off", idle), ("job running", busy)):
        print(f"| {name} | {result['compactions']} | {result['reads'].p50:,.0f} | {result['reads'].p99:,.0f} |")
    print(f"\nwhile the job runs / while it does not: p50 x{busy['reads'].p50 / idle['reads'].p50:.2f}, "
          f"p99 x{busy['reads'].p99 / idle['reads'].p99:.2f} (aim: p99 within 1.5x)")
    print(f"CompactMemory of {bulk:,} entries: {seconds * 1000:,.0f} ms; distilled to "
          f"{event['distillation']['tokensUsed']} tokens ({event['byteSize']} bytes) of a "
          f"{event['distillation']['tokenBudget']}-token budget")


if __name__ == "__main__":
    main()
