"""The blocking client: ``context_sidecar_client.Client`` (the package's docstring says how to use it)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar, Unpack

import grpc
from google.protobuf.message import Message

from context_sidecar_client import fields as messages
from context_sidecar_client import wire_pb2
from context_sidecar_client.calls import (
    CHANNEL_OPTIONS,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    REQUESTS,
    call_metadata,
    health_check,
    pause_before_retry,
    retryable,
)
from context_sidecar_client.errors import call_error
from context_sidecar_client.tls import ClientTls, open_channel
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc

Answer = TypeVar("Answer", bound=Message)  # a call's response message

__all__ = ["Client", "Watch"]


class Client:
    """A blocking client: safe to share between threads (grpc's channel is)."""

    def __init__(self, target: str, token: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT,
                 retries: int = DEFAULT_RETRIES, channel_options: tuple[tuple[str, Any], ...] = (),
                 tls: ClientTls | None = None) -> None:
        """``target``: "127.0.0.1:50051", "sidecar.internal:50051" or "unix:///path.sock".
        ``token``: the tenant's bearer token when the sidecar has tenants. ``timeout``: seconds per
        call, None for no deadline. ``tls``: for a sidecar with ``[server.tls]``, the CA to trust
        (and the client's certificate under mTLS); None: plaintext."""
        self._metadata = call_metadata(token)
        self._timeout, self._retries = timeout, retries
        self._channel = open_channel(grpc, target, [*CHANNEL_OPTIONS, *channel_options], tls)
        self._stub = pb_grpc.ContextSidecarStub(self._channel)  # type: ignore[no-untyped-call]
        self._health_check = health_check(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _invoke(self, method: str, rpc: Any, request: Message, timeout: float | None,
                answer: type[Answer]) -> Answer:
        """The call, retried as calls.py says; ``answer`` is its response's type."""
        timeout = self._timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        retries = self._retries if retryable(method, request) else 0
        retry = 0
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                response: Answer = rpc(request, timeout=remaining, metadata=self._metadata)
                return response
            except grpc.RpcError as error:
                retry += 1
                pause = pause_before_retry(method, error.code(), retry, retries,
                                           None if deadline is None else deadline - time.monotonic())
                if pause is None:
                    raise call_error(method, error) from error
                time.sleep(pause)

    def _call(self, rpc: str, fields: Mapping[str, Any], timeout: float | None,
              answer: type[Answer]) -> Answer:
        return self._invoke(rpc, getattr(self._stub, rpc), REQUESTS[rpc](**fields), timeout, answer)

    def check_health(self, *, service: str = "", timeout: float | None = None) -> wire_pb2.HealthCheckResponse:
        """grpc.health.v1.Health/Check: SERVING once the sidecar accepts calls."""
        return self._invoke("Health/Check", self._health_check, wire_pb2.HealthCheckRequest(service=service),
                            timeout, wire_pb2.HealthCheckResponse)

    # The transcript.

    def open_run(self, *, timeout: float | None = None,
                 **fields: Unpack[messages.OpenRunRequest]) -> pb.OpenRunResponse:
        """Create a run, or confirm an existing one (every field given must equal the run's)."""
        return self._call("OpenRun", fields, timeout, pb.OpenRunResponse)

    def append_events(self, *, timeout: float | None = None,
                      **fields: Unpack[messages.AppendEventsRequest]) -> pb.AppendEventsResponse:
        """Append events in one transaction; a re-sent event answers already_recorded."""
        return self._call("AppendEvents", fields, timeout, pb.AppendEventsResponse)

    def list_run_events(self, *, timeout: float | None = None,
                        **fields: Unpack[messages.ListRunEventsRequest]) -> pb.ListRunEventsResponse:
        """A page of the stored events with their token counts."""
        return self._call("ListRunEvents", fields, timeout, pb.ListRunEventsResponse)

    def assemble_context(self, *, timeout: float | None = None,
                         **fields: Unpack[messages.AssembleContextRequest]) -> pb.AssembleContextResponse:
        """The per-turn call: append the turn's events, answer its window under the budget."""
        return self._call("AssembleContext", fields, timeout, pb.AssembleContextResponse)

    def get_transcript_window(self, *, timeout: float | None = None,
                              **fields: Unpack[messages.GetTranscriptWindowRequest]) -> pb.GetTranscriptWindowResponse:
        """What AssembleContext fed for an iteration."""
        return self._call("GetTranscriptWindow", fields, timeout, pb.GetTranscriptWindowResponse)

    def count_tokens(self, *, timeout: float | None = None,
                     **fields: Unpack[messages.CountTokensRequest]) -> pb.CountTokensResponse:
        """Count texts in a token counter."""
        return self._call("CountTokens", fields, timeout, pb.CountTokensResponse)

    def get_capabilities(self, *, timeout: float | None = None,
                         **fields: Unpack[messages.GetCapabilitiesRequest]) -> pb.GetCapabilitiesResponse:
        """The capability document (JSON)."""
        return self._call("GetCapabilities", fields, timeout, pb.GetCapabilitiesResponse)

    def record_summary(self, *, timeout: float | None = None,
                       **fields: Unpack[messages.RecordSummaryRequest]) -> pb.RecordSummaryResponse:
        """Record the host's summary of the oldest unsummarised turns (compaction.due)."""
        return self._call("RecordSummary", fields, timeout, pb.RecordSummaryResponse)

    def get_artifact(self, *, timeout: float | None = None,
                     **fields: Unpack[messages.GetArtifactRequest]) -> pb.GetArtifactResponse:
        """A summary's text."""
        return self._call("GetArtifact", fields, timeout, pb.GetArtifactResponse)

    def delete_artifact(self, *, timeout: float | None = None,
                        **fields: Unpack[messages.DeleteArtifactRequest]) -> pb.DeleteArtifactResponse:
        """Delete a summary's text (not retried)."""
        return self._call("DeleteArtifact", fields, timeout, pb.DeleteArtifactResponse)

    def fork_run(self, *, timeout: float | None = None,
                 **fields: Unpack[messages.ForkRunRequest]) -> pb.ForkRunResponse:
        """A replay or branch fork of a run from a seq."""
        return self._call("ForkRun", fields, timeout, pb.ForkRunResponse)

    def delete_run(self, *, timeout: float | None = None,
                   **fields: Unpack[messages.DeleteRunRequest]) -> pb.DeleteRunResponse:
        """Remove a run and all it holds (not retried)."""
        return self._call("DeleteRun", fields, timeout, pb.DeleteRunResponse)

    # Memory.

    def put_memory(self, *, timeout: float | None = None,
                   **fields: Unpack[messages.PutMemoryRequest]) -> pb.PutMemoryResponse:
        """Store a memory entry (retried only with an entry_id)."""
        return self._call("PutMemory", fields, timeout, pb.PutMemoryResponse)

    def get_memory(self, *, timeout: float | None = None,
                   **fields: Unpack[messages.GetMemoryRequest]) -> pb.MemoryEntry:
        """One memory entry."""
        return self._call("GetMemory", fields, timeout, pb.MemoryEntry)

    def delete_memory(self, *, timeout: float | None = None,
                      **fields: Unpack[messages.DeleteMemoryRequest]) -> pb.DeleteMemoryResponse:
        """Delete a memory entry (not retried)."""
        return self._call("DeleteMemory", fields, timeout, pb.DeleteMemoryResponse)

    def list_memory(self, *, timeout: float | None = None,
                    **fields: Unpack[messages.ListMemoryRequest]) -> pb.ListMemoryResponse:
        """A token-bounded prefix of the entries ranked by recency or relevance; whole entries only."""
        return self._call("ListMemory", fields, timeout, pb.ListMemoryResponse)

    def register_secrets(self, *, timeout: float | None = None,
                         **fields: Unpack[messages.RegisterSecretsRequest]) -> pb.RegisterSecretsResponse:
        """Secrets to redact from everything written afterwards."""
        return self._call("RegisterSecrets", fields, timeout, pb.RegisterSecretsResponse)

    def forget_secrets(self, *, timeout: float | None = None,
                       **fields: Unpack[messages.ForgetSecretsRequest]) -> pb.ForgetSecretsResponse:
        """Forget registered secrets."""
        return self._call("ForgetSecrets", fields, timeout, pb.ForgetSecretsResponse)

    def compact_memory(self, *, timeout: float | None = None,
                       **fields: Unpack[messages.CompactMemoryRequest]) -> pb.CompactMemoryResponse:
        """Distil memory entries into one (retried only with source_ids)."""
        return self._call("CompactMemory", fields, timeout, pb.CompactMemoryResponse)

    def list_memory_events(self, *, timeout: float | None = None,
                           **fields: Unpack[messages.ListMemoryEventsRequest]) -> pb.ListMemoryEventsResponse:
        """The tenant's kept events (memory.compacted) after a seq."""
        return self._call("ListMemoryEvents", fields, timeout, pb.ListMemoryEventsResponse)

    def watch_events(self, *, timeout: float | None = None, **fields: Unpack[messages.WatchEventsRequest]) -> Watch:
        """The tenant's new events, live. Returns once the watch is registered, so every event
        committed afterwards is delivered; runs until ``cancel()`` (no deadline unless given)."""
        call = self._stub.WatchEvents(REQUESTS["WatchEvents"](**fields), timeout=timeout, metadata=self._metadata)
        call.initial_metadata()  # the sidecar sends its headers once the watch is registered
        return Watch(call)

    # The context window.

    def update_profile(self, *, timeout: float | None = None,
                       **fields: Unpack[messages.UpdateProfileRequest]) -> pb.UpdateProfileResponse:
        """Replace the run's profile (the static sections and tools)."""
        return self._call("UpdateProfile", fields, timeout, pb.UpdateProfileResponse)

    def update_task(self, *, timeout: float | None = None,
                    **fields: Unpack[messages.UpdateTaskRequest]) -> pb.UpdateTaskResponse:
        """Replace the run's task."""
        return self._call("UpdateTask", fields, timeout, pb.UpdateTaskResponse)

    def load_skill(self, *, timeout: float | None = None,
                   **fields: Unpack[messages.LoadSkillRequest]) -> pb.LoadSkillResponse:
        """Load (or replace) a skill's body into the run's per-task sections."""
        return self._call("LoadSkill", fields, timeout, pb.LoadSkillResponse)

    def unload_skill(self, *, timeout: float | None = None,
                     **fields: Unpack[messages.UnloadSkillRequest]) -> pb.UnloadSkillResponse:
        """Unload a skill (not retried)."""
        return self._call("UnloadSkill", fields, timeout, pb.UnloadSkillResponse)

    def put_state_data(self, *, timeout: float | None = None,
                       **fields: Unpack[messages.PutStateDataRequest]) -> pb.PutStateDataResponse:
        """Set one named subset of the run's agent-state data (JSON)."""
        return self._call("PutStateData", fields, timeout, pb.PutStateDataResponse)

    def get_state(self, *, timeout: float | None = None, **fields: Unpack[messages.GetStateRequest]) -> pb.AgentState:
        """The run's agent state."""
        return self._call("GetState", fields, timeout, pb.AgentState)

    def record_usage(self, *, timeout: float | None = None, **fields: Unpack[messages.RecordUsageRequest]) -> pb.Usage:
        """What the provider reported for an assembled iteration."""
        return self._call("RecordUsage", fields, timeout, pb.Usage)

    def list_compaction_records(self, *, timeout: float | None = None,
                                **fields: Unpack[messages.ListCompactionRecordsRequest]
                                ) -> pb.ListCompactionRecordsResponse:
        """The run's compactions, oldest first."""
        return self._call("ListCompactionRecords", fields, timeout, pb.ListCompactionRecordsResponse)


class Watch(Iterator[pb.EventNotice]):
    """The events of a WatchEvents call, as they come; iteration ends once ``cancel()`` is called."""

    def __init__(self, call: Any) -> None:
        self._call, self._cancelled = call, False

    def __next__(self) -> pb.EventNotice:
        try:
            notice: pb.EventNotice = next(self._call)
            return notice
        except grpc.RpcError as error:
            if self._cancelled and error.code() is grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise call_error("WatchEvents", error) from error

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()
