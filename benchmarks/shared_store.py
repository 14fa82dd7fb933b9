"""What the shared store costs: per-turn calls with [storage] shared (PostgreSQL) against LMDB
alone and the bare RPC, in one run; and the cold load of a run a sidecar has never held.

A real PostgreSQL server (Debian's ``postgresql``, started in a temp folder as in the tests, with
its durability defaults: fsync on, synchronous commit) and two sidecar processes run at once, one
with LMDB alone and one with the shared store, both real LMDB with sync on and o200k counting.
Each receives the same 10,000-event run and the same memory ref; every call of both is timed once
per round in a rotating order, so the drift of a shared machine hits them alike:

- bare: a health Check, the floor under any RPC;
- assemble: AssembleContext re-assembling a persisted iteration (with the shared store: one query
  for the run's version first);
- turn: AssembleContext appending one new event for a new iteration (with the shared store: the
  version query, then the records committed to PostgreSQL, then LMDB);
- list memory: ListMemory by recency from a ref of 1,000 entries.

Then the cold load: sidecars with empty LMDB folders on the same database, each timed on its
first AssembleContext of the run (which loads the run's records from PostgreSQL) and its second.
The aim: a turn with the shared store within 2x of LMDB alone.

    python -m benchmarks.shared_store [--events 10000] [--rounds 300] [--cold 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import psycopg

from benchmarks import corpus
from benchmarks.compare_trees import BUDGET, RUN, calls_for
from benchmarks.harness import interleaved, sidecar_process
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.pb.contextsidecar.v1 import sidecar_pb2_grpc as pb_grpc
from tests.helpers import Postgres

MEMORY_ENTRIES = 1_000


def memory_call(channel) -> Callable[[], object]:
    stub = pb_grpc.ContextSidecarStub(channel)
    for index, content in enumerate(corpus.contents(MEMORY_ENTRIES, seed=11)):
        stub.PutMemory(pb.PutMemoryRequest(memory_ref="team", entry_id=f"m{index}", content=content[:400]))
    request = pb.ListMemoryRequest(memory_ref="team", limit=20)
    return lambda: stub.ListMemory(request)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000, help="events in the run")
    parser.add_argument("--rounds", type=int, default=300, help="interleaved rounds of every call")
    parser.add_argument("--cold", type=int, default=3, help="sidecars timed on their cold load of the run")
    args = parser.parse_args()
    flags = ["--token-counter", "o200k_base", "--transcript-token-budget", str(BUDGET)]
    new_contents = corpus.contents(512, seed=7)
    postgres = Postgres()
    try:
        url = postgres.database()
        shared_flags = [*flags, "--shared", url]
        with tempfile.TemporaryDirectory(prefix="sidecar-shared-") as tmp, ExitStack() as stack:
            calls: dict[str, Callable[[], object]] = {}
            for name, kind_flags in (("lmdb", flags), ("shared", shared_flags)):
                channel = stack.enter_context(sidecar_process(Path(tmp) / name, kind_flags))
                for kind, call in calls_for(channel, args.events, new_contents).items():
                    calls[f"{name} {kind}"] = call
                calls[f"{name} list memory"] = memory_call(channel)
            samples = interleaved(calls, args.rounds)
            last = (args.events - 1) // corpus.EVENTS_PER_TURN + 1
            read = pb.AssembleContextRequest(run_id=RUN, iteration=last, max_transcript_tokens=BUDGET)
            cold, warm = [], []
            for index in range(args.cold):
                with sidecar_process(Path(tmp) / f"cold{index}", shared_flags) as channel:
                    stub = pb_grpc.ContextSidecarStub(channel)
                    for times in (cold, warm):
                        begin = time.perf_counter()
                        stub.AssembleContext(read)
                        times.append(time.perf_counter() - begin)
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT count(*), sum(length(value)) FROM context_sidecar_records "
                                "WHERE unit = %s", (b"rdefault\0" + RUN.encode() + b"\0",)).fetchone()
    finally:
        postgres.close()
    print(f"\n{args.rounds} interleaved rounds, {args.events:,} events, {BUDGET // 1000}k budget, "
          f"{MEMORY_ENTRIES:,} memory entries; p50 us\n")
    print("| call | LMDB alone | shared store | shared / LMDB alone | shared / bare |")
    print("|---|---:|---:|---:|---:|")
    bare = samples["shared bare"].p50
    for kind in ("bare", "assemble", "turn", "list memory"):
        alone, shared = samples[f"lmdb {kind}"].p50, samples[f"shared {kind}"].p50
        print(f"| {kind} | {alone:,.0f} | {shared:,.0f} | {shared / alone:.2f} | {shared / bare:.2f} |")
    cold_ms, warm_ms = sorted(cold)[len(cold) // 2] * 1e3, sorted(warm)[len(warm) // 2] * 1e3
    print(f"\ncold load of the {args.events:,}-event run ({rows[0]:,} records, {rows[1] / 1e6:.1f} MB in PostgreSQL): "
          f"first AssembleContext {cold_ms:,.0f} ms, the next {warm_ms:,.1f} ms (median of {args.cold})")


if __name__ == "__main__":
    main()
