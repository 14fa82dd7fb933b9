"""The turn: one AssembleContext, from the turn's events to what the model is fed.

A turn appends its events, keeps earlier clips and clears tool results (``clearing``), chooses
and persists its window (``window``), decides compaction and may record the sidecar's own
summary (``summaries``), and answers with the window, the sections around it, the request's
cache report and, when asked for, the provider's request body. All of its writing happens in one
transaction; the answer is built after the commit (a rendering needs no lock).

Assembling again an iteration whose window is persisted writes nothing when it would feed the
same: :meth:`Turn.as_persisted` answers from the record, read only, and the write path answers
from it too when the log changed nothing the window is made of.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sidecar.context_window import sections
from sidecar.context_window.policy import HistoryEvent, SummariseInput, SummariseResult, TriggerInput
from sidecar.context_window.profiles import HISTORY
from sidecar.context_window.rendering import STATIC, BodyMap, History, HistoryItem, task_part_names, uncounted
from sidecar.context_window.sections import CacheReport, FedTranscript, HistoryCache, Layout, Section
from sidecar.errors import Deadline, NotFound, PluginFailed, SidecarError
from sidecar.settings import ClearingSettings, RenderSettings
from sidecar.storage.codec import decode_event
from sidecar.storage.environment import Store
from sidecar.storage.keys import Txn
from sidecar.telemetry import metrics, tracing
from sidecar.transcript import clearing, forks
from sidecar.transcript.log import AppendResult, LogWriter, NewEvent
from sidecar.transcript.reassembly import Kept, Reassemblies
from sidecar.transcript.run_context import RunContexts
from sidecar.transcript.runs import (
    SIDECAR_ID_PREFIX,
    Deps,
    Run,
    default_settings,
    load_run,
    require_run_record,
    save_run,
)
from sidecar.transcript.schema import (
    Compaction,
    WindowRecord,
    previous_iteration,
    previous_window,
    previous_window_bytes,
    put_window,
    read_records,
    window_at,
    window_bytes,
)
from sidecar.transcript.summaries import (
    Candidates,
    Summary,
    SummaryRequest,
    candidates,
    extractive_summary,
    load_summary,
    record_summary,
    tokens_of,
)
from sidecar.transcript.window import (
    Plan,
    ReadBack,
    TranscriptWindow,
    effective_budget,
    fed_next,
    from_record,
    plan,
    summary_room,
    window_record,
)

R = TypeVar("R")  # what the caller makes of a turn's answer


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
    # The answer's wire encoding, once made: a kept answer (``reassembly``) is then sent again as
    # the same bytes, not encoded again. A one-slot box that the wire fills; never compared.
    encoded: list[bytes] = field(default_factory=list, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class RequestPart:
    """A part of a recorded request (the unit its cache report compares), as a reader sees it."""

    key: str  # as the request's cache state holds it: equal keys, identical bytes
    tokens: int  # its texts' (0 when not known)
    section: str  # "static prefix", or the per-task section's name; "" for a part of the history
    items: tuple[HistoryItem, ...]  # a history part's entries (a call's results: all of them)
    text: str  # a section part's text ("" for a part of the history)
    known: bool  # rebuilt now, it is the part that was sent (its key is the one recorded)


@dataclass(frozen=True, slots=True)
class Recorded:
    """A turn's request as its persisted window fed it (:meth:`Turn.as_recorded`)."""

    answer: AssembledContext  # rendered "" when the body cannot be the one sent (``as_fed`` False)
    recorded_form: str | None  # the render form its cache state was persisted in (None: before it was)
    as_fed: bool  # the run's profile and task are those the window was fed with
    parts: tuple[RequestPart, ...]  # in the answer's render form, by the answer's cache state
    history_from: int  # the first history part's index
    body: BodyMap | None  # where the parts and breakpoints are in ``answer.rendered`` (None: no body)
    summaries: tuple[Summary, ...]  # those in the window, oldest first
    previous_iteration: int  # the window the cache report compares with (0: none)
    # AssembleContext for the iteration without events (and without max_transcript_tokens) would
    # now feed this window again; False: it would choose another (the log or the run moved on).
    fed_again: bool


