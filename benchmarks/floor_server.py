"""A floor server: the sidecar's service name, with handlers that do only what a call cannot skip.

``benchmarks.floors`` times each of the sidecar's calls beside one of these handlers, in a
process of its own as the sidecar is, so that a figure reads as a multiple of what any server
would pay for the same answer or the same write:

- ``--answer METHOD=FILE``: METHOD answers the bytes of FILE (a response message serialized once,
  read at start) to any request, unread: its serializers are the identity;
- ``--commit METHOD=BYTES``: METHOD makes one durable LMDB commit (py-lmdb, sync and metasync on,
  as the sidecar's store opens it) of one put of BYTES bytes under a new key, into an environment
  in ``--store``, and answers an empty message;
- the health service, so its own bare RPC can be set beside the sidecar's.

Every METHOD is registered under ``contextsidecar.v1.ContextSidecar``. It prints ``floor server
serving on HOST:PORT`` once it serves, and stops on SIGTERM or SIGINT.

    python -m benchmarks.floor_server --store DIR [--answer METHOD=FILE ...] [--commit METHOD=BYTES ...]
"""

from __future__ import annotations

import argparse
import itertools
import signal
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import lmdb
from grpc_health.v1 import health, health_pb2_grpc

from sidecar.wire.server import SERVICE_NAME

READY = "floor server serving on "
MAP_SIZE = 4 << 30


def answering(answer: bytes) -> grpc.RpcMethodHandler:
    # No deserializer and no serializer: the request arrives as bytes and the answer leaves as it is.
    return grpc.unary_unary_rpc_method_handler(lambda request, context: answer)


def committing(env: lmdb.Environment, keys: Callable[[], int], size: int) -> grpc.RpcMethodHandler:
    value = bytes(size)  # LMDB stores bytes as they are: zeros cost what any bytes cost

    def commit(request: bytes, context: grpc.ServicerContext) -> bytes:
        with env.begin(write=True) as txn:
            txn.put(keys().to_bytes(8, "big"), value)
        return b""

    return grpc.unary_unary_rpc_method_handler(commit)


def method_and_value(argument: str) -> tuple[str, str]:
    method, _, value = argument.partition("=")
    return method, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="a folder for the LMDB environment")
    parser.add_argument("--answer", action="append", default=[], type=method_and_value, metavar="METHOD=FILE")
    parser.add_argument("--commit", action="append", default=[], type=method_and_value, metavar="METHOD=BYTES")
    parser.add_argument("--listen", default="127.0.0.1:0")
    args = parser.parse_args()
    env = lmdb.open(str(args.store), map_size=MAP_SIZE, sync=True, metasync=True)
    keys = itertools.count().__next__  # one key sequence for every commit METHOD: they share the environment
    handlers = {method: answering(Path(file).read_bytes()) for method, file in args.answer}
    handlers |= {method: committing(env, keys, int(size)) for method, size in args.commit}
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
