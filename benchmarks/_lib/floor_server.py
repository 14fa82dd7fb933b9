"""A floor server: the sidecar's service name, with handlers that do only what a call cannot skip.

``benchmarks.bench_floors`` times each of the sidecar's calls beside one of these handlers, in a
process of its own as the sidecar is, so that a figure reads as a multiple of what any server
would pay for the same answer or the same write:

- ``--answer METHOD=FILE``: METHOD answers the bytes of FILE (a response message serialized once,
  read at start) to any request, unread: its serializers are the identity;
- ``--commit METHOD=BYTES``: METHOD makes one durable LMDB commit (py-lmdb, sync and metasync on,
  as the sidecar's store opens it) of one put of BYTES bytes under a new key, into an environment
  in ``--store``, and answers an empty message;
- ``--turn METHOD=BYTES:FILE``: all a turn cannot skip, in one handler: it reads the request
  (an AssembleContextRequest), counts each appended event's content with tiktoken o200k_base
  (``encode_ordinary``, as the sidecar counts), makes the commit of ``--commit``, and answers the
  bytes of FILE;
- ``--append METHOD=BYTES:FILE``: the same for an AppendEventsRequest: all AppendEvents cannot skip;
- the health service, so its own bare RPC can be set beside the sidecar's.

Every METHOD is registered under ``contextsidecar.v1.ContextSidecar``. It prints ``floor server
serving on HOST:PORT`` once it serves, and stops on SIGTERM or SIGINT.

    python -m benchmarks._lib.floor_server --store DIR [--answer METHOD=FILE ...] [--commit METHOD=BYTES ...]
        [--turn METHOD=BYTES:FILE ...] [--append METHOD=BYTES:FILE ...]
"""

from __future__ import annotations

import argparse
import itertools
import signal
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import lmdb
from context_sidecar_client.v1 import sidecar_pb2 as pb
from grpc_health.v1 import health, health_pb2_grpc

from sidecar.text.encodings import load_encoding
from sidecar.wire.server import SERVICE_NAME

READY = "floor server serving on "
MAP_SIZE = 4 << 30


def answering(answer: bytes) -> grpc.RpcMethodHandler:
    # No deserializer and no serializer: the request arrives as bytes and the answer leaves as it is.
    return grpc.unary_unary_rpc_method_handler(lambda request, context: answer)


def committer(env: lmdb.Environment, keys: Callable[[], int], size: int) -> Callable[[], None]:
    value = bytes(size)  # LMDB stores bytes as they are: zeros cost what any bytes cost

    def commit() -> None:
        with env.begin(write=True) as txn:
            txn.put(keys().to_bytes(8, "big"), value)

    return commit


def committing(env: lmdb.Environment, keys: Callable[[], int], size: int) -> grpc.RpcMethodHandler:
    commit = committer(env, keys, size)

    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        commit()
        return b""

    return grpc.unary_unary_rpc_method_handler(handle)


def whole(env: lmdb.Environment, keys: Callable[[], int], size: int, answer: bytes,
          events_of: Callable[[bytes], Any]) -> grpc.RpcMethodHandler:
    """All a writing call cannot skip: read its request, count the content of each event
    ``events_of`` finds in it, commit ``size`` bytes, answer ``answer``."""
    commit, encoding = committer(env, keys, size), load_encoding("o200k_base")

    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        for event in events_of(request):
            len(encoding.encode_ordinary(event.content))
        commit()
        return answer

    return grpc.unary_unary_rpc_method_handler(call)


# What --turn and --append read of their requests: the events whose contents they count.
EVENTS_OF: dict[str, Callable[[bytes], Any]] = {
    "turn": lambda request: pb.AssembleContextRequest.FromString(request).append_events,
    "append": lambda request: pb.AppendEventsRequest.FromString(request).events,
}


def method_and_value(argument: str) -> tuple[str, str]:
    method, _, value = argument.partition("=")
    return method, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="a folder for the LMDB environment")
    parser.add_argument("--answer", action="append", default=[], type=method_and_value, metavar="METHOD=FILE")
    parser.add_argument("--commit", action="append", default=[], type=method_and_value, metavar="METHOD=BYTES")
    parser.add_argument("--turn", action="append", default=[], type=method_and_value, metavar="METHOD=BYTES:FILE")
    parser.add_argument("--append", action="append", default=[], type=method_and_value, metavar="METHOD=BYTES:FILE")
    parser.add_argument("--listen", default="127.0.0.1:0")
    args = parser.parse_args()
    env = lmdb.open(str(args.store), map_size=MAP_SIZE, sync=True, metasync=True)
    keys = itertools.count().__next__  # one key sequence for every commit METHOD: they share the environment
    handlers = {method: answering(Path(file).read_bytes()) for method, file in args.answer}
    handlers |= {method: committing(env, keys, int(size)) for method, size in args.commit}
    for kind in EVENTS_OF:
        for method, value in getattr(args, kind):
            size, _, file = value.partition(":")
            handlers[method] = whole(env, keys, int(size), Path(file).read_bytes(), EVENTS_OF[kind])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port(args.listen)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    server.start()
    print(f"{READY}{args.listen.rpartition(':')[0]}:{port}", flush=True)
    stopping.wait()
    server.stop(0).wait()
    env.close()


if __name__ == "__main__":
    main()
