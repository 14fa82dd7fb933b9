"""What the blocking and the asyncio client share: which calls may be retried, the pause
between attempts, the call metadata, the health Check's method (errors.py: what a failed call raises).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from context_sidecar_client import wire_pb2
from context_sidecar_client.v1 import sidecar_pb2 as pb

log = logging.getLogger("context_sidecar_client")

# Each RPC's request message, from the service's descriptor: a method passes the RPC's name and
# its keyword arguments, and cannot build another RPC's request.
REQUESTS: dict[str, type[Message]] = {method.name: getattr(pb, method.input_type.name)
                                      for method in pb.DESCRIPTOR.services_by_name["ContextSidecar"].methods}

DEFAULT_TIMEOUT = 30.0  # seconds, the whole call with its retries; Node's client waits as long
DEFAULT_RETRIES = 4  # after the first attempt: up to 1.5 s of pauses, enough for a sidecar restart
FIRST_PAUSE, LONGEST_PAUSE = 0.1, 2.0  # seconds, doubling per retry, each drawn from [half, whole]

# A sidecar restarted on loopback is back in well under a second: grpc's default first reconnect
# backoff (1 s) would fail every retry within it at once, without trying to connect.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (("grpc.initial_reconnect_backoff_ms", 100),
                                                ("grpc.max_reconnect_backoff_ms", 2000))

# UNAVAILABLE may come after the sidecar did the work and before its answer arrived, so only a
# call whose repeat leaves what one call leaves, and answers without an error, is tried again:
# the reads; the writes of things the host names, which the sidecar answers a second time as
# already done (a recorded event: already_recorded; the same summary, fork or compaction:
# created false; an open run confirmed); and the writes that replace a value with the same one.
# Never retried: the deletes and UnloadSkill (a repeat would answer NOT_FOUND for what the first
# attempt removed), and WatchEvents (a stream: resume it with ListMemoryEvents since_seq).
IDEMPOTENT = frozenset({
    "Health/Check", "OpenRun", "AppendEvents", "ListRunEvents", "AssembleContext", "GetTranscriptWindow", "CountTokens",
    "GetCapabilities", "RecordSummary", "GetArtifact", "ForkRun", "GetMemory", "ListMemory", "RegisterSecrets",
    "ForgetSecrets", "UpdateProfile", "UpdateTask", "LoadSkill", "PutStateData", "GetState", "RecordUsage",
    "ListCompactionRecords", "ListMemoryEvents",
})
# Idempotent only when the request names what it writes: without entry_id each PutMemory makes a
# new entry; without source_ids each CompactMemory distils whatever the oldest entries are then.
IDEMPOTENT_WHEN: dict[str, Callable[[Any], bool]] = {
    "PutMemory": lambda request: bool(request.entry_id),
    "CompactMemory": lambda request: bool(request.source_ids),
}


def retryable(method: str, request: Message) -> bool:
    return method in IDEMPOTENT or (method in IDEMPOTENT_WHEN and IDEMPOTENT_WHEN[method](request))


def pause_before_retry(method: str, code: grpc.StatusCode, retry: int, retries: int,
                       remaining: float | None) -> float | None:
    """Seconds to wait before retry number ``retry`` (1-based) of a failed attempt, or None:
    give up. Only UNAVAILABLE is retried, and never past the call's deadline."""
    if code is not grpc.StatusCode.UNAVAILABLE or retry > retries:
        return None
    pause: float = min(LONGEST_PAUSE, FIRST_PAUSE * 2.0 ** (retry - 1)) * random.uniform(0.5, 1.0)
    if remaining is not None and pause >= remaining:
        return None
    log.warning("%s: the sidecar is unavailable; retry %d of %d in %.2f s", method, retry, retries, pause)
    return pause


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The bearer token every call carries when the sidecar has tenants (none otherwise)."""
    if token is None:
        return ()
    if not isinstance(token, str) or not token:
        raise TypeError("token must be a non-empty string")
    return (("authorization", f"Bearer {token}"),)


# grpc.health.v1.Health/Check, with the client's own copies of its two messages (wire.proto).
HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def health_check(channel: grpc.Channel | grpc.aio.Channel) -> Any:
    """The health Check as a callable of the channel, like a generated stub's method."""
    return channel.unary_unary(HEALTH_CHECK, request_serializer=wire_pb2.HealthCheckRequest.SerializeToString,
                               response_deserializer=wire_pb2.HealthCheckResponse.FromString)
