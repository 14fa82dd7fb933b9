import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunSettings(_message.Message):
    __slots__ = ("token_counter", "transcript_token_budget", "keep_last_turns", "transcript_window", "summarization_supported", "summarization_strategy", "keep_last_tokens")
    TOKEN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_TURNS_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZATION_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZATION_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_counter: str
    transcript_token_budget: int
    keep_last_turns: int
    transcript_window: int
    summarization_supported: bool
    summarization_strategy: str
    keep_last_tokens: int
    def __init__(self, token_counter: _Optional[str] = ..., transcript_token_budget: _Optional[int] = ..., keep_last_turns: _Optional[int] = ..., transcript_window: _Optional[int] = ..., summarization_supported: _Optional[bool] = ..., summarization_strategy: _Optional[str] = ..., keep_last_tokens: _Optional[int] = ...) -> None: ...

class OpenRunRequest(_message.Message):
    __slots__ = ("run_id", "token_counter", "transcript_token_budget", "keep_last_turns", "transcript_window", "summarization_supported", "summarization_strategy", "keep_last_tokens", "profile", "task")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_TURNS_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZATION_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZATION_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    token_counter: str
    transcript_token_budget: int
    keep_last_turns: int
    transcript_window: int
    summarization_supported: bool
    summarization_strategy: str
    keep_last_tokens: int
    profile: Profile
    task: Task
    def __init__(self, run_id: _Optional[str] = ..., token_counter: _Optional[str] = ..., transcript_token_budget: _Optional[int] = ..., keep_last_turns: _Optional[int] = ..., transcript_window: _Optional[int] = ..., summarization_supported: _Optional[bool] = ..., summarization_strategy: _Optional[str] = ..., keep_last_tokens: _Optional[int] = ..., profile: _Optional[_Union[Profile, _Mapping]] = ..., task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class OpenRunResponse(_message.Message):
    __slots__ = ("settings", "created")
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    settings: RunSettings
    created: bool
    def __init__(self, settings: _Optional[_Union[RunSettings, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("event_id", "iteration", "role", "type", "content", "call_id", "host_token_count", "tool_name", "untrusted")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    UNTRUSTED_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    iteration: int
    role: str
    type: str
    content: str
    call_id: str
    host_token_count: int
    tool_name: str
    untrusted: bool
    def __init__(self, event_id: _Optional[str] = ..., iteration: _Optional[int] = ..., role: _Optional[str] = ..., type: _Optional[str] = ..., content: _Optional[str] = ..., call_id: _Optional[str] = ..., host_token_count: _Optional[int] = ..., tool_name: _Optional[str] = ..., untrusted: _Optional[bool] = ...) -> None: ...

class StoredEvent(_message.Message):
    __slots__ = ("event_id", "seq", "iteration", "role", "type", "content", "call_id", "tokens", "tool_name")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    seq: int
    iteration: int
    role: str
    type: str
    content: str
    call_id: str
    tokens: int
    tool_name: str
    def __init__(self, event_id: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., role: _Optional[str] = ..., type: _Optional[str] = ..., content: _Optional[str] = ..., call_id: _Optional[str] = ..., tokens: _Optional[int] = ..., tool_name: _Optional[str] = ...) -> None: ...

class AppendResult(_message.Message):
    __slots__ = ("event_id", "seq", "tokens", "already_recorded")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ALREADY_RECORDED_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    seq: int
    tokens: int
    already_recorded: bool
    def __init__(self, event_id: _Optional[str] = ..., seq: _Optional[int] = ..., tokens: _Optional[int] = ..., already_recorded: _Optional[bool] = ...) -> None: ...

class AppendEventsRequest(_message.Message):
    __slots__ = ("run_id", "events")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, run_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class AppendEventsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AppendResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AppendResult, _Mapping]]] = ...) -> None: ...