@dataclass(frozen=True, slots=True)
class TurnServices:
    """What every turn uses: the store, the domain's shared parts, the run contexts, and the
    history cache kept across turns."""

    store: Store
    deps: Deps
    contexts: RunContexts
    clearing: ClearingSettings
    render: RenderSettings
    history: HistoryCache
    reads: ReadBack  # the entries each run's window was last read back with
    reassemblies: Reassemblies[AssembledContext] | None  # None: [context] reassembly_cache = 0
    clock: Callable[[], float]  # seconds since the epoch (time.time; a test's own)


@dataclass(frozen=True, slots=True)
class Fed:
    """A window as fed, and all its answer is built from."""

    layout: Layout
    window: TranscriptWindow
    transcript: FedTranscript  # the window, as the sections read it
    history: History  # the window's entries as items (the cache state was computed from them)
    cache: dict  # the request's cache state, in the form asked for


class Turn:
    """One AssembleContext of ``iteration`` in the run under ``key``: the request is validated
    and its events sanitised already (``Transcripts.assemble``)."""

    def __init__(self, services: TurnServices, key: bytes, run_id: str, iteration: int,
                 max_transcript_tokens: int | None, render: str) -> None:
        self._services, self._deps, self._db = services, services.deps, services.deps.db
        self.key, self.run_id, self.iteration = key, run_id, iteration
        self.max_transcript_tokens, self.render = max_transcript_tokens, render

    def as_persisted(self) -> AssembledContext | None:
        """The answer from the window persisted for the iteration, read only, when assembling it
        again would feed the same; None when it must be chosen (again). The answer is kept, and
        given again while it stays valid (``reassembly``)."""
        kept_answers = self._services.reassemblies
        with self._services.store.read() as txn:
            run, run_stored = require_run_record(txn, self._db, self.key, self.run_id)
            layout = self._services.contexts.layout(txn, self.key, run, self.run_id)
            stored = window_bytes(txn, self._db, self.key, self.iteration)
            if stored is None:
                return None
            tighter = _tighter(self.max_transcript_tokens, layout)
            budget = effective_budget(self._deps, run, tighter)
            # An iteration before the last one assembled was fed as persisted, whatever came
            # later: clearings and kept clips rewrite counts, so planning it again could differ.
            # The newest is planned again unless nothing its plan reads changed: the run's record
            # (the log's end, its summaries, its settings) and the window before it.
            settled = self.iteration < run.last_assembled
            before = None if settled else previous_window_bytes(txn, self._db, self.key, self.iteration)
            memo_key = (self.key, self.iteration, self.max_transcript_tokens, self.render)
            # With a shared store, the run's version: another sidecar's writes (a summary's artifact
            # deleted) reach this one as a load, not through this process's calls.
            version = self._services.store.version_held(txn, "runs", self.key)
            kept = kept_answers.get(memo_key, stored, run.incarnation, layout) if kept_answers else None
            if kept is not None and kept.budget == budget and kept.version == version and \
                    (settled or (kept.run == run_stored and kept.before == before)):
                return self._given(kept.answer)
            if settled:  # not needed to check a kept answer, but the answer's cache state reads it
                before = previous_window_bytes(txn, self._db, self.key, self.iteration)
            previous = None if before is None else WindowRecord.parse(before)
            record = WindowRecord.parse(stored)
            if not self._feeds_again(txn, run, record, previous, settled, budget, tighter):
                return None
            answer = self._answer(self._as_fed(txn, run, layout, record, previous))
        cache = record.cache
        if kept_answers is not None and cache is not None and cache["form"] == self.render and \
                record.budget == budget:
            kept_answers.keep(memo_key, Kept(stored, run.incarnation, layout, record.budget, answer,
                                             len(stored) + 2 * sum(map(len, answer.window.records))
                                             + len(answer.rendered), None if settled else run_stored,
                                             None if settled else before, version))
        return answer

    def _feeds_again(self, txn: Txn, run: Run, record: WindowRecord, previous: WindowRecord | None, settled: bool,
                     budget: int, tighter: int) -> bool:
        """Whether assembling the iteration again, under ``budget`` (``tighter``: its cap), feeds its
        persisted ``record``: a ``settled`` one does while its budget holds; else it is planned again."""
        if settled and record.budget == budget:
            return True
        return _unchanged(plan(self._deps, txn, self.key, run, self.iteration, tighter, _fed_cold(record), previous)[0],
                          record, run)

    def assemble(self, events: Sequence[NewEvent], append: Callable[[LogWriter], list[AppendResult]],
                 deadline: Deadline, respond: Callable[[AssembledContext, list[AppendResult]], R]) -> R:
        """Append ``events`` (with ``append``, which counted them), choose and persist the window
        and decide compaction: one transaction (none once ``deadline`` passed). The answer, and
        what ``respond`` makes of it, are built while the commit syncs: from the values the
        transaction chose, never from the store."""
        def answer(written: tuple[Fed, list[AppendResult]]) -> R:
            fed, appended = written
            return respond(self._answer(fed), appended)

        return self._services.store.write(lambda txn: self._write(txn, events, append, deadline), then=answer)

    # -- in the turn's transaction ---------------------------------------------------------------

    def _write(self, txn: Txn, events: Sequence[NewEvent], append: Callable[[LogWriter], list[AppendResult]],
               deadline: Deadline) -> tuple[Fed, list[AppendResult]]:
        run = load_run(txn, self._db, self.key)
        if run is None:
            if not events:
                raise NotFound(f"run {self.run_id!r} not found")
            run = Run(default_settings(self._deps.defaults))
        writer = LogWriter(txn, self._db, self.key, run)
        appended = append(writer) if events else []
        deadline.check("while the events were appended")  # before the window, the costly stage
        replayed = forks.at_assembly(self._deps, writer, self.iteration) if run.replay_pending else False
        writer.flush()
        layout = self._services.contexts.layout(txn, self.key, run, self.run_id)
        limit = _tighter(self.max_transcript_tokens, layout)
        # The windows the turn reads, each read once and given to every stage that reads it:
        # the iteration's own (assembled before) and the one before it (the cache report's base).
        record = window_at(txn, self._db, self.key, self.iteration)
        previous = previous_window(txn, self._db, self.key, self.iteration)
        cold = self._cold(run, record)
        # The clearing keeps the clips of the run's last window fed, and clears from its start.
        last_fed = record if self.iteration == run.last_assembled else \
            previous if self.iteration > run.last_assembled else None
        refed, replayed = self._refeed(writer, limit, _tighter(None, layout), replayed, cold, last_fed)
        chosen, top = plan(self._deps, txn, self.key, run, self.iteration, limit, cold, previous)
        if record is not None and not refed and _unchanged(chosen, record, run):
            return self._as_fed(txn, run, layout, record, previous), appended
        due = None
        if run.settings.summarization:
            chosen, top, due = self._decide_compaction(writer, layout, chosen, top, limit, replayed, cold, previous)
        return self._persist(txn, run, layout, chosen, top, due, cold, previous), appended

    def _cold(self, run: Run, record: WindowRecord | None) -> bool:
        """Whether the provider's cache is cold for this turn's request: more than the form's
        ``[render]`` TTL passed since the run's previous turn, so the request re-bills its whole
        prefix whatever it holds, and every big step the budget would soon force is taken now.
        Decided once, at the iteration's first assembly, and kept with its window; a replay fork
        takes its source's decision at each iteration its source assembled (its own clock would
        feed other windows). The plain form names no provider: never. ``record``: the iteration's
        window, when it was assembled before."""
        if self.iteration <= run.last_assembled:
            return _fed_cold(record)
        if self.iteration <= run.source_assembled:
            return self.iteration in run.source_cold
        render = self._services.render
        ttl = {"anthropic_messages": render.anthropic_cache_ttl_seconds,
               "openai_responses": render.openai_cache_ttl_seconds}.get(self.render, 0)
        return bool(ttl and run.last_turn_ms) and self._now_ms() - run.last_turn_ms > ttl * 1000

    def _now_ms(self) -> int:
        return int(self._services.clock() * 1000)

    def _refeed(self, writer: LogWriter, limit: int, room: int, replayed: bool, cold: bool,
                last_fed: WindowRecord | None) -> tuple[bool, bool]:
        """Tool results cleared (and earlier clips kept) before the window is chosen, so the
        choice weighs what is fed; a replay fork then reaches the source's summaries after them.
        ``limit``: the call's transcript budget; ``room``: the run's, without the call's own cap;
        ``last_fed``: the window of the run's last assembly, when it is this iteration's or the
        one before. Whether the log changed, and whether a source's summary was recorded again."""
        run = writer.run
        # A replay fork clears where its source did, whatever this sidecar's settings say: a
        # clearing decided anew would part its log from the source's, and the source's summaries
        # after it could not be reused.
        log_end = run.next_seq
        refed = clearing.before_plan(self._deps, self._services.clearing, writer, self.iteration,
                                     effective_budget(self._deps, run, limit), effective_budget(self._deps, run, room),
                                     decide=forks.decides_clearings(writer), cold=cold, last_fed=last_fed)
        if run.replay_pending:
            forks.after_own_entries(writer, log_end)
            log_end = run.next_seq
            replayed = forks.at_assembly(self._deps, writer, self.iteration, clear=True) or replayed
            refed = refed or run.next_seq != log_end
        if refed:
            writer.flush()
        return refed, replayed

    def _decide_compaction(self, writer: LogWriter, layout: Layout, chosen: Plan, top: Summary | None, limit: int,
                           replayed: bool, cold: bool, previous: WindowRecord | None) -> \
            tuple[Plan, Summary | None, Compaction]:
        """The compaction signal; when the sidecar summarises itself, its summary recorded and the
        window chosen again over it (the plan, the summary in force and the signal then)."""
        txn, run = writer.txn, writer.run
        due, choice = self._compaction(txn, run, chosen, top, layout, previous, cold=cold)
        text, by = self._own_summary(txn, run, replayed, due, choice, chosen)
        if not text:
            return chosen, top, due
        try:
            record_summary(self._deps, writer, SummaryRequest(self.iteration, due.candidate_ids, text, ""), by)
        except SidecarError as error:
            if by != "plugin":
                raise
            raise PluginFailed(f"plugin {self._services.contexts.policy.name!r}: compaction.summarise gave a "
                               f"summary RecordSummary refuses: {error.message}") from None
        writer.flush()
        chosen, top = plan(self._deps, txn, self.key, run, self.iteration, limit, cold, previous)
        due, _ = self._compaction(txn, run, chosen, top, layout, previous, summarise=False)
        return chosen, top, due

    def _persist(self, txn: Txn, run: Run, layout: Layout, chosen: Plan, top: Summary | None,
                 due: Compaction | None, cold: bool, previous: WindowRecord | None) -> Fed:
        """Persist the window chosen, with the sections' accounting and the request's cache state."""
        changed = sections.prefix_changed(layout, run.fed_prefix)
        fed_before = run.fed_prefix
        run.fed_prefix = dict(layout.parts)
        context = {"digests": [run.profile_digest, run.task_digest], "prefix": layout.prefix_sha256,
                   "changed": list(changed), "fixed_tokens": layout.fixed_tokens,
                   "static_tokens": layout.static_tokens, "limit": layout.turn_limit, "task_id": layout.task_id}
        if cold:
            context["cold"] = True  # the decision, kept: re-assembled and forked, the window is the same
        record = window_record(self._deps, txn, self.key, run, chosen, top, due, context)
        window = from_record(self._deps, txn, self.key, self.run_id, self.iteration, record,
                             reads=(self._services.reads, run.incarnation))
        transcript = _fed_transcript(window)
        history = self._history(transcript, run)
        # What the next turn compares with is persisted with the window, in its context (the
        # record's and the window's): each part's key, not its text. The record is
        # written once, with it; and the run record once, if either of its fields moved.
        cache = context["cache"] = self._cache_state(layout, window, transcript, history, previous)
        put_window(txn, self._db, self.key, self.iteration, record)
        newest = self.iteration > run.last_assembled
        if newest:
            run.last_assembled = self.iteration
            run.last_turn_ms = self._now_ms()
        if newest or run.fed_prefix != fed_before:
            save_run(txn, self._db, self.key, run)
        return Fed(layout, window, transcript, history, cache)

    def _as_fed(self, txn: Txn, run: Run, layout: Layout, record: WindowRecord, previous: WindowRecord | None) -> Fed:
        """The window persisted for the iteration, fed again as it was (``previous``: the window
        persisted before it)."""
        window = from_record(self._deps, txn, self.key, self.run_id, self.iteration, record,
                             reads=(self._services.reads, run.incarnation))
        transcript = _fed_transcript(window)
        history = self._history(transcript, run)
        return Fed(layout, window, transcript, history,
                   self._cache_of(layout, window, transcript, history, previous))

    def _history(self, transcript: FedTranscript, run: Run) -> History:
        """The window's entries as the renderings take them (kept across turns by the services)."""
        return History(self._services.history.items(transcript, (self.key, run.incarnation), clearing.will_be_cleared(
            self._services.clearing, run.settings.token_counter, self._deps.counters)))

    # -- the cache report ---------------------------------------------------------------------

    def _cache_state(self, layout: Layout, window: TranscriptWindow, transcript: FedTranscript, history: History,
                     previous: WindowRecord | None) -> dict:
        """The request's cache state in the form ``render``, against the previous assembly's
        (``previous``: the window persisted for the newest earlier iteration; none: a first turn)."""
        context = window.context or {}
        return sections.cache_state(self.render, layout, transcript, history, tuple(context.get("changed", ())),
                                    previous.cache if previous else None, self._count(window),
                                    bool(context.get("cold")))

    def _cache_of(self, layout: Layout, window: TranscriptWindow, transcript: FedTranscript, history: History,
                  previous: WindowRecord | None) -> dict:
        """A persisted window's cache state: as persisted when of the form ``render``, else
        computed for that form (and not persisted: the window's first form stays the record's)."""
        stored = (window.context or {}).get("cache")
        if stored is not None and stored["form"] == self.render:
            return stored
        return self._cache_state(layout, window, transcript, history, previous)

    # -- compaction ---------------------------------------------------------------------------

    def _compaction(self, txn: Txn, run: Run, chosen: Plan, top: Summary | None, layout: Layout,
                    previous: WindowRecord | None, summarise: bool = True,
                    cold: bool = False) -> tuple[Compaction, SummariseResult | None]:
        """The policy's decision: whether compaction is due (trigger), and what to summarise.
        ``cold``: the provider's cache is; a summary the sidecar records itself at this assembly
        is fed in this request, so its trigger is then the run's trim_to_fraction if lower (a
        host's summary comes in the next request, whose cache is warm again: no earlier ask)."""
        policy = self._services.contexts.policy
        found = candidates(self._deps, txn, self.key, run, self.iteration, chosen.budget, top, chosen.end)
        if HISTORY in layout.kept:  # the policy keeps the history whole: nothing to summarise
            return Compaction(False), None
        fraction = self._deps.defaults.compaction_fraction
        if cold and self._deps.defaults.summariser == "extractive" and not run.replay_pending:
            fraction = min(fraction, run.settings.trim_to_fraction)
        due = policy.trigger(TriggerInput(
            self.iteration, layout.task_id, chosen.tokens + layout.fixed_tokens, layout.turn_limit,
            found.unsummarised, chosen.budget, fraction, found.since_summary if top else None))
        if not due:
            return Compaction(False), None
        if not found.ids or found.protected > fraction * chosen.budget:
            # Asking every turn could not help (nothing may be summarised, or what may not alone passes
            # the trigger, so no summary brings the transcript under it): say why once (until another
            # summary is recorded).
            return _said_once(previous, top, lambda: _nothing_to_summarise(found, run, chosen.budget, fraction)), None
        if not fed_next(self._deps, txn, self.key, run, self.iteration, chosen, top, found):
            # A summary the next window would not feed is a model call paid for nothing.
            return _said_once(previous, top, lambda: _not_fed(found, run, chosen)), None
        if not summarise:
            return Compaction(True, found.ids, found.tokens_before), None
        choice = policy.summarise(SummariseInput(
            self.iteration, layout.task_id, run.settings.summarization_strategy, top.ref if top else "", found.ids,
            chosen.budget, lambda: self._summarisable(txn, found)))
        if choice.replace_ids == found.ids:
            return Compaction(True, found.ids, found.tokens_before), choice
        return Compaction(True, choice.replace_ids, tokens_of(self._deps, txn, self.key, top, choice.replace_ids)), \
            choice

    def _summarisable(self, txn: Txn, found: Candidates) -> tuple[HistoryEvent, ...]:
        events = (decode_event(record) for record in read_records(txn, self._db, self.key, found.floor, found.protect))
        return tuple(HistoryEvent(e.event_id, e.role, e.type, e.iteration, e.call_id, e.content, e.tokens)
                     for e in events if not e.event_id.startswith(SIDECAR_ID_PREFIX))

    def _own_summary(self, txn: Txn, run: Run, replayed: bool, due: Compaction, choice: SummariseResult | None,
                     chosen: Plan) -> tuple[str | None, str]:
        """The summary the sidecar records itself, and who made it: the plugin's, or the built-in
        summariser's when configured. Only at an iteration's first assembly, on a run that counts
        its own tokens and is not replaying a source's summaries; otherwise the host summarises."""
        if not (due.due and due.candidate_ids and run.settings.token_counter != "host-defined"
                and self.iteration > run.last_assembled and not run.replay_pending and not replayed):
            return None, ""
        if choice is not None and choice.text is not None:
            return choice.text, "plugin"
        if self._deps.defaults.summariser == "extractive":
            return extractive_summary(self._deps, txn, self.key, run, due.candidate_ids, due.tokens_before,
                                      chosen.budget), "built-in"
        return None, ""

    # -- the answer ---------------------------------------------------------------------------

    def _answer(self, fed: Fed) -> AssembledContext:
        return self._given(_assembled(fed, self.render, self._rendered(fed)))

    def _rendered(self, fed: Fed) -> str:
        if not self.render:
            return ""
        with tracing.phase("render"):
            return sections.render(self.render, fed.layout, fed.history, fed.cache,
                                   self._services.render.openai_prompt_cache_retention)

    # -- read back, for a reader ----------------------------------------------------------------

    def as_recorded(self) -> Recorded:
        """The iteration's request as its persisted window fed it, read only: never planned again,
        nothing written, no turn counted (``as_persisted`` plans the newest iteration again, and
        then may leave it to a write). The answer is the one ``as_persisted`` builds from the
        record; its body only when the run's profile and task are those the window was fed with
        (the record keeps their digests): the sections are the run's current ones, so under
        another layout the body would be one that was never sent."""
        with self._services.store.read() as txn:
            run, _ = require_run_record(txn, self._db, self.key, self.run_id)
            record = window_at(txn, self._db, self.key, self.iteration)
            if record is None:
                raise NotFound(f"iteration {self.iteration} of run {self.run_id!r} was never assembled")
            layout = self._services.contexts.layout(txn, self.key, run, self.run_id)
            previous = previous_window(txn, self._db, self.key, self.iteration)
            fed = self._as_fed(txn, run, layout, record, previous)
            tighter = _tighter(None, layout)
            again = self._feeds_again(txn, run, record, previous, self.iteration < run.last_assembled,
                                      effective_budget(self._deps, run, tighter), tighter)
            summaries = tuple(load_summary(txn, self._db, self.key, index) for index, _ in record.summaries)
            before = previous_iteration(txn, self._db, self.key, self.iteration)
        as_fed = _fed_with(record, run)
        rendered = self._rendered(fed) if as_fed else ""
        answer = _assembled(fed, self.render, rendered)
        holding: list[tuple[HistoryItem, ...]] = []
        rebuilt, start, _ = sections.request_parts(self.render, layout, fed.history, self._count(fed.window), holding)
        texts = {s.name: s.text for s in layout.sections}
        tools = ", ".join(tool.name for tool in layout.profile.profile.tools)
        static = "\n\n".join([s.text for s in layout.sections if s.stability == STATIC]
                             + ([f"(tools: {tools})"] if tools else []))
        parts = []
        for index, key in enumerate(fed.cache["keys"]):
            rebuilt_key, tokens = rebuilt[index] if index < len(rebuilt) else ("", 0)
            known = rebuilt_key == key and (as_fed or index >= start)
            name = "static prefix" if index == 0 else next(iter(task_part_names([key])), "") if index < start else ""
            text = (static if index == 0 else texts.get(name, "")) if index < start else ""
            parts.append(RequestPart(key, tokens if known else 0, name, holding[index] if known else (),
                                     text if known else "", known))
        return Recorded(answer, record.cache["form"] if record.cache else None, as_fed, tuple(parts), start,
                        sections.body_parts(self.render, layout, rendered) if rendered else None, summaries, before,
                        again)

    def _count(self, window: TranscriptWindow) -> Callable[[str], int]:
        """The run's counter, for the texts a rendering adds (none for a host-defined one)."""
        counter = window.token_counter
        return self._deps.counters.get(counter).count if counter != "host-defined" else uncounted

    def _given(self, assembled: AssembledContext) -> AssembledContext:
        """``assembled``, counted as fed (built now, or kept from an earlier re-assembly)."""
        window = assembled.window
        tracing.set_attributes(iteration=self.iteration, tokens=window.token_count, entries=len(window.event_ids),
                               budget=window.token_budget)
        cache = assembled.cache
        metrics.turn_fed(window.token_count, window.token_budget, assembled.window_tokens, cache.stable_prefix_tokens,
                         cache.request_tokens or assembled.window_tokens, cache.break_reason)
        return assembled


