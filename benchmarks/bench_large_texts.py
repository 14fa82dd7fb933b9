"""The CPU one CountTokens call of 8 MiB costs a real sidecar process, by the shape of its text:
one unbroken word (tiktoken's BPE of one piece grows faster than its length), random letters in
runs of ``MAX_UNBROKEN_RUN`` (the longest a text may hold), and prose. The figure is the server
process's user + system time across the call (from /proc), and what it answered.

    python -m benchmarks.bench_large_texts [--tree PATH]

``--tree``: a source tree (fastcore compiled in place) whose sidecar runs instead, to compare.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
from pathlib import Path

import grpc
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc

from benchmarks._lib.harness import add_smoke_flag, channel_to, sidecar_serving
from sidecar.validation import MAX_UNBROKEN_RUN

SIZE = 8 << 20  # [context] max_request_bytes' default


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def texts(size: int = SIZE) -> dict[str, str]:
    rng = random.Random(1)
    letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(MAX_UNBROKEN_RUN))
    words = "the quick brown fox jumps over a lazy dog: refund policy 12345, customer invoice status.".split()
    return {"one word": "a" * size,
            f"runs of {MAX_UNBROKEN_RUN} letters": (letters + " ") * (size // (MAX_UNBROKEN_RUN + 1)),
            "prose": " ".join(rng.choice(words) for _ in range(size // 5))[:size]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, help="a source tree whose sidecar runs instead")
    add_smoke_flag(parser)
    args = parser.parse_args()
    tree, size = args.tree, 64 << 10 if args.smoke else SIZE
    with tempfile.TemporaryDirectory() as storage, \
            sidecar_serving(Path(storage), (), tree=tree.resolve() if tree else None) as sidecar, \
            channel_to(sidecar.address) as channel:
        stub = pb_grpc.ContextSidecarStub(channel)
        for name, text in texts(size).items():
            before = cpu_seconds(sidecar.process.pid)
            try:
                answer = str(stub.CountTokens(pb.CountTokensRequest(token_counter="o200k_base", texts=[text]),
                                              timeout=600).counts[0]) + " tokens"
            except grpc.RpcError as error:
                answer = f"{error.code().name}: {(error.details() or '')[:60]}"
            spent = cpu_seconds(sidecar.process.pid) - before
            print(f"{size / (1 << 20):g} MiB, {name:24} {spent:6.2f} s CPU  {answer}", flush=True)


if __name__ == "__main__":
    main()