class ListRunEventsRequest(_message.Message):
    __slots__ = ("run_id", "from_seq", "limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    from_seq: int
    limit: int
    def __init__(self, run_id: _Optional[str] = ..., from_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListRunEventsResponse(_message.Message):
    __slots__ = ("events", "next_from_seq")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[StoredEvent]
    next_from_seq: int
    def __init__(self, events: _Optional[_Iterable[_Union[StoredEvent, _Mapping]]] = ..., next_from_seq: _Optional[int] = ...) -> None: ...

class AssembleContextRequest(_message.Message):
    __slots__ = ("run_id", "iteration", "append_events", "max_transcript_tokens", "render")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    APPEND_EVENTS_FIELD_NUMBER: _ClassVar[int]
    MAX_TRANSCRIPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RENDER_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iteration: int
    append_events: _containers.RepeatedCompositeFieldContainer[Event]
    max_transcript_tokens: int
    render: str
    def __init__(self, run_id: _Optional[str] = ..., iteration: _Optional[int] = ..., append_events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., max_transcript_tokens: _Optional[int] = ..., render: _Optional[str] = ...) -> None: ...

class WindowEntry(_message.Message):
    __slots__ = ("event_id", "seq", "iteration", "role", "type", "call_id", "text", "tokens", "clipped_from_tokens", "tool_name")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CLIPPED_FROM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    seq: int
    iteration: int
    role: str
    type: str
    call_id: str
    text: str
    tokens: int
    clipped_from_tokens: int
    tool_name: str
    def __init__(self, event_id: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., role: _Optional[str] = ..., type: _Optional[str] = ..., call_id: _Optional[str] = ..., text: _Optional[str] = ..., tokens: _Optional[int] = ..., clipped_from_tokens: _Optional[int] = ..., tool_name: _Optional[str] = ...) -> None: ...

class AssembleContextResponse(_message.Message):
    __slots__ = ("run_id", "iteration", "token_counter", "token_budget", "token_count", "entries", "event_ids", "omitted_events", "appended", "compaction", "sections", "prefix_sha256", "prefix_changed", "window_tokens", "tools_tokens", "turn_limit_tokens", "task_id", "rendered", "summarized_events", "cache")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    OMITTED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_SHA256_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CHANGED_FIELD_NUMBER: _ClassVar[int]
    WINDOW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TURN_LIMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RENDERED_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iteration: int
    token_counter: str
    token_budget: int
    token_count: int
    entries: _containers.RepeatedCompositeFieldContainer[WindowEntry]
    event_ids: _containers.RepeatedScalarFieldContainer[str]
    omitted_events: int
    appended: _containers.RepeatedCompositeFieldContainer[AppendResult]
    compaction: Compaction
    sections: _containers.RepeatedCompositeFieldContainer[Section]
    prefix_sha256: str
    prefix_changed: _containers.RepeatedScalarFieldContainer[str]
    window_tokens: int
    tools_tokens: int
    turn_limit_tokens: int
    task_id: str
    rendered: str
    summarized_events: int
    cache: CacheReport
    def __init__(self, run_id: _Optional[str] = ..., iteration: _Optional[int] = ..., token_counter: _Optional[str] = ..., token_budget: _Optional[int] = ..., token_count: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[WindowEntry, _Mapping]]] = ..., event_ids: _Optional[_Iterable[str]] = ..., omitted_events: _Optional[int] = ..., appended: _Optional[_Iterable[_Union[AppendResult, _Mapping]]] = ..., compaction: _Optional[_Union[Compaction, _Mapping]] = ..., sections: _Optional[_Iterable[_Union[Section, _Mapping]]] = ..., prefix_sha256: _Optional[str] = ..., prefix_changed: _Optional[_Iterable[str]] = ..., window_tokens: _Optional[int] = ..., tools_tokens: _Optional[int] = ..., turn_limit_tokens: _Optional[int] = ..., task_id: _Optional[str] = ..., rendered: _Optional[str] = ..., summarized_events: _Optional[int] = ..., cache: _Optional[_Union[CacheReport, _Mapping]] = ...) -> None: ...

class CacheReport(_message.Message):
    __slots__ = ("stable_prefix_tokens", "break_at", "break_reason", "request_tokens")
    STABLE_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BREAK_AT_FIELD_NUMBER: _ClassVar[int]
    BREAK_REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    stable_prefix_tokens: int
    break_at: int
    break_reason: str
    request_tokens: int
    def __init__(self, stable_prefix_tokens: _Optional[int] = ..., break_at: _Optional[int] = ..., break_reason: _Optional[str] = ..., request_tokens: _Optional[int] = ...) -> None: ...