def _said_once(previous: WindowRecord | None, top: Summary | None, reason: Callable[[], str]) -> Compaction:
    """Not due, and why, said on the first such turn under the summary in force only (not said
    at the ``previous`` window under the same summary)."""
    under = top.index if top else -1
    said = previous is not None and previous.compaction is not None and previous.compaction.said_under == under
    return Compaction(False, reason="" if said else reason(), said_under=under)


def _fed_transcript(window: TranscriptWindow) -> FedTranscript:
    """The window as the sections read it: plain values."""
    return FedTranscript(window.event_ids, window.records, window.clips, window.summaries_fed, window.token_count)


def _fed_cold(record: WindowRecord | None) -> bool:
    """Whether a persisted window was chosen with the provider's cache cold."""
    return bool(record is not None and record.context and record.context.get("cold"))


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


def _not_fed(found: Candidates, run: Run, chosen: Plan) -> str:
    settings = run.settings
    return (f"summary_would_not_be_fed: a summary of the events before the recent turns (the last keep_last_turns "
            f"{settings.keep_last_turns} turns and the whole turns within trim_to_fraction {settings.trim_to_fraction} "
            f"of the budget {chosen.budget}) would not be fed in the next window: the {found.left} tokens it leaves "
            f"verbatim and {summary_room(run, chosen.budget)} for the summary and the next turn pass the budget. The "
            f"window still keeps within its budget; for summaries to help, keep fewer turns or give the run a larger "
            f"budget")


def _tighter(max_transcript_tokens: int | None, layout: Layout) -> int:
    """The transcript budget's tightest cap: the call's, and what the turn limit leaves it."""
    return min(max_transcript_tokens or layout.transcript_room, layout.transcript_room)


def _unchanged(chosen: Plan, record: WindowRecord, run: Run) -> bool:
    """The persisted window is what this assembly would feed: the same transcript plan, over
    the same profile and task."""
    return chosen.same_as(record) and _fed_with(record, run)


def _fed_with(record: WindowRecord, run: Run) -> bool:
    """The window was fed with the run's profile and task as they are now."""
    return record.context is not None and record.context["digests"] == [run.profile_digest, run.task_digest]


def _assembled(fed: Fed, render: str, rendered: str) -> AssembledContext:
    layout, window, cache = fed.layout, fed.window, fed.cache
    context = window.context or {}
    return AssembledContext(
        window, tuple(sections.sections(layout, fed.transcript, fed.history.items, with_text=not render)),
        context.get("prefix", ""),
        tuple(context.get("changed", ())), window.window_tokens, layout.profile.tools_tokens,
        context.get("limit", layout.turn_limit), context.get("task_id", layout.task_id),
        rendered, sections.cache_report(cache))
