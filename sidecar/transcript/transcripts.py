"""The transcript domain's API: runs, their event logs, the per-turn window, summaries, forks.

Each method validates what it can before taking the write lock (token counting is the costly
part and needs no lock), then does all of its writing in one LMDB transaction: a call's writes
land together or not at all. The work lives in one module per concern: ``runs``, ``log``,
``window``, ``summaries``, ``forks``, ``clearing`` and the turn itself, ``turn``; their keys and
records in ``schema``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, overload

from sidecar.caching import Cache, Caches, CacheSpec
from sidecar.context_window import sections
from sidecar.context_window.profiles import Profile, Task
from sidecar.context_window.sections import HistoryCache, Section
from sidecar.context_window.state import Usage
from sidecar.errors import NO_DEADLINE, Deadline, NotFound, ValidationError
from sidecar.settings import ClearingSettings, ContextSettings, RenderSettings
from sidecar.storage.codec import StoredEvent, decode_event
from sidecar.storage.environment import Store, after_commit
from sidecar.storage.keys import Txn
from sidecar.telemetry import tracing
from sidecar.text.counting import Counters
from sidecar.text.fencing import fence
from sidecar.text.redaction import Redactor, redact_json_text, refuse_secrets
from sidecar.transcript import forks
from sidecar.transcript.log import (
    AppendResult,
    LogWriter,
    NewEvent,
    append_host_events,
    check_request_size,
    count_events,
    prepare_events,
)
from sidecar.transcript.reassembly import REASSEMBLIES, Reassemblies
from sidecar.transcript.run_context import RunContexts
from sidecar.transcript.runs import (
    Deps,
    Run,
    RunSettings,
    check_given_settings,
    confirm_settings,
    default_settings,
    load_run,
    require_run,
    save_run,
)
from sidecar.transcript.schema import (
    CompactionRecord,
    FedForm,
    WindowRecord,
    artifact,
    compaction_records,
    event_record,
    forms_listed,
    iter_records,
    log_entries_in,
    read_ids,
    run_id_of,
    run_key,
    run_keys_of,
    window_at,
    window_count,
    windows_from,
)
from sidecar.transcript.summaries import (
    Summary,
    SummaryRequest,
    load_summary,
    newest_in_force,
    read_artifacts,
    record_summary,
)
from sidecar.transcript.summaries import fed_tokens as fed_summary_tokens
from sidecar.transcript.turn import AssembledContext, Recorded, Turn, TurnServices
from sidecar.transcript.window import ReadBack, TranscriptWindow, from_record
from sidecar.validation import check_at_least, check_id, check_unbroken_runs, page_size, page_within_bytes


@dataclass(frozen=True, slots=True)
class RunOverview:
    """One run, as a reader browsing the store first sees it."""

    run_id: str
    turns: int  # iterations whose window was fed
    tokens: int  # everything fed on the newest of them
    last_turn_ms: int  # when the newest was first assembled (ms since the epoch; 0: never)
    summaries: int  # summaries recorded in the run
    settings: RunSettings  # its window policy and budget, as it was opened (a run keeps them)


@dataclass(frozen=True, slots=True)
class WindowChanges:
    """What a fed window changed against the run's window fed before it (on the run's first, nothing):
    found by comparing the two persisted records, so every change is named, not only the first
    reason the cache report gives."""

    summaries_entered: tuple[Summary, ...] = ()  # fed now, not before (each as recorded)
    summaries_left: tuple[str, ...] = ()  # the refs of summaries fed before, not now
    cleared: tuple[FedForm, ...] = ()  # tool results fed as their cleared placeholder now, not before
    # The ids of the first event fed verbatim (after the summaries) before and now, when it changed:
    # the window's start moved. "": the window had none.
    start_moved: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class TurnOverview:
    """One fed window of a run, in brief."""

    iteration: int
    budget: int  # the transcript's token budget
    transcript_tokens: int  # the transcript fed, its clips as clipped
    fed_tokens: int  # everything fed: the transcript, the sections and the tools
    summaries: int  # summaries fed in the window
    clipped_tokens: int  # of transcript_tokens: the events fed clipped (in this turn or before), as clipped
    cleared_tokens: int  # of transcript_tokens: the tool results fed as their cleared placeholders
    # The request's cache report as persisted with the window (0 and "": a window persisted
    # before it was): the tokens repeating the previous request's, the whole request's, and why
    # the repetition stopped short of all the previous request ("": it did not).
    predicted_cached_tokens: int = 0
    request_tokens: int = 0
    break_reason: str = ""
    reported_cached_tokens: int | None = None  # the provider's, as RecordUsage gave it (None: not called)
    summary_tokens: int = 0  # of transcript_tokens: the summaries fed
    rendering: str = ""  # the form the cache report counted the request in ("": the plain window)
    usage: Usage | None = None  # RecordUsage's figures for the iteration (None: not called)
    changes: WindowChanges = WindowChanges()
    # Of the sections and tools (fed_tokens - transcript_tokens): the static sections' and the
    # tools' (None: a window persisted before its record kept them apart).
    static_tokens: int | None = None


R = TypeVar("R")  # what a writing call's caller makes of its result (``respond``)
# Each run's token counter by its key, as its last append found it: what a call counts its
# events in before it takes the write lock. Only a guess: the transaction counts again if the
# run's counter turns out another (a run deleted and opened again), so a stale one costs time only.
RUN_COUNTERS = CacheSpec(
    "run_counters", key="run key", valid="a hint, checked in the write transaction against the run's record",
    max_bytes=8 << 20)

# The area's calls, bound to the caches of a Transcripts that holds its own.
_API = ("open_run", "delete_run", "fork_run", "append_events", "list_events", "assemble", "transcript_window",
        "record_summary", "get_artifact", "delete_artifact", "state", "compaction_records")

__all__ = ["AppendResult", "AssembledContext", "CompactionRecord", "NewEvent", "RunSettings", "Section", "Summary",
           "SummaryRequest", "TranscriptWindow", "Transcripts"]


@dataclass(frozen=True, slots=True)
class AgentStateView:
    history: list[StoredEvent]  # the newest unsummarised events, oldest first
    history_total: int
    running_summary: list[StoredEvent]  # the summaries in force, as their artifacts
    task: Task
    skills: tuple
    last_usage: Any
    data: dict[str, Any]
    profile: Profile


class Transcripts:
    def __init__(self, store: Store, counters: Counters, defaults: ContextSettings,
                 redactor: Redactor | None = None, contexts: RunContexts | None = None,
                 clearing_settings: ClearingSettings | None = None, render: RenderSettings | None = None,
                 clock: Callable[[], float] = time.time, caches: Caches | None = None) -> None:
        """``caches``: the server's, which its calls find bound (by default, caches of this object's
        own, on, bound around each of its calls: what in-process callers, benchmarks and tests, get)."""
        if caches is None:
            caches = Caches(bounds={REASSEMBLIES.name: defaults.reassembly_cache})
            for name in _API:
                setattr(self, name, caches.binding(getattr(self, name)))
        self._store = store
        self._render = render or RenderSettings()
        self._clearing = clearing_settings or ClearingSettings()
        # A run's own databases: its log and its context, never memory's or the tenant's events.
        self._db = store.handles("runs", "run_context")
        self._deps = Deps(self._db, counters, defaults)
        self._redactor = redactor or Redactor()
        self.contexts = contexts or RunContexts(store, counters, defaults, self._redactor, caches=caches)
        reassemblies: Reassemblies[AssembledContext] = Reassemblies(caches)
        self._reassemblies = reassemblies if reassemblies.enabled else None
        self._run_counters: Cache[bytes, str] = caches.of(RUN_COUNTERS)
        self._turns = TurnServices(store, self._deps, self.contexts, self._clearing, self._render,
                                   HistoryCache(caches), ReadBack(caches), self._reassemblies, clock)

    def _sanitised(self, tenant: str, run_id: str, events: list[NewEvent], field: str) -> list[NewEvent]:
        """Before an event is counted or stored: SR-1 (its content is redacted; a tool call's
        JSON arguments string by string, so they stay JSON), then untrusted content (every role
        "tool" event's, and events marked untrusted) goes inside the untrusted-data block. The
        count and the budget are then of exactly what is fed. An event's id, type, tool name and call
        id are identifiers, stored and fed as they are: one holding a secret is refused, like a
        tool's name."""
        sanitised = []
        redact = self._redactor.redacting(tenant, run_id)
        for i, event in enumerate(events):
            refuse_secrets(redact, [(f"{field}[{i}].event_id", event.event_id), (f"{field}[{i}].type", event.type),
                                    (f"{field}[{i}].tool_name", event.tool_name),
                                    (f"{field}[{i}].call_id", event.call_id)])
            if event.tool_name:
                content = redact_json_text(event.content, redact, f"{field}[{i}].content")[0]
            else:
                content = redact(event.content)
            if event.role == "tool" or event.untrusted:
                content = fence(content, "tool" if event.role == "tool" else "data")
            sanitised.append(event.with_content(content))
        return sanitised

    # -- runs ---------------------------------------------------------------------------------

    def open_run(self, tenant: str, run_id: str, profile: Profile | None = None, task: Task | None = None,
                 **given: Any) -> tuple[RunSettings, bool]:
        """Create the run, or confirm an existing one whose settings match every field given
        (``token_counter``, ``transcript_token_budget``, ``keep_last_turns``, ``transcript_window``,
        ``summarization``, ``summarization_strategy``, ``keep_last_tokens``, ``profile``, ``task``;
        None: not given)."""
        key = run_key(tenant, run_id)
        given = {name: value for name, value in given.items() if value is not None}
        requested = check_given_settings(self._deps.defaults, self._deps.counters, given)
        with self._store.read() as txn:
            existing = load_run(txn, self._db, key)
            new = self.contexts.prepare_new(tenant, run_id, existing or Run(requested), profile, task)
            if existing is not None:
                confirm_settings(existing, run_id, given)
                self.contexts.confirm(txn, key, existing, run_id, new)
                return existing.settings, False

        def create(txn: Txn) -> tuple[RunSettings, bool]:
            run = load_run(txn, self._db, key)
            if run is not None:  # created between our read and this write
                confirm_settings(run, run_id, given)
                self.contexts.confirm(txn, key, run, run_id, new)
                return run.settings, False
            run = Run(requested)
            self.contexts.store_new(txn, key, run, new)
            save_run(txn, self._db, key, run)
            return requested, True

        return self._store.write(create)

    def delete_run(self, tenant: str, run_id: str) -> None:
        key = run_key(tenant, run_id)
        self._store.write(lambda txn: forks.delete_run(txn, self._db, key, run_id), frees_space=True)

    def fork_run(self, tenant: str, source_run_id: str, from_seq: int, mode: str,
                 new_run_id: str) -> tuple[Run, bool]:
        source_key = run_key(tenant, source_run_id, "source_run_id")
        fork_key = run_key(tenant, new_run_id, "new_run_id")
        if fork_key == source_key:
            raise ValidationError.field("new_run_id", "must differ from source_run_id")
        return self._store.write(lambda txn: forks.fork_run(
            self._deps, txn, source_key, source_run_id, fork_key, new_run_id, from_seq, mode))

    # -- events -------------------------------------------------------------------------------

    @overload
    def append_events(self, tenant: str, run_id: str, events: Sequence[NewEvent],
                      deadline: Deadline = NO_DEADLINE) -> list[AppendResult]: ...

    @overload
    def append_events(self, tenant: str, run_id: str, events: Sequence[NewEvent], deadline: Deadline = NO_DEADLINE,
                      *, respond: Callable[[list[AppendResult]], R]) -> R: ...

    def append_events(self, tenant: str, run_id: str, events: Sequence[NewEvent], deadline: Deadline = NO_DEADLINE,
                      *, respond: Callable[[list[AppendResult]], R] | None = None) -> list[AppendResult] | R:
        """Append ``events`` in one transaction: all of them or none (none once ``deadline`` passed).
        ``respond``: what the caller makes of the results, made while the commit syncs
        (``Store.write``'s ``then``) and returned in their place."""
        key = run_key(tenant, run_id)
        if not events:
            raise ValidationError.field("events", "at least one event is required")
        check_request_size("events", [e.content for e in events], self._deps.defaults)
        prepared = self._sanitised(tenant, run_id, prepare_events(events, "events", self._deps.defaults), "events")
        deadline.check("while the events were redacted")
        append = self._appender(key, prepared, "events", deadline)

        def write(txn: Txn) -> list[AppendResult]:
            writer = LogWriter(txn, self._db, key, load_run(txn, self._db, key) or self._new_run())
            results = append(writer)
            writer.flush()
            return results

        if respond is None:
            return self._store.write(write)
        return self._store.write(write, then=respond)

    def _new_run(self) -> Run:
        return Run(default_settings(self._deps.defaults))

    def _appender(self, key: bytes, events: Sequence[NewEvent], field: str,
                  deadline: Deadline) -> Callable[[LogWriter], list[AppendResult]]:
        """Count tokens now, outside the write lock; return what appends them in the transaction.
        A passed ``deadline`` stops the call after counting and again once the write lock is held
        (raising there aborts the transaction: nothing is written). The counter is the run's as
        last seen here: the transaction counts again if the run's turns out another (a run deleted
        and opened again), and that one is kept."""
        counter = seen = self._run_counters.get(key)
        if counter is None:
            with self._store.read() as txn:
                run = load_run(txn, self._db, key)
            counter = run.settings.token_counter if run else self._deps.defaults.token_counter
        with tracing.phase("count"):
            counts = count_events(self._deps.counters, counter, events, field) if events else []
        deadline.check("while the events were counted")

        def append(writer: LogWriter) -> list[AppendResult]:
            nonlocal counter, counts
            deadline.check("while the call waited to write")
            if writer.run.settings.token_counter != counter:  # the run was opened (again) meanwhile
                counter = writer.run.settings.token_counter
                with tracing.phase("count"):
                    counts = count_events(self._deps.counters, counter, events, field)
            if counter != seen:  # kept once committed: a run a refused turn would have made does not exist
                after_commit(self._run_counters.put, key, counter, len(key) + len(counter))
            replay = (lambda w, e: forks.before_host_event(self._deps, w, e)) if writer.run.replay_pending else None
            return append_host_events(writer, events, counts, field, replay)

        return append

    def list_events(self, tenant: str, run_id: str, from_seq: int = 0,
                    limit: int = 0) -> tuple[list[StoredEvent], int | None]:
        """Stored entries from ``from_seq`` on, and the seq to continue from (None at the end)."""
        key = run_key(tenant, run_id)
        check_at_least("from_seq", from_seq, 0)
        limit = page_size("limit", limit)
        with self._store.read() as txn:
            run = require_run(txn, self._db, key, run_id)
            end = min(run.next_seq, from_seq + limit)
            records, _ = page_within_bytes(iter_records(txn, self._db, key, from_seq, end))
            events = [decode_event(record) for record in records]
        end = from_seq + len(events)
        return events, (end if end < run.next_seq else None)

    # -- the per-turn window ------------------------------------------------------------------

    @overload
    def assemble(self, tenant: str, run_id: str, iteration: int, new_events: Sequence[NewEvent] = (),
                 max_transcript_tokens: int | None = None, render: str = "",
                 deadline: Deadline = NO_DEADLINE) -> tuple[AssembledContext, list[AppendResult]]: ...

    @overload
    def assemble(self, tenant: str, run_id: str, iteration: int, new_events: Sequence[NewEvent] = (),
                 max_transcript_tokens: int | None = None, render: str = "", deadline: Deadline = NO_DEADLINE, *,
                 respond: Callable[[AssembledContext, list[AppendResult]], R]) -> R: ...

    def assemble(self, tenant: str, run_id: str, iteration: int, new_events: Sequence[NewEvent] = (),
                 max_transcript_tokens: int | None = None, render: str = "", deadline: Deadline = NO_DEADLINE, *,
                 respond: Callable[[AssembledContext, list[AppendResult]], R] | None = None,
                 ) -> tuple[AssembledContext, list[AppendResult]] | R:
        """Append this turn's events, choose and persist the window for ``iteration`` and decide
        compaction: one transaction (none once ``deadline`` passed). ``render``: also the provider
        request body. The turn itself is ``turn.Turn``. ``respond``: what the caller makes of the
        answer and the appended events' results, returned in their place; a turn makes it while
        its commit syncs."""
        if respond is None:
            return self.assemble(tenant, run_id, iteration, new_events, max_transcript_tokens, render, deadline,
                                 respond=_pair)
        key = run_key(tenant, run_id)
        check_at_least("iteration", iteration, 1)
        if max_transcript_tokens is not None:
            check_at_least("max_transcript_tokens", max_transcript_tokens, 1)
        sections.check_render(render)
        check_request_size("append_events", [e.content for e in new_events], self._deps.defaults)
        events = self._sanitised(tenant, run_id,
                                 prepare_events(new_events, "append_events", self._deps.defaults, turn=iteration),
                                 "append_events")
        turn = Turn(self._turns, key, run_id, iteration, max_transcript_tokens, render)
        if not events:
            # Re-assembling an iteration whose window is persisted and unchanged writes nothing.
            assembled = turn.as_persisted()
            if assembled is not None:
                return respond(assembled, [])
        deadline.check("while the events were redacted")
        return turn.assemble(events, self._appender(key, events, "append_events", deadline), deadline, respond)

    def transcript_window(self, tenant: str, run_id: str, iteration: int) -> TranscriptWindow:
        """What AssembleContext fed for ``iteration`` (RFC 0111's transcript-window seam)."""
        key = run_key(tenant, run_id)
        check_at_least("iteration", iteration, 1)
        with self._store.read() as txn:
            require_run(txn, self._db, key, run_id)
            record = window_at(txn, self._db, key, iteration)
            if record is None:
                raise NotFound(f"iteration {iteration} of run {run_id!r} was never assembled")
            return from_record(self._deps, txn, key, run_id, iteration, record, with_ranges=True)

    def recorded_request(self, tenant: str, run_id: str, iteration: int,
                         render: str) -> tuple[Recorded, Recorded | None]:
        """The request fed for ``iteration`` in form ``render``, and the one its cache report
        compares with (the newest earlier window's; None: a first turn), as their persisted
        windows fed them: read only, nothing planned again or written (``Turn.as_recorded``)."""
        key = run_key(tenant, run_id)
        check_at_least("iteration", iteration, 1)
        sections.check_render(render)
        # Caches of its own, off: a reader's old window must not displace the run's newest in
        # the caches its next turn reads (an answer is the same with them or without).
        off = Caches(enabled=False)
        services = replace(self._turns, history=HistoryCache(off), reads=ReadBack(off), reassemblies=None)
        recorded = Turn(services, key, run_id, iteration, None, render).as_recorded()
        before = recorded.previous_iteration
        return recorded, Turn(services, key, run_id, before, None, render).as_recorded() if before else None

    def runs(self, tenant: str, search: str = "", skip: int = 0,
             limit: int = 100) -> tuple[list[RunOverview], int]:
        """Up to ``limit`` of the runs of ``tenant`` whose id contains ``search``, in id order,
        after the first ``skip``, each with its newest fed window's size; and how many match. The
        runs are matched by their keys alone: only the page's are read."""
        with self._store.read() as txn:
            matching = [key for key in run_keys_of(txn, self._db, tenant) if search in run_id_of(key)]
            overviews = []
            for key in matching[skip:skip + limit]:
                run = require_run(txn, self._db, key, run_id_of(key))
                newest = window_at(txn, self._db, key, run.last_assembled) if run.last_assembled else None
                overviews.append(RunOverview(run_id_of(key), window_count(txn, self._db, key),
                                             newest.fed_tokens if newest else 0, run.last_turn_ms, run.summaries,
                                             run.settings))
        return overviews, len(matching)

    def turns(self, tenant: str, run_id: str, skip: int = 0, limit: int = 100) -> tuple[list[TurnOverview], int]:
        """Up to ``limit`` of the windows fed in the run, by iteration, after its first ``skip``,
        and how many there are (NotFound: no such run of ``tenant``). Only those are read in full,
        and the one before them, which the first of them is compared with."""
        key = run_key(tenant, run_id)
        db = self._db
        with self._store.read() as txn:
            require_run(txn, db, key, run_id)
            turns = []
            windows = windows_from(txn, db, key, max(skip - 1, 0), limit + (skip > 0))
            before: tuple[WindowRecord, list[FedForm]] | None = None
            for position, (iteration, record) in enumerate(windows):
                forms = forms_listed(txn, db, key, record.fed or [])
                if position == 0 and skip > 0:
                    before = record, forms
                    continue
                report = sections.cache_report(record.cache) if record.cache else None
                usage = self.contexts.usage_of(txn, key, iteration)
                # Clipped in this turn (the record holds the text), or in another form made before.
                clipped = sum(tokens for _, _, tokens in record.clipped) + \
                    sum(form.tokens for form in forms if form.kind == "clipped")
                turns.append(TurnOverview(
                    iteration, record.budget, record.tokens, record.fed_tokens, len(record.summaries), clipped,
                    sum(form.tokens for form in forms if form.kind == "cleared"),
                    report.stable_prefix_tokens if report else 0, report.request_tokens if report else 0,
                    report.break_reason if report else "", usage.reported_cached_tokens if usage else None,
                    fed_summary_tokens(txn, db, key, [index for index, _ in record.summaries]),
                    (record.cache or {}).get("form", ""), usage,
                    _changes(txn, db, key, before, record, forms) if before else WindowChanges(),
                    (record.context or {}).get("static_tokens")))
                before = record, forms
            return turns, window_count(txn, db, key)

    # -- summaries ----------------------------------------------------------------------------

    @overload
    def record_summary(self, tenant: str, run_id: str,
                       request: SummaryRequest) -> tuple[Summary, StoredEvent, bool]: ...

    @overload
    def record_summary(self, tenant: str, run_id: str, request: SummaryRequest, *,
                       respond: Callable[[tuple[Summary, StoredEvent, bool]], R]) -> R: ...

    def record_summary(self, tenant: str, run_id: str, request: SummaryRequest, *,
                       respond: Callable[[tuple[Summary, StoredEvent, bool]], R] | None = None,
                       ) -> tuple[Summary, StoredEvent, bool] | R:
        """Record the host's summary of the oldest unsummarised turns; see ``summaries``.
        Returns (summary, its context.summarized entry, whether this call recorded it), or what
        ``respond`` makes of that while the commit syncs."""
        key = run_key(tenant, run_id)
        request = request.with_text(self._redactor.redact(tenant, run_id, request.text).text)

        def write(txn: Txn) -> tuple[Summary, StoredEvent, bool]:
            writer = LogWriter(txn, self._db, key, require_run(txn, self._db, key, run_id))
            replayed = forks.recorded_for(self._deps, writer, tuple(request.replaced_ids))
            if replayed is not None:
                writer.flush()
                return replayed[0], replayed[1], True
            result = record_summary(self._deps, writer, request)
            writer.flush()
            return result

        if respond is None:
            return self._store.write(write)
        return self._store.write(write, then=respond)

    def get_artifact(self, tenant: str, run_id: str, artifact_id: str) -> StoredEvent:
        """A summary artifact: the summary entry, its text in ``content``."""
        key = run_key(tenant, run_id)
        check_id("artifact_id", artifact_id)
        with self._store.read() as txn:
            require_run(txn, self._db, key, run_id)
            data = artifact(txn, self._db, key, artifact_id)
            if data is None:
                raise NotFound(f"artifact {artifact_id!r} of run {run_id!r} not found")
            return decode_event(data)

    def delete_artifact(self, tenant: str, run_id: str, artifact_id: str) -> None:
        key = run_key(tenant, run_id)
        check_id("artifact_id", artifact_id)
        self._store.write(lambda txn: forks.delete_artifact(txn, self._db, key, run_id, artifact_id), frees_space=True)
        if self._reassemblies is not None:  # it may be a summary's, which a kept answer feeds
            self._reassemblies.forget(key)

    # -- agent state and compaction records ----------------------------------------------------

    def state(self, tenant: str, run_id: str, history_limit: int = 0) -> AgentStateView:
        """The run's agent state: the history no summary replaced yet, the summaries in force
        (the running summary), the task and skills, the last usage and the data."""
        key = run_key(tenant, run_id)
        limit = page_size("history_limit", history_limit)
        with self._store.read() as txn:
            run = require_run(txn, self._db, key, run_id)
            newest = load_summary(txn, self._db, key, run.summaries - 1) if run.summaries else None
            floor = newest.to_seq if newest else 0
            entries = set(log_entries_in(txn, self._db, key, floor, run.next_seq))
            seqs = [seq for seq in range(floor, run.next_seq) if seq not in entries]
            # The newest first, up to the page's bytes; then oldest first.
            newest_first, _ = page_within_bytes(event_record(txn, self._db, key, seq)
                                                for seq in reversed(seqs[-limit:]))
            history = [decode_event(raw) for raw in reversed(newest_first)]
            # The running summary is the whole stack in force: GetState answers it all.
            stack = newest_in_force(txn, self._db, key, newest, newest.depth, run.incarnation) if newest else []
            summaries = [decode_event(raw) for raw in read_artifacts(txn, self._db, key, [s.ref for s in stack])]
            task = self.contexts.task_of(txn, key, run)
            return AgentStateView(history, len(seqs), summaries, task.task, task.skills,
                                  self.contexts.last_usage(txn, key), self.contexts.state_data(txn, key),
                                  self.contexts.profile(txn, key, run).profile)

    def compaction_records(self, tenant: str, run_id: str, from_index: int = 0,
                           limit: int = 0) -> tuple[list[CompactionRecord], int | None]:
        """The run's compaction records from ``from_index``, and where the next page starts."""
        key = run_key(tenant, run_id)
        check_at_least("from_index", from_index, 0)
        limit = page_size("limit", limit)
        with self._store.read() as txn:
            run = require_run(txn, self._db, key, run_id)
            records = compaction_records(txn, self._db, key, from_index, limit)
        end = from_index + len(records)
        return records, (end if end < run.log_entries else None)

    # -- counting -----------------------------------------------------------------------------

    def count_tokens(self, counter_name: str, texts: Sequence[str],
                     deadline: Deadline = NO_DEADLINE) -> tuple[str, list[int]]:
        """The counter's name and each text's count (CountTokens), within the same caps as an
        append; stops between texts once ``deadline`` passed."""
        check_request_size("texts", texts, self._deps.defaults)
        for i, text in enumerate(texts):
            check_unbroken_runs(f"texts[{i}]", text)
        counter = self._deps.counters.get(counter_name)
        counts = []
        with tracing.phase("count"):
            for text in texts:
                deadline.check("while the texts were counted")
                counts.append(counter.count(text))
        return counter.name, counts


def _first_verbatim(record: WindowRecord) -> int | None:
    """The seq of the first event a window fed after its summaries (None: it fed none)."""
    skipped = set(record.skip)
    return next((seq for seq in range(record.start, record.end) if seq not in skipped), None)


def _changes(txn: Txn, db: dict, key: bytes, before: tuple[WindowRecord, list[FedForm]], record: WindowRecord,
             forms: list[FedForm]) -> WindowChanges:
    """What ``record`` changed against the window fed before it (``before``, with its forms)."""
    previous, previous_forms = before
    refs_before = {ref for _, ref in previous.summaries}
    refs_now = {ref for _, ref in record.summaries}
    entered = tuple(load_summary(txn, db, key, index) for index, ref in record.summaries if ref not in refs_before)
    cleared_before = {form.seq for form in previous_forms if form.kind == "cleared"}
    first_before, first_now = _first_verbatim(previous), _first_verbatim(record)
    moved = None
    if first_before != first_now:
        def event_id(seq: int | None) -> str:
            return "" if seq is None else read_ids(txn, db, key, seq, seq + 1)[0]
        moved = event_id(first_before), event_id(first_now)
    return WindowChanges(entered, tuple(ref for _, ref in previous.summaries if ref not in refs_now),
                         tuple(form for form in forms if form.kind == "cleared" and form.seq not in cleared_before),
                         moved)


def _pair(assembled: AssembledContext, appended: list[AppendResult]) -> tuple[AssembledContext, list[AppendResult]]:
    return assembled, appended