class Section(_message.Message):
    __slots__ = ("name", "stability", "never_compact", "text", "tokens", "event_ids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STABILITY_FIELD_NUMBER: _ClassVar[int]
    NEVER_COMPACT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    stability: str
    never_compact: bool
    text: str
    tokens: int
    event_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., stability: _Optional[str] = ..., never_compact: _Optional[bool] = ..., text: _Optional[str] = ..., tokens: _Optional[int] = ..., event_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Compaction(_message.Message):
    __slots__ = ("due", "candidate_event_ids", "tokens_before", "reason")
    DUE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    due: bool
    candidate_event_ids: _containers.RepeatedScalarFieldContainer[str]
    tokens_before: int
    reason: str
    def __init__(self, due: _Optional[bool] = ..., candidate_event_ids: _Optional[_Iterable[str]] = ..., tokens_before: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SummarizedRange(_message.Message):
    __slots__ = ("summary_ref", "replaced_turns")
    SUMMARY_REF_FIELD_NUMBER: _ClassVar[int]
    REPLACED_TURNS_FIELD_NUMBER: _ClassVar[int]
    summary_ref: str
    replaced_turns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, summary_ref: _Optional[str] = ..., replaced_turns: _Optional[_Iterable[str]] = ...) -> None: ...

class GetTranscriptWindowRequest(_message.Message):
    __slots__ = ("run_id", "iteration")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iteration: int
    def __init__(self, run_id: _Optional[str] = ..., iteration: _Optional[int] = ...) -> None: ...

class RenderedEntry(_message.Message):
    __slots__ = ("event_id", "rendered", "tokens")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    RENDERED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    rendered: str
    tokens: int
    def __init__(self, event_id: _Optional[str] = ..., rendered: _Optional[str] = ..., tokens: _Optional[int] = ...) -> None: ...

class GetTranscriptWindowResponse(_message.Message):
    __slots__ = ("run_id", "iteration", "token_counter", "token_budget", "token_count", "event_ids", "entries", "summarized_ranges")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZED_RANGES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iteration: int
    token_counter: str
    token_budget: int
    token_count: int
    event_ids: _containers.RepeatedScalarFieldContainer[str]
    entries: _containers.RepeatedCompositeFieldContainer[RenderedEntry]
    summarized_ranges: _containers.RepeatedCompositeFieldContainer[SummarizedRange]
    def __init__(self, run_id: _Optional[str] = ..., iteration: _Optional[int] = ..., token_counter: _Optional[str] = ..., token_budget: _Optional[int] = ..., token_count: _Optional[int] = ..., event_ids: _Optional[_Iterable[str]] = ..., entries: _Optional[_Iterable[_Union[RenderedEntry, _Mapping]]] = ..., summarized_ranges: _Optional[_Iterable[_Union[SummarizedRange, _Mapping]]] = ...) -> None: ...

class CountTokensRequest(_message.Message):
    __slots__ = ("token_counter", "texts")
    TOKEN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    token_counter: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, token_counter: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ...) -> None: ...

class CountTokensResponse(_message.Message):
    __slots__ = ("token_counter", "counts")
    TOKEN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    token_counter: str
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_counter: _Optional[str] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class GetCapabilitiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCapabilitiesResponse(_message.Message):
    __slots__ = ("capabilities_json",)
    CAPABILITIES_JSON_FIELD_NUMBER: _ClassVar[int]
    capabilities_json: str
    def __init__(self, capabilities_json: _Optional[str] = ...) -> None: ...

class RecordSummaryRequest(_message.Message):
    __slots__ = ("run_id", "iteration", "replaced_event_ids", "summary_text", "strategy", "host_token_count")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    REPLACED_EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_TEXT_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    HOST_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iteration: int
    replaced_event_ids: _containers.RepeatedScalarFieldContainer[str]
    summary_text: str
    strategy: str
    host_token_count: int
    def __init__(self, run_id: _Optional[str] = ..., iteration: _Optional[int] = ..., replaced_event_ids: _Optional[_Iterable[str]] = ..., summary_text: _Optional[str] = ..., strategy: _Optional[str] = ..., host_token_count: _Optional[int] = ...) -> None: ...

