"""Bytes written to the store per RecordSummary, early in a run and after thousands of summaries.

A real sidecar process (``--no-sync``: the figure is bytes, not time); one run of one-event turns,
then ``--summaries`` sliding-window summaries, each replacing the oldest unsummarised event, so
every summary stays in force and the stack of summaries grows by one with each. When the process
has stopped, the store is opened read-only and, for the 10th and the last summary, the records
that summary wrote are read back and their sizes (key + value) added up: its ``summaries``
record, its compaction record, its artifact (the text), its ``context.summarized`` log entry,
that entry's id index and log-entry index. The log's per-chunk arrays, which every appended
entry rewrites whatever it is, are left out (bounded by 128 entries a chunk). Also printed: the
``summaries`` database's pages and the whole store in use, against the summary texts' bytes.

The bytes per summary must not depend on how many summaries came before: the ratio of the last
summary's bytes to the 10th's must stay <= 1.2.

    python -m benchmarks.bench_summary_bytes [--summaries 2000]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import lmdb
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc

from benchmarks._lib.harness import add_smoke_flag, sidecar_process, smoke
from sidecar.storage.databases import DATABASES
from sidecar.storage.keys import be32
from sidecar.transcript.runs import SIDECAR_ID_PREFIX
from sidecar.transcript.schema import run_key
from sidecar.transcript.summaries import SUMMARIZED_TYPE, Summary

RUN = "long"
TENANT = "default"
BATCH = 500  # events per AppendEvents
MAX_RATIO = 1.2


def summary_text(index: int) -> str:
    return f"Summary {index:05d}: the customer asked about order {index * 7:06d} and was told its shipping status."


def record(stub: pb_grpc.ContextSidecarStub, summaries: int) -> int:
    """The run and its summaries; the summary texts' bytes."""
    stub.OpenRun(pb.OpenRunRequest(run_id=RUN, summarization_supported=True, keep_last_turns=1))
    events = [pb.Event(event_id=f"e{i}", iteration=1, role="user", content=f"Question {i:05d} about an order.")
              for i in range(summaries + 10)]
    for first in range(0, len(events), BATCH):
        stub.AppendEvents(pb.AppendEventsRequest(run_id=RUN, events=events[first:first + BATCH]))
    for index in range(summaries):
        stub.RecordSummary(pb.RecordSummaryRequest(run_id=RUN, iteration=index + 2, replaced_event_ids=[f"e{index}"],
                                                   summary_text=summary_text(index)))
    return sum(len(summary_text(index).encode()) for index in range(summaries))


def bytes_written(txn: lmdb.Transaction, db: dict, key: bytes, index: int) -> int:
    """The key and value bytes of every record summary ``index`` (0-based) wrote."""
    summary_key = key + be32(index)
    stored = txn.get(summary_key, db=db["summaries"])
    assert stored is not None, f"summary {index} was not written"
    summary = Summary.parse(bytes(stored))  # either layout
    seq_key = key + be32(summary.seq)
    artifact_key = key + summary.ref.encode("utf-8")
    entry_id_key = key + f"{SIDECAR_ID_PREFIX}{SUMMARIZED_TYPE}:{index}".encode()
    records = [("summaries", summary_key), ("compaction_records", summary_key), ("artifacts", artifact_key),
               ("events", seq_key), ("event_ids", entry_id_key), ("log_entries", seq_key)]
    total = 0
    for name, record_key in records:
        value = txn.get(record_key, db=db[name])
        assert value is not None, f"summary {index}: no {name} record"
        total += len(record_key) + len(value)
    return total


def measure(summaries: int) -> float:
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        storage = Path(tmp) / "lmdb"
        with sidecar_process(storage, ["--token-counter", "chars", "--summarization", "--no-sync"]) as channel:
            text_bytes = record(pb_grpc.ContextSidecarStub(channel), summaries)
        env = lmdb.open(str(storage), readonly=True, max_dbs=len(DATABASES) + 8)
        try:
            db = {name.decode(): env.open_db(name, create=False) for name in DATABASES}
            key = run_key(TENANT, RUN)
            with env.begin() as txn:
                early, late = bytes_written(txn, db, key, 9), bytes_written(txn, db, key, summaries - 1)
                pages = txn.stat(db["summaries"])
            info, psize = env.info(), env.stat()["psize"]
        finally:
            env.close()
    summaries_db = (pages["branch_pages"] + pages["leaf_pages"] + pages["overflow_pages"]) * psize
    ratio = late / early
    print(f"\n{summaries} sliding-window summaries in force, {text_bytes:,} bytes of summary text\n")
    print("| figure | bytes |\n|---|---:|")
    print(f"| written by the 10th summary | {early:,} |")
    print(f"| written by the {summaries:,}th summary | {late:,} |")
    print(f"| `summaries` database | {summaries_db:,} |")
    print(f"| whole store in use | {(info['last_pgno'] + 1) * psize:,} |")
    print(f"\nratio {summaries:,}th / 10th: {ratio:.2f} (must be <= {MAX_RATIO})")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summaries", type=int, default=2000)
    add_smoke_flag(parser)
    args = smoke(parser.parse_args(), summaries=10)
    if args.summaries < 10:
        parser.error("--summaries must be at least 10")
    if measure(args.summaries) > MAX_RATIO:
        raise SystemExit(f"the bytes per summary grow with the summaries before it (ratio > {MAX_RATIO})")


if __name__ == "__main__":
    main()
