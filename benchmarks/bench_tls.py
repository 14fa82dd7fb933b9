"""AssembleContext over TLS and mTLS against plaintext, measured in one run.

Three ``context-sidecar serve`` processes on this machine, each over its own LMDB folder and loaded
with the same corpus run (``_lib/workload.py``): ``plain``; ``tls`` (``[server.tls] cert_file`` and
``key_file``); ``mtls`` (``client_ca_file`` too, the client presenting its certificate). The CA and
certificates are made with openssl by the commands docs/running.md shows ("TLS and mTLS"). Each
server has one channel from this process, its credentials the Python client's
(``context_sidecar_client.ClientTls``), opened before the rounds: the handshake is paid once, as a
host pays it, and what is timed is a call on an open connection.

Calls, every one on every server in each interleaved round (drawn in a fresh order each round):

  bare      grpc.health.v1.Health/Check: the RPC machinery alone.
  assemble  AssembleContext re-assembling the run's last iteration (the read path).
  turn      AssembleContext appending one new event for a new iteration (a durable commit).
  connect   a new channel: the TCP connection and, over TLS, the handshake, then a health Check.

Printed: p50 and p99 of each, in microseconds, and each p50 over plain's p50 for the same call.

    python -m benchmarks.bench_tls [--events 10000] [--rounds 2000]
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc
from context_sidecar_client import ClientTls
from context_sidecar_client.tls import open_channel
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks._lib import corpus
from benchmarks._lib.harness import add_smoke_flag, interleaved, print_table, sidecar_address, smoke
from benchmarks._lib.workload import BUDGET, Calls, calls_for, sidecar_flags

KINDS = ("plain", "tls", "mtls")
CALLS = ("bare", "assemble", "turn", "connect")
NEW_CONTENTS = 512  # the contents turns cycle through, as bench_turn's
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]
EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-noenc"]
SERVER_NAMES = "subjectAltName=DNS:localhost,IP:127.0.0.1"


def openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


def make_certificates(folder: Path) -> None:
    """ca.pem, server.pem/.key and client.pem/.key in ``folder``, as docs/running.md makes them."""
    if shutil.which("openssl") is None:
        raise SystemExit("bench_tls makes its certificates with the openssl command, which is not installed")
    openssl(folder, "req", "-x509", "-new", *EC_KEY, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=bench CA")
    for name, extra in (("server", ["-addext", SERVER_NAMES]), ("client", [])):
        openssl(folder, "req", "-new", *EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN=bench {name}", *extra)
        openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "1", "-copy_extensions", "copyall", "-out", f"{name}.pem")


def server_flags(kind: str, folder: Path) -> list[str]:
    if kind == "plain":
        return []
    flags = ["--tls-cert-file", str(folder / "server.pem"), "--tls-key-file", str(folder / "server.key")]
    return flags + (["--tls-client-ca-file", str(folder / "ca.pem")] if kind == "mtls" else [])


def client_tls(kind: str, folder: Path) -> ClientTls | None:
    if kind == "plain":
        return None
    if kind == "tls":
        return ClientTls(folder / "ca.pem")
    return ClientTls(folder / "ca.pem", cert_file=folder / "client.pem", key_file=folder / "client.key")


def new_channel(address: str, tls: ClientTls | None, fresh: bool = False) -> grpc.Channel:
    """``fresh``: a connection of its own, never one another channel to the address opened (gRPC
    shares connections between channels of a process through a global pool by default)."""
    options = [*CHANNEL_OPTIONS, *([("grpc.use_local_subchannel_pool", 1)] if fresh else [])]
    return open_channel(grpc, address, options, tls)


def connect_call(address: str, tls: ClientTls | None) -> Callable[[], object]:
    """A new connection (its handshake over TLS) and a health Check on it."""
    request = health_pb2.HealthCheckRequest()

    def connect() -> object:
        channel = new_channel(address, tls, fresh=True)
        try:
            return health_pb2_grpc.HealthStub(channel).Check(request, wait_for_ready=True, timeout=30)
        finally:
            channel.close()

    return connect


@contextmanager
def servers(events: int) -> Iterator[Calls]:
    """The three sidecars, loaded, and their calls named "<kind> <call>"."""
    new_contents = corpus.contents(NEW_CONTENTS, seed=7)
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-tls-") as tmp, ExitStack() as stack:
        folder = Path(tmp)
        make_certificates(folder)
        calls: Calls = {}
        for kind in KINDS:
            flags = [*sidecar_flags(), *server_flags(kind, folder)]
            address = stack.enter_context(sidecar_address(folder / kind, flags))
            tls = client_tls(kind, folder)
            channel = new_channel(address, tls)
            stack.callback(channel.close)
            grpc.channel_ready_future(channel).result(timeout=60)
            named = calls_for(channel, events, new_contents) | {"connect": connect_call(address, tls)}
            calls.update({f"{kind} {call}": named[call] for call in CALLS})
        yield calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=10000, help="events in each server's run (default 10000)")
    # A round takes milliseconds: 2,000 of them, about a minute, steady the medians to a percent or two.
    parser.add_argument("--rounds", type=int, default=2000, help="measured interleaved rounds (default 2000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of each round's order (default 1)")
    add_smoke_flag(parser)
    args = smoke(parser.parse_args(), events=50, rounds=2)
    if args.events < 1 or args.rounds < 1:
        parser.error("--events and --rounds must be at least 1")
    with servers(args.events) as calls:
        samples = interleaved(calls, args.rounds, shuffle=random.Random(args.seed))
    print(f"\n{args.rounds} interleaved rounds, {args.events:,} events, {BUDGET // 1000}k budget, grpcio "
          f"{grpc.__version__}, Python {sys.version.split()[0]}; times in microseconds\n")
    rows = []
    for call in CALLS:
        plain = samples[f"plain {call}"].p50
        rows.append((call, *(f"{samples[f'{kind} {call}'].p50:,.0f}" for kind in KINDS),
                     *(f"{samples[f'{kind} {call}'].p99:,.0f}" for kind in KINDS),
                     *(f"{samples[f'{kind} {call}'].p50 / plain:.2f}" for kind in KINDS[1:])))
    print_table(("call", *(f"{kind} p50" for kind in KINDS), *(f"{kind} p99" for kind in KINDS),
                 "tls / plain p50", "mtls / plain p50"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
