"""What the benchmarks share: a real sidecar process, percentile samples (by sidecar.bench.report's
percentile), interleaved rounds, the printed table, ``--smoke``; their corpus is ``corpus``
(sidecar.bench.workload's), their workloads ``workload``."""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from sidecar.bench.report import percentile

READY = "context-sidecar serving on "
# --smoke: every benchmark once at tiny sizes, to prove it still runs (its figures mean nothing).
SMOKE = {"on": False}


def add_smoke_flag(parser: argparse.ArgumentParser) -> None:
    """``--smoke``, which every benchmark accepts: one round at tiny sizes, still a real sidecar."""
    parser.add_argument("--smoke", action="store_true",
                        help="one round at tiny sizes, to check the benchmark runs (its figures mean nothing)")


def smoke(args: argparse.Namespace, **tiny: object) -> argparse.Namespace:
    """``args`` with ``tiny``'s values in place when ``--smoke`` is given; warm-ups shrink to a call."""
    if args.smoke:
        SMOKE["on"] = True
        for name, value in tiny.items():
            setattr(args, name, value)
    return args


def warm(calls: int) -> int:
    """Warm-up calls: ``calls``, or one under ``--smoke``."""
    return min(calls, 1) if SMOKE["on"] else calls


def print_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """A Markdown table, its first column left-aligned and the others (figures) right-aligned."""
    print(f"| {' | '.join(header)} |\n|---|{'---:|' * (len(header) - 1)}")
    for row in rows:
        print(f"| {' | '.join(str(cell) for cell in row)} |")


@dataclass
class Samples:
    seconds: list[float] = field(default_factory=list)

    def percentile(self, fraction: float) -> float:
        """Microseconds; the nearest rank, as ``context-sidecar bench`` reports."""
        return percentile(self.seconds, fraction) * 1e6

    @property
    def p50(self) -> float:
        return self.percentile(0.5)

    @property
    def p99(self) -> float:
        return self.percentile(0.99)


@dataclass(frozen=True)
class Serving:
    """A server process while it runs, and the address it listens on."""

    process: subprocess.Popen
    address: str


@contextmanager
def serving(command: Sequence[str], ready: str = READY, env: dict[str, str] | None = None,
            cwd: Path | None = None, told: bool = False) -> Iterator[Serving]:
    """Start ``command``, a server that prints ``ready`` and its address as its first line on
    stdout once it serves; terminate it afterwards. ``told``: its stdin is a pipe to write to."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd,
                               stdin=subprocess.PIPE if told else None)
    assert process.stdout is not None  # a pipe: stdout=PIPE
    try:
        line = process.stdout.readline()
        if not line.startswith(ready):
            raise SystemExit(f"{' '.join(command[:3])} did not start: {line!r}")
        yield Serving(process, line[len(ready):].strip())
    finally:
        process.terminate()
        process.wait(timeout=60)


@contextmanager
def sidecar_serving(storage: Path, flags: Sequence[str], server_env: dict[str, str] | None = None,
                    tree: Path | None = None) -> Iterator[Serving]:
    """``python -m sidecar serve`` on a free loopback port, while it runs.
    ``tree``: a source tree (with fastcore compiled in place) whose sidecar runs instead of the
    installed one: ``-m`` looks in the working directory first."""
    command = [sys.executable, "-m", "sidecar", "serve", "--listen", "127.0.0.1:0", "--storage-path", str(storage),
               "--log-level", "WARNING", *flags]
    env = {**os.environ, **(server_env or {}), **({"PYTHONPATH": str(tree)} if tree else {})}
    with serving(command, READY, env, tree) as sidecar:
        yield sidecar


@contextmanager
def sidecar_address(storage: Path, flags: Sequence[str], server_env: dict[str, str] | None = None,
                    tree: Path | None = None) -> Iterator[str]:
    """The same sidecar's address while it runs."""
    with sidecar_serving(storage, flags, server_env, tree) as sidecar:
        yield sidecar.address


@contextmanager
def channel_to(address: str) -> Iterator[grpc.Channel]:
    """A raw channel (for the benchmarks that time the stubs), closed afterwards."""
    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])
    try:
        yield channel
    finally:
        channel.close()


@contextmanager
def sidecar_process(storage: Path, flags: Sequence[str], server_env: dict[str, str] | None = None,
                    tree: Path | None = None) -> Iterator[grpc.Channel]:
    """The same sidecar, and a raw channel to it."""
    with sidecar_address(storage, flags, server_env, tree) as address, channel_to(address) as channel:
        yield channel


def interleaved(calls: dict[str, Callable[[], object]], rounds: int, warmup: int = 20,
                shuffle: random.Random | None = None) -> dict[str, Samples]:
    """Time every call once per round, in an order that rotates each round, so the drift of a
    shared machine hits every figure alike. A rotation keeps each call's predecessor (a call to
    the same process, to another, or a pause in this one), which moves a fast call's time by tens
    of microseconds; ``shuffle`` draws each round's order afresh, so no call keeps one."""
    keys = list(calls)
    for _ in range(warm(warmup)):
        for call in calls.values():
            call()
    samples = {key: Samples() for key in keys}
    for round_ in range(rounds):
        offset = round_ % len(keys)
        for key in shuffle.sample(keys, len(keys)) if shuffle else keys[offset:] + keys[:offset]:
            begin = time.perf_counter()
            calls[key]()
            samples[key].seconds.append(time.perf_counter() - begin)
    return samples
