"""The wire: each RPC converts protobuf to domain values, calls the domain, converts back.

AssembleContext, the per-turn call, is the one exception to building protobuf objects: a window
entry that is fed verbatim is sent as the event's stored record, which is wire-compatible with
WindowEntry (proto/contextsidecar/storage), so the answer is spliced from bytes. On a 32k-token
window that saves ~1.5 us per entry over building messages (benchmarks/ measures the call).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from sidecar.errors import CompactionDisabled, Unauthenticated
from sidecar.memory.api import ListRequest, Memories, MemoryList
from sidecar.memory.compaction import Compactor
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.pb.contextsidecar.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.settings import TenantCredential
from sidecar.tenant_events.log import Event, EventLog
from sidecar.text.redaction import Redactor
from sidecar.transcript.transcripts import (
    AppendResult,
    AssembledContext,
    NewEvent,
    RunSettings,
    SummaryRequest,
    Transcripts,
)
from sidecar.validation import check_at_least, check_id, page_size
from sidecar.wire import messages
from sidecar.wire.status import RateLimitedLog, answers_errors, deadline_of, lenient_deserializer

# With no tenants configured, every call belongs to this one tenant.
DEFAULT_TENANT = "default"


def _optional(message: Any, field: str) -> Any:
    return getattr(message, field) if message.HasField(field) else None


def _new_event(event: pb.Event) -> NewEvent:
    return NewEvent(event.event_id, event.iteration, event.role, event.type, event.content,
                    event.call_id, _optional(event, "host_token_count"), event.tool_name, event.untrusted)


def _settings(settings: RunSettings) -> pb.RunSettings:
    return pb.RunSettings(token_counter=settings.token_counter,
                          transcript_token_budget=settings.transcript_token_budget,
                          keep_last_turns=settings.keep_last_turns,
                          transcript_window=settings.transcript_window,
                          summarization_supported=settings.summarization,
                          summarization_strategy=settings.summarization_strategy,
                          keep_last_tokens=settings.keep_last_tokens)


def _appended(results: list[AppendResult]) -> list[pb.AppendResult]:
    return [pb.AppendResult(event_id=r.event_id, seq=r.seq, tokens=r.tokens, already_recorded=r.already_recorded)
            for r in results]


_stored_event = messages.stored_event_to


def _field_alone(message_type: type[message.Message], field_name: str, as_repeated_bytes: bool) -> type[message.Message]:
    """A message type holding only ``message_type.field_name`` (same number): serialising it
    gives exactly that field's encoding, so protobuf itself splices pre-encoded messages.

    ``as_repeated_bytes``: the field becomes ``repeated bytes``, which frames already-encoded
    submessages exactly as the real repeated message field would (same tag, same length
    prefix). Otherwise the field keeps its own scalar type: its encoding appended to a stored
    message sets that one field."""
    real = message_type.DESCRIPTOR.fields_by_name[field_name]
    name = f"{message_type.DESCRIPTOR.name}{real.camelcase_name[0].upper()}{real.camelcase_name[1:]}Alone"
    file = descriptor_pb2.FileDescriptorProto(name=f"contextsidecar/splice/{name}.proto",
                                              package="contextsidecar.splice", syntax="proto3")
    kind = descriptor_pb2.FieldDescriptorProto
    file.message_type.add(name=name).field.add(
        name=real.name, number=real.number, type=kind.TYPE_BYTES if as_repeated_bytes else real.type,
        label=kind.LABEL_REPEATED if as_repeated_bytes else kind.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"contextsidecar.splice.{name}"))


_EntriesAsBytes = _field_alone(pb.AssembleContextResponse, "entries", as_repeated_bytes=True)
_MemoriesAsBytes = _field_alone(pb.ListMemoryResponse, "entries", as_repeated_bytes=True)
_ScoreAlone = _field_alone(pb.MemoryEntry, "score", as_repeated_bytes=False)


def _memory_list(listed: MemoryList) -> bytes:
    """The serialized ListMemoryResponse, its entries spliced from stored records (each with
    its score appended in relevance answers)."""
    records = listed.records
    if listed.scores is not None:
        records = [record + _ScoreAlone(score=score).SerializeToString()
                   for record, score in zip(records, listed.scores)]
    head = pb.ListMemoryResponse(token_counter=listed.token_counter, tokens_used=listed.tokens_used,
                                 left_out_for_budget=listed.left_out_for_budget, rank=listed.rank,
                                 left_out_for_size=listed.left_out_for_size)
    return head.SerializeToString() + _MemoriesAsBytes(entries=records).SerializeToString()


def _assembled(assembled: AssembledContext, appended: list[AppendResult]) -> bytes:
    """The serialized AssembleContextResponse: its scalar fields, then the entries spliced in
    (unless a rendering carries them)."""
    window = assembled.window
    entries = window.records if not assembled.rendered else []
    if window.clips and entries:
        entries = list(entries)
        for position, clip in window.clips.items():
            entry = pb.WindowEntry.FromString(entries[position])
            entry.text, entry.tokens, entry.clipped_from_tokens = clip.text, clip.tokens, clip.original_tokens
            entries[position] = entry.SerializeToString()
    head = pb.AssembleContextResponse(
        run_id=window.run_id, iteration=window.iteration, token_counter=window.token_counter,
        token_budget=window.token_budget, token_count=window.token_count, event_ids=window.event_ids,
        omitted_events=window.omitted_events, summarized_events=window.summarized_events,
        appended=_appended(appended),
        compaction=pb.Compaction(due=window.compaction.due, candidate_event_ids=window.compaction.candidate_ids,
                                 tokens_before=window.compaction.tokens_before, reason=window.compaction.reason),
        sections=[messages.section_to(s) for s in assembled.sections], prefix_sha256=assembled.prefix_sha256,
        prefix_changed=assembled.prefix_changed, window_tokens=assembled.window_tokens,
        tools_tokens=assembled.tools_tokens, turn_limit_tokens=assembled.turn_limit, task_id=assembled.task_id,
        rendered=assembled.rendered, cache=messages.cache_report_to(assembled.cache))
    # Fields may come in any order in protobuf's encoding; repeated ones concatenate.
    return head.SerializeToString() + _EntriesAsBytes(entries=entries).SerializeToString()


class TenantOf:
    """CTI-1: the tenant of a call comes from its bearer token, never from a request field."""

    def __init__(self, tenants: tuple[TenantCredential, ...]) -> None:
        self._by_token_sha256 = {t.token_sha256: t.tenant_id for t in tenants}

    def __call__(self, context: grpc.ServicerContext) -> str:
        if not self._by_token_sha256:
            return DEFAULT_TENANT
        for name, value in context.invocation_metadata():
            if name == "authorization":
                scheme, _, token = value.partition(" ")
                tenant = self._by_token_sha256.get(hashlib.sha256(token.strip().encode("utf-8")).hexdigest()) \
                    if scheme.lower() == "bearer" and token.strip() else None
                if tenant is None:
                    raise Unauthenticated("the bearer token names no tenant")
                return tenant
        raise Unauthenticated("the call carries no 'authorization: Bearer <token>' metadata")


def _notice(event: Event) -> pb.EventNotice:
    return pb.EventNotice(seq=event.seq, type=event.type, json=event.json())


class ContextSidecarServicer(pb_grpc.ContextSidecarServicer):
    def __init__(self, transcripts: Transcripts, memories: Memories, compactor: Compactor | None, events: EventLog,
                 redactor: Redactor, capabilities: dict,
                 tenant_of: Callable[[grpc.ServicerContext], str]) -> None:
        self._transcripts = transcripts
        self._contexts = transcripts.contexts
        self._memories = memories
        self._compactor = compactor  # None: compaction is off
        self._events = events
        self._redactor = redactor
        self._capabilities_json = json.dumps(capabilities, separators=(",", ":"))
        self._tenant = tenant_of

    @answers_errors
    def OpenRun(self, request: pb.OpenRunRequest, context: grpc.ServicerContext) -> pb.OpenRunResponse:
        settings, created = self._transcripts.open_run(
            self._tenant(context), request.run_id, token_counter=_optional(request, "token_counter"),
            transcript_token_budget=_optional(request, "transcript_token_budget"),
            keep_last_turns=_optional(request, "keep_last_turns"),
            transcript_window=_optional(request, "transcript_window"),
            summarization=_optional(request, "summarization_supported"),
            summarization_strategy=_optional(request, "summarization_strategy"),
            keep_last_tokens=_optional(request, "keep_last_tokens"),
            profile=messages.profile_from(request.profile) if request.HasField("profile") else None,
            task=messages.task_from(request.task) if request.HasField("task") else None)
        return pb.OpenRunResponse(settings=_settings(settings), created=created)

    @answers_errors
    def AppendEvents(self, request: pb.AppendEventsRequest, context: grpc.ServicerContext) -> pb.AppendEventsResponse:
        results = self._transcripts.append_events(
            self._tenant(context), request.run_id, [_new_event(e) for e in request.events], deadline_of(context))
        return pb.AppendEventsResponse(results=_appended(results))

    @answers_errors
    def ListRunEvents(self, request: pb.ListRunEventsRequest, context: grpc.ServicerContext) -> pb.ListRunEventsResponse:
        events, next_from = self._transcripts.list_events(
            self._tenant(context), request.run_id, request.from_seq, request.limit)
        return pb.ListRunEventsResponse(events=[_stored_event(e) for e in events], next_from_seq=next_from)

    @answers_errors
    def AssembleContext(self, request: pb.AssembleContextRequest, context: grpc.ServicerContext) -> bytes:
        assembled, appended = self._transcripts.assemble(
            self._tenant(context), request.run_id, request.iteration,
            [_new_event(e) for e in request.append_events], _optional(request, "max_transcript_tokens"),
            request.render, deadline_of(context))
        return _assembled(assembled, appended)

    @answers_errors
    def GetTranscriptWindow(self, request: pb.GetTranscriptWindowRequest,
                            context: grpc.ServicerContext) -> pb.GetTranscriptWindowResponse:
        window = self._transcripts.transcript_window(self._tenant(context), request.run_id, request.iteration)
        return pb.GetTranscriptWindowResponse(
            run_id=window.run_id, iteration=window.iteration, token_counter=window.token_counter,
            token_budget=window.token_budget, token_count=window.token_count, event_ids=window.event_ids,
            entries=[pb.RenderedEntry(event_id=e.event.event_id, rendered=e.text, tokens=e.tokens)
                     for e in window.entries()],
            summarized_ranges=[pb.SummarizedRange(summary_ref=r.summary_ref, replaced_turns=r.replaced_turns)
                               for r in window.summarized_ranges])

    @answers_errors
    def CountTokens(self, request: pb.CountTokensRequest, context: grpc.ServicerContext) -> pb.CountTokensResponse:
        self._tenant(context)  # every call is authenticated, even one that reads no tenant's data
        name, counts = self._transcripts.count_tokens(request.token_counter, request.texts, deadline_of(context))
        return pb.CountTokensResponse(token_counter=name, counts=counts)

    @answers_errors
    def RecordSummary(self, request: pb.RecordSummaryRequest, context: grpc.ServicerContext) -> pb.RecordSummaryResponse:
        summary, entry, created = self._transcripts.record_summary(self._tenant(context), request.run_id, SummaryRequest(
            request.iteration, tuple(request.replaced_event_ids), request.summary_text, request.strategy,
            _optional(request, "host_token_count")))
        return pb.RecordSummaryResponse(summary_ref=summary.ref, tokens_before=summary.tokens_before,
                                        tokens_after=summary.tokens_after, event=_stored_event(entry), created=created)

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
        return pb.ForkRunResponse(settings=_settings(fork.settings), next_seq=fork.next_seq,
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
    def GetMemory(self, request: pb.GetMemoryRequest, context: grpc.ServicerContext) -> bytes:
        return self._memories.get(self._tenant(context), request.memory_ref, request.entry_id)

    @answers_errors
    def DeleteMemory(self, request: pb.DeleteMemoryRequest, context: grpc.ServicerContext) -> pb.DeleteMemoryResponse:
        self._memories.delete(self._tenant(context), request.memory_ref, request.entry_id)
        return pb.DeleteMemoryResponse()

    @answers_errors
    def ListMemory(self, request: pb.ListMemoryRequest, context: grpc.ServicerContext) -> bytes:
        return _memory_list(self._memories.list(self._tenant(context), ListRequest(
            request.memory_ref, request.limit, request.tag, _optional(request, "token_budget"), request.rank,
            request.query, list(request.query_embedding))))

    @answers_errors
    def RegisterSecrets(self, request: pb.RegisterSecretsRequest,
                        context: grpc.ServicerContext) -> pb.RegisterSecretsResponse:
        tenant = self._tenant(context)
        check_id("run_id", request.run_id, required=False)
        self._redactor.register(tenant, request.run_id, [(s.secret_id, s.value) for s in request.secrets])
        return pb.RegisterSecretsResponse(registered=len(request.secrets))

    @answers_errors
    def ForgetSecrets(self, request: pb.ForgetSecretsRequest, context: grpc.ServicerContext) -> pb.ForgetSecretsResponse:
        tenant = self._tenant(context)
        check_id("run_id", request.run_id, required=False)
        return pb.ForgetSecretsResponse(forgotten=self._redactor.forget(tenant, request.run_id, list(request.secret_ids)))

    @answers_errors
    def CompactMemory(self, request: pb.CompactMemoryRequest, context: grpc.ServicerContext) -> pb.CompactMemoryResponse:
        tenant = self._tenant(context)
        if self._compactor is None:
            raise CompactionDisabled("memory compaction is off ([memory.compaction] enabled)")
        outcome = self._compactor.compact(tenant, request.memory_ref, list(request.source_ids), request.summary_text,
                                          _optional(request, "token_budget"))
        return pb.CompactMemoryResponse(compaction_id=outcome.compaction_id, output_id=outcome.output_id,
                                        source_count=outcome.source_count, event=_notice(outcome.event),
                                        created=outcome.created)

    @answers_errors
    def ListMemoryEvents(self, request: pb.ListMemoryEventsRequest,
                         context: grpc.ServicerContext) -> pb.ListMemoryEventsResponse:
        tenant = self._tenant(context)
        check_at_least("since_seq", request.since_seq, 0)
        events, more = self._events.list(tenant, request.since_seq, request.memory_ref,
                                         page_size("limit", request.limit))
        return pb.ListMemoryEventsResponse(events=[_notice(e) for e in events],
                                           next_since_seq=events[-1].seq if more else None)

    @answers_errors
    def WatchEvents(self, request: pb.WatchEventsRequest, context: grpc.ServicerContext) -> Iterator[pb.EventNotice]:
        watch = self._events.watch(self._tenant(context), request.types)
        context.add_callback(lambda: self._events.unwatch(watch))  # the caller cancelled or went away
        # Headers now, before any event: a caller that waits for them knows that every event
        # committed from then on reaches it (otherwise it could not tell when the watch began).
        context.send_initial_metadata(())
        for event in watch.events(context.is_active):
            yield _notice(event)

    @answers_errors
    def UpdateProfile(self, request: pb.UpdateProfileRequest,
                      context: grpc.ServicerContext) -> pb.UpdateProfileResponse:
        update = self._contexts.update_profile(self._tenant(context), request.run_id,
                                               messages.profile_from(request.profile))
        return pb.UpdateProfileResponse(prefix_sha256=update.prefix_sha256, changed=update.changed)

    @answers_errors
    def UpdateTask(self, request: pb.UpdateTaskRequest, context: grpc.ServicerContext) -> pb.UpdateTaskResponse:
        self._contexts.update_task(self._tenant(context), request.run_id, messages.task_from(request.task))
        return pb.UpdateTaskResponse()

    @answers_errors
    def LoadSkill(self, request: pb.LoadSkillRequest, context: grpc.ServicerContext) -> pb.LoadSkillResponse:
        created = self._contexts.load_skill(self._tenant(context), request.run_id, messages.skill_from(request.skill))
        return pb.LoadSkillResponse(created=created)

    @answers_errors
    def UnloadSkill(self, request: pb.UnloadSkillRequest, context: grpc.ServicerContext) -> pb.UnloadSkillResponse:
        self._contexts.unload_skill(self._tenant(context), request.run_id, request.name)
        return pb.UnloadSkillResponse()

    @answers_errors
    def PutStateData(self, request: pb.PutStateDataRequest, context: grpc.ServicerContext) -> pb.PutStateDataResponse:
        self._contexts.put_state_data(self._tenant(context), request.run_id, request.subset, request.json)
        return pb.PutStateDataResponse()

    @answers_errors
    def GetState(self, request: pb.GetStateRequest, context: grpc.ServicerContext) -> pb.AgentState:
        state = self._transcripts.state(self._tenant(context), request.run_id, request.history_limit)
        return pb.AgentState(
            run_id=request.run_id, history=[_stored_event(e) for e in state.history], history_total=state.history_total,
            running_summary=[pb.SummaryInForce(summary_ref=s.event_id, text=s.content, tokens=s.tokens,
                                               iteration=s.iteration) for s in state.running_summary],
            task=messages.task_to(state.task),
            loaded_skills=[pb.LoadedSkill(name=s.name, body=s.body) for s in state.skills],
            last_usage=messages.usage_to(state.last_usage) if state.last_usage else None,
            data_json=json.dumps(state.data, ensure_ascii=False, separators=(",", ":"), sort_keys=True),
            profile=messages.profile_to(state.profile))

    @answers_errors
    def RecordUsage(self, request: pb.RecordUsageRequest, context: grpc.ServicerContext) -> pb.Usage:
        return messages.usage_to(self._contexts.record_usage(
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


def _serialize(response: message.Message | bytes) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


def add_servicer_to_server(servicer: ContextSidecarServicer, server: grpc.Server,
                           wrap: Callable[[Callable], Callable] = lambda behavior: behavior) -> None:
    """Like the generated add_ContextSidecarServicer_to_server, built from the service descriptor,
    except that a method may answer with already-serialized bytes, and each method's behavior
    passes through ``wrap``."""
    service = pb.DESCRIPTOR.services_by_name["ContextSidecar"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    bad_requests = RateLimitedLog(logging.getLogger("sidecar.requests"))
    for method in service.methods:
        request_type: Callable[..., Any] = getattr(pb, method.input_type.name)
        behavior = getattr(servicer, method.name)
        # A request that does not parse reaches the method as Malformed: answered INVALID_ARGUMENT
        # with one rate-limited log line (grpc's own answer is INTERNAL and a traceback per call).
        deserializer = lenient_deserializer(request_type, bad_requests)
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                wrap(behavior), request_deserializer=deserializer, response_serializer=_serialize)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                wrap(behavior), request_deserializer=deserializer, response_serializer=_serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
