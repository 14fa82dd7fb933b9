"""The transcript domain's API: runs, their event logs, the per-turn window, summaries, forks.

Each method validates what it can before taking the write lock (token counting is the costly
part and needs no lock), then does all of its writing in one LMDB transaction: a call's writes
land together or not at all. The work lives in one module per concern: ``runs``, ``eventlog``,
``window``, ``summaries`` and ``forks``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import lmdb

from sidecar.context_window import sections as context_window
from sidecar.context_window.policy import HistoryEvent, SummariseInput, SummariseResult, TriggerInput
from sidecar.context_window.profiles import Profile, Task
from sidecar.context_window.rendering import HistoryItem
from sidecar.context_window.run_context import RunContexts
from sidecar.context_window.sections import CacheReport, HistoryCache, Layout, Section
from sidecar.errors import NO_DEADLINE, Deadline, NotFound, PluginFailed, SidecarError, ValidationError
from sidecar.settings import ClearingSettings, ContextSettings, RenderSettings
from sidecar.storage.codec import StoredEvent, decode_event, dump_json, load_json
from sidecar.storage.environment import Store
from sidecar.storage.keys import be32
from sidecar.text.counting import Counters
from sidecar.text.fencing import fence
from sidecar.text.redaction import Redactor, redact_json_text
from sidecar.transcript import clearing, forks
from sidecar.transcript.log import (
    AppendResult,
    LogWriter,
    NewEvent,
    append_host_events,
    check_request_size,
    count_events,
    iter_records,
    log_entries_in,
    prepare_events,
    read_records,
)
from sidecar.transcript.runs import (
    SIDECAR_ID_PREFIX,
    Deps,
    Run,
    RunSettings,
    check_given_settings,
    confirm_settings,
    default_settings,
    load_run,
    require_run,
    run_key,
    save_run,
)
from sidecar.transcript.summaries import (
    Candidates,
    Compaction,
    Summary,
    SummaryRequest,
    candidates,
    compaction_records,
    extractive_summary,
    load_summary,
    newest_in_force,
    read_artifact,
    read_artifacts,
    record_summary,
    tokens_of,
)
from sidecar.transcript.window import (
    Plan,
    TranscriptWindow,
    effective_budget,
    from_record,
    persist,
    plan,
    previous_window_record,
)
from sidecar.validation import check_at_least, check_id, page_size, page_within_bytes

__all__ = ["AppendResult", "AssembledContext", "NewEvent", "RunSettings", "Section", "Summary", "SummaryRequest",
           "TranscriptWindow", "Transcripts"]


@dataclass(frozen=True, slots=True)
class AssembledContext:
    """What one turn is fed: the transcript window and the sections around it."""

    window: TranscriptWindow
    sections: tuple[Section, ...]
    prefix_sha256: str
    prefix_changed: tuple[str, ...]
    window_tokens: int
    tools_tokens: int
    turn_limit: int
    task_id: str
    rendered: str  # the provider request body, when one was asked for
    cache: CacheReport  # what of it repeats the previous assembly's request


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
                 clearing_settings: ClearingSettings | None = None, render: RenderSettings | None = None) -> None:
        self._store = store
        self._render = render or RenderSettings()
        self._clearing = clearing_settings or ClearingSettings()
        # A run's own databases: its log and its context, never memory's or the tenant's events.
        self._db = store.handles("runs", "run_context")
        self._deps = Deps(self._db, counters, defaults)
        self._redactor = redactor or Redactor()
        self.contexts = contexts or RunContexts(store, counters, defaults, self._redactor)
        self._history = HistoryCache()

    def _sanitised(self, tenant: str, run_id: str, events: list[NewEvent], field: str) -> list[NewEvent]:
        """Before an event is counted or stored: SR-1 (its content is redacted; a tool call's
        JSON arguments string by string, so they stay JSON), then untrusted content (every role
        "tool" event's, and events marked untrusted) goes inside the untrusted-data block. The
        count and the budget are then of exactly what is fed."""
        sanitised = []
        redact = self._redactor.redacting(tenant, run_id)
        for i, event in enumerate(events):
            if event.tool_name:
                content = redact_json_text(event.content, redact, f"{field}[{i}].content")[0]
            else:
                content = redact(event.content)
            if event.role == "tool" or event.untrusted:
                content = fence(content, "tool" if event.role == "tool" else "data")
            sanitised.append(replace(event, content=content))
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

        def create(txn: lmdb.Transaction) -> tuple[RunSettings, bool]:
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

    def append_events(self, tenant: str, run_id: str, events: Sequence[NewEvent],
                      deadline: Deadline = NO_DEADLINE) -> list[AppendResult]:
        """Append ``events`` in one transaction: all of them or none (none once ``deadline`` passed)."""
        key = run_key(tenant, run_id)
        if not events:
            raise ValidationError.field("events", "at least one event is required")
        check_request_size("events", [e.content for e in events], self._deps.defaults)
        prepared = self._sanitised(tenant, run_id, prepare_events(events, "events", self._deps.defaults), "events")
        deadline.check("while the events were redacted")
        append = self._appender(key, prepared, "events", deadline)

        def write(txn: lmdb.Transaction) -> list[AppendResult]:
            writer = LogWriter(txn, self._db, key, load_run(txn, self._db, key) or self._new_run())
            results = append(writer)
            writer.flush()
            return results

        return self._store.write(write)

    def _new_run(self) -> Run:
        return Run(default_settings(self._deps.defaults))

    def _appender(self, key: bytes, events: Sequence[NewEvent], field: str,
                  deadline: Deadline) -> Callable[[LogWriter], list[AppendResult]]:
        """Count tokens now, outside the write lock; return what appends them in the transaction.
        A passed ``deadline`` stops the call after counting and again once the write lock is held
        (raising there aborts the transaction: nothing is written)."""
        with self._store.read() as txn:
            run = load_run(txn, self._db, key)
        counter = run.settings.token_counter if run else self._deps.defaults.token_counter
        counts = count_events(self._deps.counters, counter, events, field) if events else []
        deadline.check("while the events were counted")

        def append(writer: LogWriter) -> list[AppendResult]:
            nonlocal counter, counts
            deadline.check("while the call waited to write")
            if writer.run.settings.token_counter != counter:  # the run was opened meanwhile
                counter = writer.run.settings.token_counter
                counts = count_events(self._deps.counters, counter, events, field)
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
            records, _ = page_within_bytes(iter_records(txn, self._db, key, from_seq, min(run.next_seq, from_seq + limit)))
            events = [decode_event(record) for record in records]
        end = from_seq + len(events)
        return events, (end if end < run.next_seq else None)

    # -- the per-turn window ------------------------------------------------------------------

    def assemble(self, tenant: str, run_id: str, iteration: int, new_events: Sequence[NewEvent] = (),
                 max_transcript_tokens: int | None = None, render: str = "",
                 deadline: Deadline = NO_DEADLINE) -> tuple[AssembledContext, list[AppendResult]]:
        """Append this turn's events, choose and persist the window for ``iteration`` and decide
        compaction: one transaction (none once ``deadline`` passed). ``render``: also the provider
        request body."""
        key = run_key(tenant, run_id)
        check_at_least("iteration", iteration, 1)
        if max_transcript_tokens is not None:
            check_at_least("max_transcript_tokens", max_transcript_tokens, 1)
        context_window.check_render(render)
        check_request_size("append_events", [e.content for e in new_events], self._deps.defaults)
        events = self._sanitised(tenant, run_id,
                                 prepare_events(new_events, "append_events", self._deps.defaults, turn=iteration),
                                 "append_events")

        if not events:
            # Re-assembling an iteration whose window is persisted and unchanged writes nothing.
            with self._store.read() as txn:
                run = require_run(txn, self._db, key, run_id)
                layout = self.contexts.layout(txn, key, run, run_id)
                stored = txn.get(key + be32(iteration), db=self._db["windows"])
                record = load_json(stored) if stored is not None else None
                tighter = _tighter(max_transcript_tokens, layout)
                # An iteration before the last one assembled was fed as persisted, whatever came
                # later: clearings and kept clips rewrite counts, so planning it again could differ.
                settled = record is not None and iteration < run.last_assembled and \
                    record["budget"] == effective_budget(self._deps, run, tighter)
                if settled or (record is not None and _unchanged(plan(self._deps, txn, key, run, iteration, tighter)[0],
                                                                 record, run)):
                    window = from_record(self._deps, txn, key, run_id, iteration, record)
                    history = self._history.items(window, (key, run.incarnation))
                    cache = self._cache_of(txn, key, iteration, render, layout, window, history)
                    return self._answer(layout, window, render, history, cache), []
        deadline.check("while the events were redacted")
        append = self._appender(key, events, "append_events", deadline)

        def write(txn: lmdb.Transaction) -> tuple[Layout, TranscriptWindow, list[AppendResult], tuple[HistoryItem, ...],
                                                  dict]:
            run = load_run(txn, self._db, key)
            if run is None:
                if not events:
                    raise NotFound(f"run {run_id!r} not found")
                run = self._new_run()
            writer = LogWriter(txn, self._db, key, run)
            appended = append(writer) if events else []
            deadline.check("while the events were appended")  # before the window, the costly stage
            replayed = forks.at_assembly(self._deps, writer, iteration) if run.replay_pending else False
            writer.flush()
            layout = self.contexts.layout(txn, key, run, run_id)
            limit = _tighter(max_transcript_tokens, layout)
            # Tool results cleared (and earlier clips kept) before the window is chosen, so the
            # choice weighs what is fed; a replay fork then reaches the source's summaries after them.
            refed = clearing.before_plan(self._deps, self._clearing, writer, iteration,
                                         effective_budget(self._deps, run, limit))
            if refed:
                if run.replay_pending:
                    replayed = forks.at_assembly(self._deps, writer, iteration) or replayed
                writer.flush()
            chosen, top = plan(self._deps, txn, key, run, iteration, limit)
            stored = txn.get(key + be32(iteration), db=self._db["windows"])
            if stored is not None and not refed and _unchanged(chosen, record := load_json(stored), run):
                window = from_record(self._deps, txn, key, run_id, iteration, record)
                history = self._history.items(window, (key, run.incarnation))
                return (layout, window, appended, history,
                        self._cache_of(txn, key, iteration, render, layout, window, history))
            due = None
            if run.settings.summarization:
                due, choice = self._compaction(txn, key, run, iteration, chosen, top, layout)
                text, by = self._own_summary(txn, key, run, iteration, replayed, due, choice, chosen)
                if text:
                    try:
                        record_summary(self._deps, writer, SummaryRequest(iteration, due.candidate_ids, text, ""), by)
                    except SidecarError as error:
                        if by != "plugin":
                            raise
                        raise PluginFailed(f"plugin {self.contexts.policy.name!r}: compaction.summarise gave a "
                                           f"summary RecordSummary refuses: {error.message}") from None
                    writer.flush()
                    chosen, top = plan(self._deps, txn, key, run, iteration, limit)
                    due, _ = self._compaction(txn, key, run, iteration, chosen, top, layout, summarise=False)
            changed = context_window.prefix_changed(layout, run.fed_prefix)
            fed_before = run.fed_prefix
            run.fed_prefix = dict(layout.parts)
            record = persist(self._deps, txn, key, run, iteration, chosen, top, due, {
                "digests": [run.profile_digest, run.task_digest], "prefix": layout.prefix_sha256,
                "changed": list(changed), "fixed_tokens": layout.fixed_tokens, "limit": layout.turn_limit,
                "task_id": layout.task_id})
            if run.fed_prefix != fed_before:
                save_run(txn, self._db, key, run)
            window = from_record(self._deps, txn, key, run_id, iteration, record)
            history = self._history.items(window, (key, run.incarnation))
            # What the next turn compares with is persisted with the window (window.context is
            # record["context"]): each part's key and tokens, not its text.
            cache = record["context"]["cache"] = self._cache_state(txn, key, iteration, render, layout, window,
                                                                   history)
            txn.put(key + be32(iteration), dump_json(record), db=self._db["windows"])
            return layout, window, appended, history, cache

        # The answer is built after the commit: a rendering needs no lock (``history``, the
        # window's entries as items, is the one the cache state was computed from).
        layout, window, appended, history, cache = self._store.write(write)
        return self._answer(layout, window, render, history, cache), appended

    def _answer(self, layout: Layout, window: TranscriptWindow, render: str, history: tuple[HistoryItem, ...],
                cache: dict) -> AssembledContext:
        rendered = context_window.render(render, layout, history, cache,
                                         self._render.openai_prompt_cache_retention) if render else ""
        return _assembled(layout, window, render, rendered, cache)

    def _cache_state(self, txn: lmdb.Transaction, key: bytes, iteration: int, render: str, layout: Layout,
                     window: TranscriptWindow, history: tuple[HistoryItem, ...]) -> dict:
        """The request's cache state in the form ``render``, against the previous assembly's
        (the window persisted for the newest earlier iteration; none: a first turn)."""
        previous = previous_window_record(txn, self._db, key, iteration)
        previous_cache = (previous.get("context") or {}).get("cache") if previous else None
        return context_window.cache_state(render, layout, window, history,
                                          tuple((window.context or {}).get("changed", ())), previous_cache)

    def _cache_of(self, txn: lmdb.Transaction, key: bytes, iteration: int, render: str, layout: Layout,
                  window: TranscriptWindow, history: tuple[HistoryItem, ...]) -> dict:
        """A persisted window's cache state: as persisted when of the form ``render``, else
        computed for that form (and not persisted: the window's first form stays the record's)."""
        stored = (window.context or {}).get("cache")
        if stored is not None and stored["form"] == render:
            return stored
        return self._cache_state(txn, key, iteration, render, layout, window, history)

    def _compaction(self, txn: lmdb.Transaction, key: bytes, run: Run, iteration: int, chosen: Plan,
                    top: Summary | None, layout: Layout,
                    summarise: bool = True) -> tuple[Compaction, SummariseResult | None]:
        """The policy's decision: whether compaction is due (trigger), and what to summarise."""
        policy = self.contexts.policy
        found = candidates(self._deps, txn, key, run, iteration, chosen.budget, top, chosen.end)
        if "history" in layout.kept:  # the policy keeps the history whole: nothing to summarise
            return Compaction(False), None
        fraction = self._deps.defaults.compaction_fraction
        due = policy.trigger(TriggerInput(
            iteration, layout.task_id, chosen.tokens + layout.fixed_tokens, layout.turn_limit, found.unsummarised,
            chosen.budget, fraction, found.since_summary if top else None))
        if not due:
            return Compaction(False), None
        if not found.ids or found.protected > fraction * chosen.budget:
            # Asking every turn could not help (nothing may be summarised, or what may not alone passes
            # the trigger, so no summary brings the transcript under it): say why once (until another
            # summary is recorded).
            under = top.index if top else -1
            previous = previous_window_record(txn, self._db, key, iteration)
            said = previous is not None and previous.get("compaction", [None] * 5)[4:5] == [under]
            return Compaction(False, reason="" if said else _nothing_to_summarise(found, run, chosen.budget, fraction),
                              said_under=under), None
        if not summarise:
            return Compaction(True, found.ids, found.tokens_before), None
        choice = policy.summarise(SummariseInput(
            iteration, layout.task_id, run.settings.summarization_strategy, top.ref if top else "", found.ids,
            chosen.budget, lambda: self._summarisable(txn, key, found)))
        if choice.replace_ids == found.ids:
            return Compaction(True, found.ids, found.tokens_before), choice
        return Compaction(True, choice.replace_ids, tokens_of(self._deps, txn, key, top, choice.replace_ids)), choice

    def _summarisable(self, txn: lmdb.Transaction, key: bytes, found: Candidates) -> tuple[HistoryEvent, ...]:
        events = (decode_event(record) for record in read_records(txn, self._db, key, found.floor, found.protect))
        return tuple(HistoryEvent(e.event_id, e.role, e.type, e.iteration, e.call_id, e.content, e.tokens)
                     for e in events if not e.event_id.startswith(SIDECAR_ID_PREFIX))

    def _own_summary(self, txn: lmdb.Transaction, key: bytes, run: Run, iteration: int, replayed: bool,
                     due: Compaction, choice: SummariseResult | None, chosen: Plan) -> tuple[str | None, str]:
        """The summary the sidecar records itself, and who made it: the plugin's, or the built-in
        summariser's when configured. Only at an iteration's first assembly, on a run that counts
        its own tokens and is not replaying a source's summaries; otherwise the host summarises."""
        if not (due.due and due.candidate_ids and run.settings.token_counter != "host-defined"
                and iteration > run.last_assembled and not run.replay_pending and not replayed):
            return None, ""
        if choice is not None and choice.text is not None:
            return choice.text, "plugin"
        if self._deps.defaults.summariser == "extractive":
            return extractive_summary(self._deps, txn, key, run, due.candidate_ids, due.tokens_before,
                                      chosen.budget), "built-in"
        return None, ""

    def transcript_window(self, tenant: str, run_id: str, iteration: int) -> TranscriptWindow:
        """What AssembleContext fed for ``iteration`` (RFC 0111's transcript-window seam)."""
        key = run_key(tenant, run_id)
        check_at_least("iteration", iteration, 1)
        with self._store.read() as txn:
            require_run(txn, self._db, key, run_id)
            stored = txn.get(key + be32(iteration), db=self._db["windows"])
            if stored is None:
                raise NotFound(f"iteration {iteration} of run {run_id!r} was never assembled")
            return from_record(self._deps, txn, key, run_id, iteration, load_json(stored), with_ranges=True)

    # -- summaries ----------------------------------------------------------------------------

    def record_summary(self, tenant: str, run_id: str,
                       request: SummaryRequest) -> tuple[Summary, StoredEvent, bool]:
        """Record the host's summary of the oldest unsummarised turns; see ``summaries``.
        Returns (summary, its context.summarized entry, whether this call recorded it)."""
        key = run_key(tenant, run_id)
        request = replace(request, text=self._redactor.redact(tenant, run_id, request.text).text)

        def write(txn: lmdb.Transaction) -> tuple[Summary, StoredEvent, bool]:
            writer = LogWriter(txn, self._db, key, require_run(txn, self._db, key, run_id))
            replayed = forks.recorded_for(self._deps, writer, tuple(request.replaced_ids))
            if replayed is not None:
                writer.flush()
                return replayed[0], replayed[1], True
            result = record_summary(self._deps, writer, request)
            writer.flush()
            return result

        return self._store.write(write)

    def get_artifact(self, tenant: str, run_id: str, artifact_id: str) -> StoredEvent:
        """A summary artifact: the summary entry, its text in ``content``."""
        key = run_key(tenant, run_id)
        check_id("artifact_id", artifact_id)
        with self._store.read() as txn:
            require_run(txn, self._db, key, run_id)
            if txn.get(key + artifact_id.encode("utf-8"), db=self._db["artifacts"]) is None:
                raise NotFound(f"artifact {artifact_id!r} of run {run_id!r} not found")
            return decode_event(read_artifact(txn, self._db, key, artifact_id))

    def delete_artifact(self, tenant: str, run_id: str, artifact_id: str) -> None:
        key = run_key(tenant, run_id)
        check_id("artifact_id", artifact_id)
        self._store.write(lambda txn: forks.delete_artifact(txn, self._db, key, run_id, artifact_id), frees_space=True)

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
            newest_first, _ = page_within_bytes(txn.get(key + be32(seq), db=self._db["events"])
                                                for seq in reversed(seqs[-limit:]))
            history = [decode_event(raw) for raw in reversed(newest_first)]
            # The running summary is the whole stack in force: GetState answers it all.
            stack = newest_in_force(txn, self._db, key, newest, newest.depth) if newest else []
            summaries = [decode_event(raw) for raw in read_artifacts(txn, self._db, key, [s.ref for s in stack])]
            task = self.contexts.task_of(txn, key, run)
            return AgentStateView(history, len(seqs), summaries, task.task, task.skills,
                                  self.contexts.last_usage(txn, key), self.contexts.state_data(txn, key),
                                  self.contexts.profile(txn, key, run).profile)

    def compaction_records(self, tenant: str, run_id: str, from_index: int = 0,
                           limit: int = 0) -> tuple[list[dict], int | None]:
        """The run's compaction records from ``from_index``, and where the next page starts."""
        key = run_key(tenant, run_id)
        check_at_least("from_index", from_index, 0)
        limit = page_size("limit", limit)
        with self._store.read() as txn:
            run = require_run(txn, self._db, key, run_id)
            records = compaction_records(txn, self._db, key, from_index, limit)
        # Bounded by bytes too (as JSON, longer than the answer's protobuf): a record lists ids.
        records, _ = page_within_bytes(records, lambda record: len(json.dumps(record)))
        end = from_index + len(records)
        return records, (end if end < run.log_entries else None)

    # -- counting -----------------------------------------------------------------------------

    def count_tokens(self, counter_name: str, texts: Sequence[str],
                     deadline: Deadline = NO_DEADLINE) -> tuple[str, list[int]]:
        """The counter's name and each text's count (CountTokens), within the same caps as an
        append; stops between texts once ``deadline`` passed."""
        check_request_size("texts", texts, self._deps.defaults)
        counter = self._deps.counters.get(counter_name)
        counts = []
        for text in texts:
            deadline.check("while the texts were counted")
            counts.append(counter.count(text))
        return counter.name, counts


def _nothing_to_summarise(found: Candidates, run: Run, budget: int, fraction: float) -> str:
    trigger = int(fraction * budget)
    if found.protected > trigger:
        return (f"protected_turns_exceed_trigger: the active turn and the verbatim floor (keep_last_turns "
                f"{run.settings.keep_last_turns}, keep_last_tokens {run.settings.keep_last_tokens}) hold "
                f"{found.protected} tokens, over the compaction trigger of {trigger} ([context] compaction_fraction "
                f"{fraction} of the budget {budget}), so no summary of older turns brings the transcript under it. "
                f"The window still keeps within its budget; for summaries to help, give the run a larger budget or "
                f"keep fewer turns")
    return (f"nothing_summarisable: {found.unsummarised} unsummarised tokens pass the compaction trigger of "
            f"{trigger}, but every older event belongs to a tool call whose results lie in the protected turns")


def _tighter(max_transcript_tokens: int | None, layout: Layout) -> int:
    """The transcript budget's tightest cap: the call's, and what the turn limit leaves it."""
    return min(max_transcript_tokens or layout.transcript_room, layout.transcript_room)


def _unchanged(chosen: Plan, record: dict, run: Run) -> bool:
    """The persisted window is what this assembly would feed: the same transcript plan, over
    the same profile and task."""
    context = record.get("context")
    return chosen.same_as(record) and context is not None and \
        context["digests"] == [run.profile_digest, run.task_digest]


def _assembled(layout: Layout, window: TranscriptWindow, render: str, rendered: str, cache: dict) -> AssembledContext:
    context = window.context or {}
    return AssembledContext(
        window, tuple(context_window.sections(layout, window, with_text=not render)), context.get("prefix", ""),
        tuple(context.get("changed", ())), window.window_tokens, layout.profile.tools_tokens,
        context.get("limit", layout.turn_limit), context.get("task_id", layout.task_id),
        rendered, context_window.cache_report(cache))