class RecordSummaryResponse(_message.Message):
    __slots__ = ("summary_ref", "tokens_before", "tokens_after", "event", "created")
    SUMMARY_REF_FIELD_NUMBER: _ClassVar[int]
    TOKENS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_AFTER_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    summary_ref: str
    tokens_before: int
    tokens_after: int
    event: StoredEvent
    created: bool
    def __init__(self, summary_ref: _Optional[str] = ..., tokens_before: _Optional[int] = ..., tokens_after: _Optional[int] = ..., event: _Optional[_Union[StoredEvent, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetArtifactRequest(_message.Message):
    __slots__ = ("run_id", "artifact_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    artifact_id: str
    def __init__(self, run_id: _Optional[str] = ..., artifact_id: _Optional[str] = ...) -> None: ...

class GetArtifactResponse(_message.Message):
    __slots__ = ("artifact_id", "content", "tokens", "iteration")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    content: str
    tokens: int
    iteration: int
    def __init__(self, artifact_id: _Optional[str] = ..., content: _Optional[str] = ..., tokens: _Optional[int] = ..., iteration: _Optional[int] = ...) -> None: ...

class DeleteArtifactRequest(_message.Message):
    __slots__ = ("run_id", "artifact_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    artifact_id: str
    def __init__(self, run_id: _Optional[str] = ..., artifact_id: _Optional[str] = ...) -> None: ...

class DeleteArtifactResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ForkRunRequest(_message.Message):
    __slots__ = ("source_run_id", "from_seq", "mode", "new_run_id")
    SOURCE_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NEW_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    source_run_id: str
    from_seq: int
    mode: str
    new_run_id: str
    def __init__(self, source_run_id: _Optional[str] = ..., from_seq: _Optional[int] = ..., mode: _Optional[str] = ..., new_run_id: _Optional[str] = ...) -> None: ...

class ForkRunResponse(_message.Message):
    __slots__ = ("settings", "next_seq", "pending_summaries", "created")
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    PENDING_SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    settings: RunSettings
    next_seq: int
    pending_summaries: int
    created: bool
    def __init__(self, settings: _Optional[_Union[RunSettings, _Mapping]] = ..., next_seq: _Optional[int] = ..., pending_summaries: _Optional[int] = ..., created: _Optional[bool] = ...) -> None: ...

class DeleteRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class DeleteRunResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemoryEntry(_message.Message):
    __slots__ = ("id", "content", "tags", "created_at", "expires_at", "tokens", "score")
    ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    id: str
    content: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    tokens: int
    score: float
    def __init__(self, id: _Optional[str] = ..., content: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tokens: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class PutMemoryRequest(_message.Message):
    __slots__ = ("memory_ref", "content", "tags", "ttl_seconds", "entry_id", "embedding")
    MEMORY_REF_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    memory_ref: str
    content: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    ttl_seconds: int
    entry_id: str
    embedding: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, memory_ref: _Optional[str] = ..., content: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., ttl_seconds: _Optional[int] = ..., entry_id: _Optional[str] = ..., embedding: _Optional[_Iterable[float]] = ...) -> None: ...

class PutMemoryResponse(_message.Message):
    __slots__ = ("entry_id", "tokens", "redacted_secret_ids", "replaced")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REDACTED_SECRET_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    tokens: int
    redacted_secret_ids: _containers.RepeatedScalarFieldContainer[str]
    replaced: bool
    def __init__(self, entry_id: _Optional[str] = ..., tokens: _Optional[int] = ..., redacted_secret_ids: _Optional[_Iterable[str]] = ..., replaced: _Optional[bool] = ...) -> None: ...

class GetMemoryRequest(_message.Message):
    __slots__ = ("memory_ref", "entry_id")
    MEMORY_REF_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    memory_ref: str
    entry_id: str
    def __init__(self, memory_ref: _Optional[str] = ..., entry_id: _Optional[str] = ...) -> None: ...

class DeleteMemoryRequest(_message.Message):
    __slots__ = ("memory_ref", "entry_id")
    MEMORY_REF_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    memory_ref: str
    entry_id: str
    def __init__(self, memory_ref: _Optional[str] = ..., entry_id: _Optional[str] = ...) -> None: ...

class DeleteMemoryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListMemoryRequest(_message.Message):
    __slots__ = ("memory_ref", "limit", "tag", "token_budget", "rank", "query", "query_embedding")
    MEMORY_REF_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    QUERY_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    memory_ref: str
    limit: int
    tag: str
    token_budget: int
    rank: str
    query: str
    query_embedding: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, memory_ref: _Optional[str] = ..., limit: _Optional[int] = ..., tag: _Optional[str] = ..., token_budget: _Optional[int] = ..., rank: _Optional[str] = ..., query: _Optional[str] = ..., query_embedding: _Optional[_Iterable[float]] = ...) -> None: ...

class ListMemoryResponse(_message.Message):
    __slots__ = ("entries", "token_counter", "tokens_used", "left_out_for_budget", "rank", "left_out_for_size")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    LEFT_OUT_FOR_BUDGET_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LEFT_OUT_FOR_SIZE_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[MemoryEntry]
    token_counter: str
    tokens_used: int
    left_out_for_budget: int
    rank: str
    left_out_for_size: int
    def __init__(self, entries: _Optional[_Iterable[_Union[MemoryEntry, _Mapping]]] = ..., token_counter: _Optional[str] = ..., tokens_used: _Optional[int] = ..., left_out_for_budget: _Optional[int] = ..., rank: _Optional[str] = ..., left_out_for_size: _Optional[int] = ...) -> None: ...

class Secret(_message.Message):
    __slots__ = ("secret_id", "value")
    SECRET_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    secret_id: str
    value: str
    def __init__(self, secret_id: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class RegisterSecretsRequest(_message.Message):
    __slots__ = ("run_id", "secrets")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    secrets: _containers.RepeatedCompositeFieldContainer[Secret]
    def __init__(self, run_id: _Optional[str] = ..., secrets: _Optional[_Iterable[_Union[Secret, _Mapping]]] = ...) -> None: ...

class RegisterSecretsResponse(_message.Message):
    __slots__ = ("registered",)
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    registered: int
    def __init__(self, registered: _Optional[int] = ...) -> None: ...

class ForgetSecretsRequest(_message.Message):
    __slots__ = ("run_id", "secret_ids")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_IDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    secret_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., secret_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ForgetSecretsResponse(_message.Message):
    __slots__ = ("forgotten",)
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    forgotten: int
    def __init__(self, forgotten: _Optional[int] = ...) -> None: ...

class CompactMemoryRequest(_message.Message):
    __slots__ = ("memory_ref", "source_ids", "summary_text", "token_budget")
    MEMORY_REF_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IDS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    memory_ref: str
    source_ids: _containers.RepeatedScalarFieldContainer[str]
    summary_text: str
    token_budget: int
    def __init__(self, memory_ref: _Optional[str] = ..., source_ids: _Optional[_Iterable[str]] = ..., summary_text: _Optional[str] = ..., token_budget: _Optional[int] = ...) -> None: ...

class CompactMemoryResponse(_message.Message):
    __slots__ = ("compaction_id", "output_id", "source_count", "event", "created")
    COMPACTION_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    compaction_id: str
    output_id: str
    source_count: int
    event: EventNotice
    created: bool
    def __init__(self, compaction_id: _Optional[str] = ..., output_id: _Optional[str] = ..., source_count: _Optional[int] = ..., event: _Optional[_Union[EventNotice, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ListMemoryEventsRequest(_message.Message):
    __slots__ = ("memory_ref", "since_seq", "limit")
    MEMORY_REF_FIELD_NUMBER: _ClassVar[int]
    SINCE_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    memory_ref: str
    since_seq: int
    limit: int
    def __init__(self, memory_ref: _Optional[str] = ..., since_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListMemoryEventsResponse(_message.Message):
    __slots__ = ("events", "next_since_seq")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SINCE_SEQ_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[EventNotice]
    next_since_seq: int
    def __init__(self, events: _Optional[_Iterable[_Union[EventNotice, _Mapping]]] = ..., next_since_seq: _Optional[int] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("types",)
    TYPES_FIELD_NUMBER: _ClassVar[int]
    types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, types: _Optional[_Iterable[str]] = ...) -> None: ...

class EventNotice(_message.Message):
    __slots__ = ("seq", "type", "json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    type: str
    json: str
    def __init__(self, seq: _Optional[int] = ..., type: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class Profile(_message.Message):
    __slots__ = ("system_prompt", "participants", "agents", "skills", "tools", "model_window_tokens")
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    MODEL_WINDOW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    system_prompt: str
    participants: _containers.RepeatedCompositeFieldContainer[Participant]
    agents: _containers.RepeatedCompositeFieldContainer[RemoteAgent]
    skills: _containers.RepeatedCompositeFieldContainer[SkillSummary]
    tools: _containers.RepeatedCompositeFieldContainer[ToolDefinition]
    model_window_tokens: int
    def __init__(self, system_prompt: _Optional[str] = ..., participants: _Optional[_Iterable[_Union[Participant, _Mapping]]] = ..., agents: _Optional[_Iterable[_Union[RemoteAgent, _Mapping]]] = ..., skills: _Optional[_Iterable[_Union[SkillSummary, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[ToolDefinition, _Mapping]]] = ..., model_window_tokens: _Optional[int] = ...) -> None: ...

class Participant(_message.Message):
    __slots__ = ("role", "description")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    role: str
    description: str
    def __init__(self, role: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class RemoteAgent(_message.Message):
    __slots__ = ("id", "name", "description", "skills")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    description: str
    skills: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., skills: _Optional[_Iterable[str]] = ...) -> None: ...

class SkillSummary(_message.Message):
    __slots__ = ("name", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ToolDefinition(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "goal", "acceptance_criteria", "plan")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_CRITERIA_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    goal: str
    acceptance_criteria: _containers.RepeatedScalarFieldContainer[str]
    plan: str
    def __init__(self, task_id: _Optional[str] = ..., goal: _Optional[str] = ..., acceptance_criteria: _Optional[_Iterable[str]] = ..., plan: _Optional[str] = ...) -> None: ...

class UpdateProfileRequest(_message.Message):
    __slots__ = ("run_id", "profile")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    profile: Profile
    def __init__(self, run_id: _Optional[str] = ..., profile: _Optional[_Union[Profile, _Mapping]] = ...) -> None: ...

class UpdateProfileResponse(_message.Message):
    __slots__ = ("prefix_sha256", "changed")
    PREFIX_SHA256_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    prefix_sha256: str
    changed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, prefix_sha256: _Optional[str] = ..., changed: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateTaskRequest(_message.Message):
    __slots__ = ("run_id", "task")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    task: Task
    def __init__(self, run_id: _Optional[str] = ..., task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class UpdateTaskResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadedSkill(_message.Message):
    __slots__ = ("name", "body")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    name: str
    body: str
    def __init__(self, name: _Optional[str] = ..., body: _Optional[str] = ...) -> None: ...

class LoadSkillRequest(_message.Message):
    __slots__ = ("run_id", "skill")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SKILL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    skill: LoadedSkill
    def __init__(self, run_id: _Optional[str] = ..., skill: _Optional[_Union[LoadedSkill, _Mapping]] = ...) -> None: ...

class LoadSkillResponse(_message.Message):
    __slots__ = ("created",)
    CREATED_FIELD_NUMBER: _ClassVar[int]
    created: bool
    def __init__(self, created: _Optional[bool] = ...) -> None: ...

class UnloadSkillRequest(_message.Message):
    __slots__ = ("run_id", "name")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    name: str
    def __init__(self, run_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class UnloadSkillResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PutStateDataRequest(_message.Message):
    __slots__ = ("run_id", "subset", "json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSET_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    subset: str
    json: str
    def __init__(self, run_id: _Optional[str] = ..., subset: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class PutStateDataResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ("run_id", "history_limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    history_limit: int
    def __init__(self, run_id: _Optional[str] = ..., history_limit: _Optional[int] = ...) -> None: ...

class SummaryInForce(_message.Message):
    __slots__ = ("summary_ref", "text", "tokens", "iteration")
    SUMMARY_REF_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    summary_ref: str
    text: str
    tokens: int
    iteration: int
    def __init__(self, summary_ref: _Optional[str] = ..., text: _Optional[str] = ..., tokens: _Optional[int] = ..., iteration: _Optional[int] = ...) -> None: ...

class AgentState(_message.Message):
    __slots__ = ("run_id", "history", "history_total", "running_summary", "task", "loaded_skills", "last_usage", "data_json", "profile")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LOADED_SKILLS_FIELD_NUMBER: _ClassVar[int]
    LAST_USAGE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    history: _containers.RepeatedCompositeFieldContainer[StoredEvent]
    history_total: int
    running_summary: _containers.RepeatedCompositeFieldContainer[SummaryInForce]
    task: Task
    loaded_skills: _containers.RepeatedCompositeFieldContainer[LoadedSkill]
    last_usage: Usage
    data_json: str
    profile: Profile
    def __init__(self, run_id: _Optional[str] = ..., history: _Optional[_Iterable[_Union[StoredEvent, _Mapping]]] = ..., history_total: _Optional[int] = ..., running_summary: _Optional[_Iterable[_Union[SummaryInForce, _Mapping]]] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., loaded_skills: _Optional[_Iterable[_Union[LoadedSkill, _Mapping]]] = ..., last_usage: _Optional[_Union[Usage, _Mapping]] = ..., data_json: _Optional[str] = ..., profile: _Optional[_Union[Profile, _Mapping]] = ...) -> None: ...

class RecordUsageRequest(_message.Message):
    __slots__ = ("run_id", "iteration", "input_tokens", "cached_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_READ_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_CREATION_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iteration: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    def __init__(self, run_id: _Optional[str] = ..., iteration: _Optional[int] = ..., input_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cache_read_input_tokens: _Optional[int] = ..., cache_creation_input_tokens: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("iteration", "input_tokens", "cached_tokens", "output_tokens", "fed_tokens", "drift_tokens", "recorded_at", "cache_read_input_tokens", "cache_creation_input_tokens", "predicted_cached_tokens", "reported_cached_tokens")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRIFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    CACHE_READ_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_CREATION_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPORTED_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    fed_tokens: int
    drift_tokens: int
    recorded_at: _timestamp_pb2.Timestamp
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    predicted_cached_tokens: int
    reported_cached_tokens: int
    def __init__(self, iteration: _Optional[int] = ..., input_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., fed_tokens: _Optional[int] = ..., drift_tokens: _Optional[int] = ..., recorded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cache_read_input_tokens: _Optional[int] = ..., cache_creation_input_tokens: _Optional[int] = ..., predicted_cached_tokens: _Optional[int] = ..., reported_cached_tokens: _Optional[int] = ...) -> None: ...

class ListCompactionRecordsRequest(_message.Message):
    __slots__ = ("run_id", "from_index", "limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_INDEX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    from_index: int
    limit: int
    def __init__(self, run_id: _Optional[str] = ..., from_index: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class CompactionRecord(_message.Message):
    __slots__ = ("index", "task_id", "iteration", "removed_event_ids", "summary_ref", "tokens_before", "tokens_after", "recorded_at", "summarised_by", "seq", "kind")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    REMOVED_EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_REF_FIELD_NUMBER: _ClassVar[int]
    TOKENS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_AFTER_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    SUMMARISED_BY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    index: int
    task_id: str
    iteration: int
    removed_event_ids: _containers.RepeatedScalarFieldContainer[str]
    summary_ref: str
    tokens_before: int
    tokens_after: int
    recorded_at: _timestamp_pb2.Timestamp
    summarised_by: str
    seq: int
    kind: str
    def __init__(self, index: _Optional[int] = ..., task_id: _Optional[str] = ..., iteration: _Optional[int] = ..., removed_event_ids: _Optional[_Iterable[str]] = ..., summary_ref: _Optional[str] = ..., tokens_before: _Optional[int] = ..., tokens_after: _Optional[int] = ..., recorded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., summarised_by: _Optional[str] = ..., seq: _Optional[int] = ..., kind: _Optional[str] = ...) -> None: ...

class ListCompactionRecordsResponse(_message.Message):
    __slots__ = ("records", "next_from_index")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FROM_INDEX_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[CompactionRecord]
    next_from_index: int
    def __init__(self, records: _Optional[_Iterable[_Union[CompactionRecord, _Mapping]]] = ..., next_from_index: _Optional[int] = ...) -> None: ...
