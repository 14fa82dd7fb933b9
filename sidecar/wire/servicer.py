"""The wire: each RPC converts protobuf to domain values, calls the domain, converts back.

Two kinds of answer leave here: protobuf messages, and :data:`~sidecar.wire.splice.Encoded`
bytes spliced from stored records (AssembleContext, GetMemory, ListMemory; see
``sidecar.wire.splice``). Who the caller is comes from ``sidecar.wire.auth``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import grpc
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc
from google.protobuf import message

from sidecar.errors import CompactionDisabled
from sidecar.memory.api import ListRequest, Memories
from sidecar.memory.compaction import Compactor
from sidecar.tenant_events.log import TenantEventLog
from sidecar.text.redaction import Redactor
from sidecar.transcript.transcripts import SummaryRequest, Transcripts
from sidecar.validation import check_at_least, page_size
from sidecar.wire import messages, splice
from sidecar.wire.splice import Encoded
from sidecar.wire.status import RateLimitedLog, answers_errors, deadline_of, lenient_deserializer


class ContextSidecarServicer(pb_grpc.ContextSidecarServicer):
    """One method per RPC: the caller's tenant, the request's fields as domain values, one call of
    the area that owns the answer (transcripts, run contexts, memories, the memory compactor, the
    tenant's events, the redactor), and the answer as protobuf or spliced bytes."""

    def __init__(self, transcripts: Transcripts, memories: Memories, memory_compactor: Compactor | None,
                 events: TenantEventLog, redactor: Redactor, capabilities: dict,
                 tenant_of: Callable[[grpc.ServicerContext], str]) -> None:
        self._transcripts = transcripts
        self._run_contexts = transcripts.contexts
        self._memories = memories
        self._memory_compactor = memory_compactor  # None: [memory.compaction] is off
        self._events = events
        self._redactor = redactor
        self._capabilities_json = json.dumps(capabilities, separators=(",", ":"))
        self._tenant = tenant_of

    @answers_errors
    def OpenRun(self, request: pb.OpenRunRequest, context: grpc.ServicerContext) -> pb.OpenRunResponse:
        settings, created = self._transcripts.open_run(
            self._tenant(context), request.run_id, token_counter=messages.optional(request, "token_counter"),
            transcript_token_budget=messages.optional(request, "transcript_token_budget"),
            keep_last_turns=messages.optional(request, "keep_last_turns"),
            transcript_window=messages.optional(request, "transcript_window"),
            summarization=messages.optional(request, "summarization_supported"),
            summarization_strategy=messages.optional(request, "summarization_strategy"),
            keep_last_tokens=messages.optional(request, "keep_last_tokens"),
            profile=messages.profile_from(request.profile) if request.HasField("profile") else None,
            task=messages.task_from(request.task) if request.HasField("task") else None)
        return pb.OpenRunResponse(settings=messages.run_settings_to(settings), created=created)

    @answers_errors
    def AppendEvents(self, request: pb.AppendEventsRequest, context: grpc.ServicerContext) -> pb.AppendEventsResponse:
        return self._transcripts.append_events(
            self._tenant(context), request.run_id, [messages.new_event_from(e) for e in request.events],
            deadline_of(context),
            respond=lambda results: pb.AppendEventsResponse(results=messages.appended_to(results)))

    @answers_errors
    def ListRunEvents(self, request: pb.ListRunEventsRequest,
                      context: grpc.ServicerContext) -> pb.ListRunEventsResponse:
        events, next_from = self._transcripts.list_events(
            self._tenant(context), request.run_id, request.from_seq, request.limit)
        return pb.ListRunEventsResponse(events=[messages.stored_event_to(e) for e in events], next_from_seq=next_from)

    @answers_errors
    def AssembleContext(self, request: pb.AssembleContextRequest, context: grpc.ServicerContext) -> Encoded:
        return self._transcripts.assemble(
            self._tenant(context), request.run_id, request.iteration,
            [messages.new_event_from(e) for e in request.append_events],
            messages.optional(request, "max_transcript_tokens"), request.render, deadline_of(context),
            respond=splice.assembled)

    @answers_errors
    def GetTranscriptWindow(self, request: pb.GetTranscriptWindowRequest,
                            context: grpc.ServicerContext) -> pb.GetTranscriptWindowResponse:
        return messages.transcript_window_to(
            self._transcripts.transcript_window(self._tenant(context), request.run_id, request.iteration))

    @answers_errors
    def CountTokens(self, request: pb.CountTokensRequest, context: grpc.ServicerContext) -> pb.CountTokensResponse:
        self._tenant(context)  # every call is authenticated, even one that reads no tenant's data
        name, counts = self._transcripts.count_tokens(request.token_counter, request.texts, deadline_of(context))
        return pb.CountTokensResponse(token_counter=name, counts=counts)

    @answers_errors
    def RecordSummary(self, request: pb.RecordSummaryRequest,
                      context: grpc.ServicerContext) -> pb.RecordSummaryResponse:
        return self._transcripts.record_summary(
            self._tenant(context), request.run_id,
            SummaryRequest(request.iteration, tuple(request.replaced_event_ids), request.summary_text, request.strategy,
                           messages.optional(request, "host_token_count")), respond=messages.recorded_summary_to)

    @answers_errors
    def GetArtifact(self, request: pb.GetArtifactRequest, context: grpc.ServicerContext) -> pb.GetArtifactResponse:
        artifact = self._transcripts.get_artifact(self._tenant(context), request.run_id, request.artifact_id)
        return pb.GetArtifactResponse(artifact_id=artifact.event_id, content=artifact.content, tokens=artifact.tokens,
                                      iteration=artifact.iteration)

    @answers_errors
    def DeleteArtifact(self, request: pb.DeleteArtifactRequest,
                       context: grpc.ServicerContext) -> pb.DeleteArtifactResponse:
        self._transcripts.delete_artifact(self._tenant(context), request.run_id, request.artifact_id)
        return pb.DeleteArtifactResponse()

    @answers_errors
    def ForkRun(self, request: pb.ForkRunRequest, context: grpc.ServicerContext) -> pb.ForkRunResponse:
        fork, created = self._transcripts.fork_run(self._tenant(context), request.source_run_id, request.from_seq,
                                                   request.mode, request.new_run_id)
        return pb.ForkRunResponse(settings=messages.run_settings_to(fork.settings), next_seq=fork.next_seq,
                                  pending_summaries=fork.replay_pending, created=created)

    @answers_errors
    def DeleteRun(self, request: pb.DeleteRunRequest, context: grpc.ServicerContext) -> pb.DeleteRunResponse:
        self._transcripts.delete_run(self._tenant(context), request.run_id)
        return pb.DeleteRunResponse()

    @answers_errors
    def PutMemory(self, request: pb.PutMemoryRequest, context: grpc.ServicerContext) -> pb.PutMemoryResponse:
        put = self._memories.put(self._tenant(context), request.memory_ref, request.content, list(request.tags),
                                 request.ttl_seconds, request.entry_id, list(request.embedding))
        return pb.PutMemoryResponse(entry_id=put.entry_id, tokens=put.tokens,
                                    redacted_secret_ids=put.redacted_secret_ids, replaced=put.replaced)

    @answers_errors
    def GetMemory(self, request: pb.GetMemoryRequest, context: grpc.ServicerContext) -> Encoded:
        return splice.memory_entry(self._memories.get(self._tenant(context), request.memory_ref, request.entry_id))

    @answers_errors
    def DeleteMemory(self, request: pb.DeleteMemoryRequest, context: grpc.ServicerContext) -> pb.DeleteMemoryResponse:
        self._memories.delete(self._tenant(context), request.memory_ref, request.entry_id)
        return pb.DeleteMemoryResponse()

    @answers_errors
    def ListMemory(self, request: pb.ListMemoryRequest, context: grpc.ServicerContext) -> Encoded:
        return splice.memory_list(self._memories.list(self._tenant(context), ListRequest(
            request.memory_ref, request.limit, request.tag, messages.optional(request, "token_budget"), request.rank,
            request.query, list(request.query_embedding))))

    @answers_errors
    def RegisterSecrets(self, request: pb.RegisterSecretsRequest,
                        context: grpc.ServicerContext) -> pb.RegisterSecretsResponse:
        self._redactor.register(self._tenant(context), request.run_id,
                                [(s.secret_id, s.value) for s in request.secrets])
        return pb.RegisterSecretsResponse(registered=len(request.secrets))

    @answers_errors
    def ForgetSecrets(self, request: pb.ForgetSecretsRequest,
                      context: grpc.ServicerContext) -> pb.ForgetSecretsResponse:
        forgotten = self._redactor.forget(self._tenant(context), request.run_id, list(request.secret_ids))
        return pb.ForgetSecretsResponse(forgotten=forgotten)

    @answers_errors
    def CompactMemory(self, request: pb.CompactMemoryRequest,
                      context: grpc.ServicerContext) -> pb.CompactMemoryResponse:
        tenant = self._tenant(context)
        if self._memory_compactor is None:
            raise CompactionDisabled("memory compaction is off ([memory.compaction] enabled)")
        outcome = self._memory_compactor.compact(tenant, request.memory_ref, list(request.source_ids),
                                                 request.summary_text, messages.optional(request, "token_budget"))
        return pb.CompactMemoryResponse(compaction_id=outcome.compaction_id, output_id=outcome.output_id,
                                        source_count=outcome.source_count,
                                        event=messages.event_notice_to(outcome.event), created=outcome.created)

    @answers_errors
    def ListMemoryEvents(self, request: pb.ListMemoryEventsRequest,
                         context: grpc.ServicerContext) -> pb.ListMemoryEventsResponse:
        tenant = self._tenant(context)
        check_at_least("since_seq", request.since_seq, 0)
        events, more = self._events.list(tenant, request.since_seq, request.memory_ref,
                                         page_size("limit", request.limit))
        return pb.ListMemoryEventsResponse(events=[messages.event_notice_to(e) for e in events],
                                           next_since_seq=events[-1].seq if more else None)

    @answers_errors
    def WatchEvents(self, request: pb.WatchEventsRequest, context: grpc.ServicerContext) -> Iterator[pb.EventNotice]:
        watch = self._events.watch(self._tenant(context), request.types)
        context.add_callback(lambda: self._events.unwatch(watch))  # the caller cancelled or went away
        # Headers now, before any event: a caller that waits for them knows that every event
        # committed from then on reaches it (otherwise it could not tell when the watch began).
        context.send_initial_metadata(())
        for event in watch.events(context.is_active):
            yield messages.event_notice_to(event)

    @answers_errors
    def UpdateProfile(self, request: pb.UpdateProfileRequest,
                      context: grpc.ServicerContext) -> pb.UpdateProfileResponse:
        update = self._run_contexts.update_profile(self._tenant(context), request.run_id,
                                               messages.profile_from(request.profile))
        return pb.UpdateProfileResponse(prefix_sha256=update.prefix_sha256, changed=update.changed)

    @answers_errors
    def UpdateTask(self, request: pb.UpdateTaskRequest, context: grpc.ServicerContext) -> pb.UpdateTaskResponse:
        self._run_contexts.update_task(self._tenant(context), request.run_id, messages.task_from(request.task))
        return pb.UpdateTaskResponse()

    @answers_errors
    def LoadSkill(self, request: pb.LoadSkillRequest, context: grpc.ServicerContext) -> pb.LoadSkillResponse:
        created = self._run_contexts.load_skill(self._tenant(context), request.run_id,
                                                messages.skill_from(request.skill))
        return pb.LoadSkillResponse(created=created)

    @answers_errors
    def UnloadSkill(self, request: pb.UnloadSkillRequest, context: grpc.ServicerContext) -> pb.UnloadSkillResponse:
        self._run_contexts.unload_skill(self._tenant(context), request.run_id, request.name)
        return pb.UnloadSkillResponse()

    @answers_errors
    def PutStateData(self, request: pb.PutStateDataRequest, context: grpc.ServicerContext) -> pb.PutStateDataResponse:
        self._run_contexts.put_state_data(self._tenant(context), request.run_id, request.subset, request.json)
        return pb.PutStateDataResponse()

    @answers_errors
    def GetState(self, request: pb.GetStateRequest, context: grpc.ServicerContext) -> pb.AgentState:
        state = self._transcripts.state(self._tenant(context), request.run_id, request.history_limit)
        return messages.agent_state_to(request.run_id, state)

    @answers_errors
    def RecordUsage(self, request: pb.RecordUsageRequest, context: grpc.ServicerContext) -> pb.Usage:
        return messages.usage_to(self._run_contexts.record_usage(
            self._tenant(context), request.run_id, request.iteration, request.input_tokens, request.cached_tokens,
            request.output_tokens, request.cache_read_input_tokens, request.cache_creation_input_tokens))

    @answers_errors
    def ListCompactionRecords(self, request: pb.ListCompactionRecordsRequest,
                              context: grpc.ServicerContext) -> pb.ListCompactionRecordsResponse:
        records, next_from = self._transcripts.compaction_records(self._tenant(context), request.run_id,
                                                                  request.from_index, request.limit)
        return pb.ListCompactionRecordsResponse(records=[messages.compaction_record_to(r) for r in records],
                                                next_from_index=next_from)

    @answers_errors
    def GetCapabilities(self, request: pb.GetCapabilitiesRequest,
                        context: grpc.ServicerContext) -> pb.GetCapabilitiesResponse:
        self._tenant(context)
        return pb.GetCapabilitiesResponse(capabilities_json=self._capabilities_json)


def add_servicer_to_server(servicer: ContextSidecarServicer, server: grpc.Server,
                           wrap: Callable[[Callable], Callable] = lambda behavior: behavior) -> None:
    """Like the generated add_ContextSidecarServicer_to_server, built from the service descriptor,
    except that a method may answer with already-serialized bytes, and each method's behavior
    passes through ``wrap``."""
    service = pb.DESCRIPTOR.services_by_name["ContextSidecar"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    bad_requests = RateLimitedLog(logging.getLogger("sidecar.requests"))
    for method in service.methods:
        request_type: type[message.Message] = getattr(pb, method.input_type.name)
        behavior = getattr(servicer, method.name)
        # A request that does not parse reaches the method as Malformed: answered INVALID_ARGUMENT
        # with one rate-limited log line (grpc's own answer is INTERNAL and a traceback per call).
        deserializer = lenient_deserializer(request_type, bad_requests)
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                wrap(behavior), request_deserializer=deserializer, response_serializer=splice.serialize)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                wrap(behavior), request_deserializer=deserializer, response_serializer=splice.serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    # grpcio 1.62 added registered handlers (no per-call method lookup); grpc-stubs 1.53 predates them.
    server.add_registered_method_handlers(service.full_name, handlers)  # type: ignore[attr-defined]
