"""The wire's conversions for the context window: protobuf messages to domain values and back
(profile, task, skills, sections, usage, agent state, compaction records)."""

from __future__ import annotations

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
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.storage.codec import StoredEvent
from sidecar.transcript.transcripts import CompactionRecord


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
                          break_reason=report.break_reason)


def compaction_record_to(record: CompactionRecord) -> pb.CompactionRecord:
    return pb.CompactionRecord(
        index=record.index, task_id=record.task_id, iteration=record.iteration,
        removed_event_ids=record.removed_event_ids, summary_ref=record.summary_ref, tokens_before=record.tokens_before,
        tokens_after=record.tokens_after, recorded_at=timestamp(record.recorded_ms),
        summarised_by=record.summarised_by, seq=record.seq, kind=record.kind)


def stored_event_to(event: StoredEvent) -> pb.StoredEvent:
    return pb.StoredEvent(event_id=event.event_id, seq=event.seq, iteration=event.iteration, role=event.role,
                          type=event.type, content=event.content, call_id=event.call_id, tokens=event.tokens,
                          tool_name=event.tool_name)
