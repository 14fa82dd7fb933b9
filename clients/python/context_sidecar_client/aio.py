"""The asyncio twin of ``context_sidecar_client.Client`` (grpc.aio): the same methods, each a coroutine,
with the same deadlines, retries and errors.

    from context_sidecar_client.aio import AsyncClient
    async with AsyncClient("127.0.0.1:50051") as sidecar:
        turn = await sidecar.assemble_context(run_id="run-1", iteration=1, append_events=[...])

Create it inside the event loop that uses it (grpc.aio binds a channel to its loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
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

__all__ = ["AsyncClient", "AsyncWatch"]


class AsyncClient:
    """Each method is ``Client``'s of the same name (its docstring says what the RPC does), awaited."""

    def __init__(self, target: str, token: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT,
                 retries: int = DEFAULT_RETRIES, channel_options: tuple[tuple[str, Any], ...] = (),
                 tls: ClientTls | None = None) -> None:
        self._metadata = call_metadata(token)
        self._timeout, self._retries = timeout, retries
        self._channel = open_channel(grpc.aio, target, [*CHANNEL_OPTIONS, *channel_options], tls)
        self._stub = pb_grpc.ContextSidecarStub(self._channel)  # type: ignore[no-untyped-call]
        self._health_check = health_check(self._channel)

    async def close(self) -> None:
        await self._channel.close(grace=None)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()

    async def _invoke(self, method: str, rpc: Any, request: Message, timeout: float | None,
                      answer: type[Answer]) -> Answer:
        """The call, retried as calls.py says; ``answer`` is its response's type."""
        timeout = self._timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        retries = self._retries if retryable(method, request) else 0
        retry = 0
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                response: Answer = await rpc(request, timeout=remaining, metadata=self._metadata)
                return response
            except grpc.RpcError as error:
                retry += 1
                pause = pause_before_retry(method, error.code(), retry, retries,
                                           None if deadline is None else deadline - time.monotonic())
                if pause is None:
                    raise call_error(method, error) from error
                await asyncio.sleep(pause)

    async def _call(self, rpc: str, fields: Mapping[str, Any], timeout: float | None,
                    answer: type[Answer]) -> Answer:
        return await self._invoke(rpc, getattr(self._stub, rpc), REQUESTS[rpc](**fields), timeout, answer)

    async def check_health(self, *, service: str = "",
                           timeout: float | None = None) -> wire_pb2.HealthCheckResponse:
        return await self._invoke("Health/Check", self._health_check, wire_pb2.HealthCheckRequest(service=service),
                                  timeout, wire_pb2.HealthCheckResponse)

    async def watch_events(self, *, timeout: float | None = None,
                           **fields: Unpack[messages.WatchEventsRequest]) -> AsyncWatch:
        call = self._stub.WatchEvents(REQUESTS["WatchEvents"](**fields), timeout=timeout, metadata=self._metadata)
        await call.initial_metadata()  # the sidecar sends its headers once the watch is registered
        return AsyncWatch(call)

    async def open_run(self, *, timeout: float | None = None,
                       **fields: Unpack[messages.OpenRunRequest]) -> pb.OpenRunResponse:
        return await self._call("OpenRun", fields, timeout, pb.OpenRunResponse)

    async def append_events(self, *, timeout: float | None = None,
                            **fields: Unpack[messages.AppendEventsRequest]) -> pb.AppendEventsResponse:
        return await self._call("AppendEvents", fields, timeout, pb.AppendEventsResponse)

    async def list_run_events(self, *, timeout: float | None = None,
                              **fields: Unpack[messages.ListRunEventsRequest]) -> pb.ListRunEventsResponse:
        return await self._call("ListRunEvents", fields, timeout, pb.ListRunEventsResponse)

    async def assemble_context(self, *, timeout: float | None = None,
                               **fields: Unpack[messages.AssembleContextRequest]) -> pb.AssembleContextResponse:
        return await self._call("AssembleContext", fields, timeout, pb.AssembleContextResponse)

    async def get_transcript_window(self, *, timeout: float | None = None,
                                    **fields: Unpack[messages.GetTranscriptWindowRequest]
                                    ) -> pb.GetTranscriptWindowResponse:
        return await self._call("GetTranscriptWindow", fields, timeout, pb.GetTranscriptWindowResponse)

    async def count_tokens(self, *, timeout: float | None = None,
                           **fields: Unpack[messages.CountTokensRequest]) -> pb.CountTokensResponse:
        return await self._call("CountTokens", fields, timeout, pb.CountTokensResponse)

    async def get_capabilities(self, *, timeout: float | None = None,
                               **fields: Unpack[messages.GetCapabilitiesRequest]) -> pb.GetCapabilitiesResponse:
        return await self._call("GetCapabilities", fields, timeout, pb.GetCapabilitiesResponse)

    async def record_summary(self, *, timeout: float | None = None,
                             **fields: Unpack[messages.RecordSummaryRequest]) -> pb.RecordSummaryResponse:
        return await self._call("RecordSummary", fields, timeout, pb.RecordSummaryResponse)

    async def get_artifact(self, *, timeout: float | None = None,
                           **fields: Unpack[messages.GetArtifactRequest]) -> pb.GetArtifactResponse:
        return await self._call("GetArtifact", fields, timeout, pb.GetArtifactResponse)

    async def delete_artifact(self, *, timeout: float | None = None,
                              **fields: Unpack[messages.DeleteArtifactRequest]) -> pb.DeleteArtifactResponse:
        return await self._call("DeleteArtifact", fields, timeout, pb.DeleteArtifactResponse)

    async def fork_run(self, *, timeout: float | None = None,
                       **fields: Unpack[messages.ForkRunRequest]) -> pb.ForkRunResponse:
        return await self._call("ForkRun", fields, timeout, pb.ForkRunResponse)

    async def delete_run(self, *, timeout: float | None = None,
                         **fields: Unpack[messages.DeleteRunRequest]) -> pb.DeleteRunResponse:
        return await self._call("DeleteRun", fields, timeout, pb.DeleteRunResponse)

    async def put_memory(self, *, timeout: float | None = None,
                         **fields: Unpack[messages.PutMemoryRequest]) -> pb.PutMemoryResponse:
        return await self._call("PutMemory", fields, timeout, pb.PutMemoryResponse)

    async def get_memory(self, *, timeout: float | None = None,
                         **fields: Unpack[messages.GetMemoryRequest]) -> pb.MemoryEntry:
        return await self._call("GetMemory", fields, timeout, pb.MemoryEntry)

    async def delete_memory(self, *, timeout: float | None = None,
                            **fields: Unpack[messages.DeleteMemoryRequest]) -> pb.DeleteMemoryResponse:
        return await self._call("DeleteMemory", fields, timeout, pb.DeleteMemoryResponse)

    async def list_memory(self, *, timeout: float | None = None,
                          **fields: Unpack[messages.ListMemoryRequest]) -> pb.ListMemoryResponse:
        return await self._call("ListMemory", fields, timeout, pb.ListMemoryResponse)

    async def register_secrets(self, *, timeout: float | None = None,
                               **fields: Unpack[messages.RegisterSecretsRequest]) -> pb.RegisterSecretsResponse:
        return await self._call("RegisterSecrets", fields, timeout, pb.RegisterSecretsResponse)

    async def forget_secrets(self, *, timeout: float | None = None,
                             **fields: Unpack[messages.ForgetSecretsRequest]) -> pb.ForgetSecretsResponse:
        return await self._call("ForgetSecrets", fields, timeout, pb.ForgetSecretsResponse)

    async def compact_memory(self, *, timeout: float | None = None,
                             **fields: Unpack[messages.CompactMemoryRequest]) -> pb.CompactMemoryResponse:
        return await self._call("CompactMemory", fields, timeout, pb.CompactMemoryResponse)

    async def list_memory_events(self, *, timeout: float | None = None,
                                 **fields: Unpack[messages.ListMemoryEventsRequest]) -> pb.ListMemoryEventsResponse:
        return await self._call("ListMemoryEvents", fields, timeout, pb.ListMemoryEventsResponse)

    async def update_profile(self, *, timeout: float | None = None,
                             **fields: Unpack[messages.UpdateProfileRequest]) -> pb.UpdateProfileResponse:
        return await self._call("UpdateProfile", fields, timeout, pb.UpdateProfileResponse)

    async def update_task(self, *, timeout: float | None = None,
                          **fields: Unpack[messages.UpdateTaskRequest]) -> pb.UpdateTaskResponse:
        return await self._call("UpdateTask", fields, timeout, pb.UpdateTaskResponse)

    async def load_skill(self, *, timeout: float | None = None,
                         **fields: Unpack[messages.LoadSkillRequest]) -> pb.LoadSkillResponse:
        return await self._call("LoadSkill", fields, timeout, pb.LoadSkillResponse)

    async def unload_skill(self, *, timeout: float | None = None,
                           **fields: Unpack[messages.UnloadSkillRequest]) -> pb.UnloadSkillResponse:
        return await self._call("UnloadSkill", fields, timeout, pb.UnloadSkillResponse)

    async def put_state_data(self, *, timeout: float | None = None,
                             **fields: Unpack[messages.PutStateDataRequest]) -> pb.PutStateDataResponse:
        return await self._call("PutStateData", fields, timeout, pb.PutStateDataResponse)

    async def get_state(self, *, timeout: float | None = None,
                        **fields: Unpack[messages.GetStateRequest]) -> pb.AgentState:
        return await self._call("GetState", fields, timeout, pb.AgentState)

    async def record_usage(self, *, timeout: float | None = None,
                           **fields: Unpack[messages.RecordUsageRequest]) -> pb.Usage:
        return await self._call("RecordUsage", fields, timeout, pb.Usage)

    async def list_compaction_records(self, *, timeout: float | None = None,
                                      **fields: Unpack[messages.ListCompactionRecordsRequest]
                                      ) -> pb.ListCompactionRecordsResponse:
        return await self._call("ListCompactionRecords", fields, timeout, pb.ListCompactionRecordsResponse)


class AsyncWatch(AsyncIterator[pb.EventNotice]):
    """The events of a WatchEvents call, as they come; iteration ends once ``cancel()`` is called."""

    def __init__(self, call: Any) -> None:
        self._call, self._notices = call, call.__aiter__()

    async def __anext__(self) -> pb.EventNotice:
        try:
            notice: pb.EventNotice = await self._notices.__anext__()
            return notice
        except (asyncio.CancelledError, grpc.RpcError) as error:
            if self._call.cancelled():
                raise StopAsyncIteration from None
            if isinstance(error, grpc.RpcError):
                raise call_error("WatchEvents", error) from error
            raise

    def cancel(self) -> None:
        self._call.cancel()
