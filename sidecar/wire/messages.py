"""The wire's conversions: protobuf messages to domain values and back (events, run settings,
profile, task, skills, sections, usage, compaction records, event notices). The servicer calls
these and the domain; answers spliced from stored bytes are built in ``sidecar.wire.splice``."""

from __future__ import annotations

import json
from typing import Any

from context_sidecar_client.v1 import sidecar_pb2 as pb
from google.protobuf.timestamp_pb2 import Timestamp

from sidecar.context_window.profiles import (
    LoadedSkill,
    Participant,
    Profile,
    RemoteAgent,
    SkillSummary,
    Task,
    ToolDefinition,
)
from sidecar.context_window.sections import CacheReport, Section
from sidecar.context_window.state import Usage
from sidecar.storage.codec import StoredEvent
from sidecar.tenant_events.log import Event
from sidecar.transcript.transcripts import (
    AgentStateView,
    AppendResult,
    CompactionRecord,
    NewEvent,
    RunSettings,
    Summary,
)
from sidecar.transcript.window import TranscriptWindow


def optional(message: Any, field: str) -> Any:
    """A field with explicit presence: its value when set, None when not."""
    return getattr(message, field) if message.HasField(field) else None


def new_event_from(event: pb.Event) -> NewEvent:
    host_count = event.host_token_count if event.HasField("host_token_count") else None
    return NewEvent.from_fields(event_id=event.event_id, iteration=event.iteration, role=event.role, type=event.type,
                                content=event.content, call_id=event.call_id, host_token_count=host_count,
                                tool_name=event.tool_name, untrusted=event.untrusted)


def run_settings_to(settings: RunSettings) -> pb.RunSettings:
    return pb.RunSettings(token_counter=settings.token_counter,
                          transcript_token_budget=settings.transcript_token_budget,
                          keep_last_turns=settings.keep_last_turns,
                          transcript_window=settings.transcript_window,
                          summarization_supported=settings.summarization,
                          summarization_strategy=settings.summarization_strategy,
                          keep_last_tokens=settings.keep_last_tokens)


def appended_to(results: list[AppendResult]) -> list[pb.AppendResult]:
    return [pb.AppendResult(event_id=r.event_id, seq=r.seq, tokens=r.tokens, already_recorded=r.already_recorded)
            for r in results]


def event_notice_to(event: Event) -> pb.EventNotice:
    return pb.EventNotice(seq=event.seq, type=event.type, json=event.json())


def transcript_window_to(window: TranscriptWindow) -> pb.GetTranscriptWindowResponse:
    return pb.GetTranscriptWindowResponse(
        run_id=window.run_id, iteration=window.iteration, token_counter=window.token_counter,
        token_budget=window.token_budget, token_count=window.token_count, event_ids=window.event_ids,
        entries=[pb.RenderedEntry(event_id=e.event.event_id, rendered=e.text, tokens=e.tokens)
                 for e in window.entries()],
        summarized_ranges=[pb.SummarizedRange(summary_ref=r.summary_ref, replaced_turns=r.replaced_turns)
                           for r in window.summarized_ranges])


def agent_state_to(run_id: str, state: AgentStateView) -> pb.AgentState:
    return pb.AgentState(
        run_id=run_id, history=[stored_event_to(e) for e in state.history], history_total=state.history_total,
        running_summary=[pb.SummaryInForce(summary_ref=s.event_id, text=s.content, tokens=s.tokens,
                                           iteration=s.iteration) for s in state.running_summary],
        task=task_to(state.task),
        loaded_skills=[pb.LoadedSkill(name=s.name, body=s.body) for s in state.skills],
        last_usage=usage_to(state.last_usage) if state.last_usage else None,
        data_json=json.dumps(state.data, ensure_ascii=False, separators=(",", ":"), sort_keys=True),
        profile=profile_to(state.profile))


def profile_from(message: pb.Profile) -> Profile:
    return Profile(
        message.system_prompt, tuple(Participant(p.role, p.description) for p in message.participants),
        tuple(RemoteAgent(a.id, a.name, a.description, tuple(a.skills)) for a in message.agents),
        tuple(SkillSummary(s.name, s.description) for s in message.skills),
        tuple(ToolDefinition(t.name, t.description, t.parameters_json) for t in message.tools),
        message.model_window_tokens)


def profile_to(profile: Profile) -> pb.Profile:
    return pb.Profile(
        system_prompt=profile.system_prompt,
        participants=[pb.Participant(role=p.role, description=p.description) for p in profile.participants],
        agents=[pb.RemoteAgent(id=a.id, name=a.name, description=a.description, skills=a.skills)
                for a in profile.agents],
        skills=[pb.SkillSummary(name=s.name, description=s.description) for s in profile.skills],
        tools=[pb.ToolDefinition(name=t.name, description=t.description, parameters_json=t.parameters_json)
               for t in profile.tools],
        model_window_tokens=profile.model_window_tokens)


def task_from(message: pb.Task) -> Task:
    return Task(message.task_id, message.goal, tuple(message.acceptance_criteria), message.plan)


def task_to(task: Task) -> pb.Task:
    return pb.Task(task_id=task.task_id, goal=task.goal, acceptance_criteria=task.acceptance_criteria, plan=task.plan)


def skill_from(message: pb.LoadedSkill) -> LoadedSkill:
    return LoadedSkill(message.name, message.body)


def section_to(section: Section) -> pb.Section:
    return pb.Section(name=section.name, stability=section.stability, never_compact=section.never_compact,
                      text=section.text, tokens=section.tokens, event_ids=section.event_ids)


def timestamp(ms: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def usage_to(usage: Usage) -> pb.Usage:
    return pb.Usage(iteration=usage.iteration, input_tokens=usage.input_tokens, cached_tokens=usage.cached_tokens,
                    output_tokens=usage.output_tokens, fed_tokens=usage.fed_tokens, drift_tokens=usage.drift_tokens,
                    recorded_at=timestamp(usage.recorded_ms), cache_read_input_tokens=usage.cache_read_input_tokens,
                    cache_creation_input_tokens=usage.cache_creation_input_tokens,
                    predicted_cached_tokens=usage.predicted_cached_tokens,
                    reported_cached_tokens=usage.reported_cached_tokens)


def cache_report_to(report: CacheReport) -> pb.CacheReport:
    return pb.CacheReport(stable_prefix_tokens=report.stable_prefix_tokens, break_at=report.break_at,
                          break_reason=report.break_reason, request_tokens=report.request_tokens)


def compaction_record_to(record: CompactionRecord) -> pb.CompactionRecord:
    return pb.CompactionRecord(
        index=record.index, task_id=record.task_id, iteration=record.iteration,
        removed_event_ids=record.removed_event_ids, summary_ref=record.summary_ref, tokens_before=record.tokens_before,
        tokens_after=record.tokens_after, recorded_at=timestamp(record.recorded_ms),
        summarised_by=record.summarised_by, seq=record.seq, kind=record.kind)


def recorded_summary_to(recorded: tuple[Summary, StoredEvent, bool]) -> pb.RecordSummaryResponse:
    summary, entry, created = recorded
    return pb.RecordSummaryResponse(summary_ref=summary.ref, tokens_before=summary.tokens_before,
                                    tokens_after=summary.tokens_after, event=stored_event_to(entry), created=created)


def stored_event_to(event: StoredEvent) -> pb.StoredEvent:
    return pb.StoredEvent(event_id=event.event_id, seq=event.seq, iteration=event.iteration, role=event.role,
                          type=event.type, content=event.content, call_id=event.call_id, tokens=event.tokens,
                          tool_name=event.tool_name)
