"""The transcript domain's API: runs, their event logs, the per-turn window, summaries, forks.

Each method validates what it can before taking the write lock (token counting is the costly
part and needs no lock), then does all of its writing in one LMDB transaction: a call's writes
land together or not at all. The work lives in one module per concern: ``runs``, ``eventlog``,
``window``, ``summaries`` and ``forks``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

import lmdb

from sidecar import forks
from sidecar.counting import Counters
from sidecar.errors import NotFound, ValidationError
from sidecar.eventlog import (AppendResult, LogWriter, NewEvent, append_host_events, count_events, prepare_events,
                              read_records)
from sidecar.records import StoredEvent, decode_event, load_json
from sidecar.redaction import Redactor
from sidecar.runs import (Deps, Run, RunSettings, check_given_settings, confirm_settings, default_settings, load_run,
                          require_run, run_key, save_run)
from sidecar.settings import ContextSettings
from sidecar.store import Store, be32
from sidecar.summaries import (Summary, SummaryRequest, compaction, extractive_summary, read_artifact,
                               record_summary)
from sidecar.validation import check_at_least, check_id
from sidecar.window import TranscriptWindow, from_record, persist, plan

DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000

__all__ = ["AppendResult", "NewEvent", "RunSettings", "Summary", "SummaryRequest", "TranscriptWindow", "Transcripts"]


class Transcripts:
    def __init__(self, store: Store, counters: Counters, defaults: ContextSettings,
                 redactor: Redactor | None = None) -> None:
        self._store = store
        self._deps = Deps(store.db, counters, defaults)
        self._db = store.db
        self._redactor = redactor or Redactor()

    def _redacted(self, tenant: str, run_id: str, events: list[NewEvent]) -> list[NewEvent]:
        """SR-1: every event's content is redacted before it is counted or stored."""
        return [replace(event, content=self._redactor.redact(tenant, run_id, event.content).text) for event in events]

    # -- runs ---------------------------------------------------------------------------------

    def open_run(self, tenant: str, run_id: str, **given: Any) -> tuple[RunSettings, bool]:
        """Create the run, or confirm an existing one whose settings match every field given
        (``token_counter``, ``transcript_token_budget``, ``keep_last_turns``, ``transcript_window``,
        ``summarization``, ``summarization_strategy``, ``keep_last_tokens``; None: not given)."""
        key = run_key(tenant, run_id)
        given = {name: value for name, value in given.items() if value is not None}
        requested = check_given_settings(self._deps.defaults, self._deps.counters, given)
        with self._store.read() as txn:
            existing = load_run(txn, self._db, key)
        if existing is not None:
            confirm_settings(existing, run_id, given)
            return existing.settings, False

        def create(txn: lmdb.Transaction) -> tuple[RunSettings, bool]:
            run = load_run(txn, self._db, key)
            if run is not None:  # created between our read and this write
                confirm_settings(run, run_id, given)
                return run.settings, False
            save_run(txn, self._db, key, Run(requested))
            return requested, True

        return self._store.write(create)

    def delete_run(self, tenant: str, run_id: str) -> None:
        key = run_key(tenant, run_id)
        self._store.write(lambda txn: forks.delete_run(txn, self._db, key, run_id))

    def fork_run(self, tenant: str, source_run_id: str, from_seq: int, mode: str,
                 new_run_id: str) -> tuple[Run, bool]:
        source_key = run_key(tenant, source_run_id, "source_run_id")
        fork_key = run_key(tenant, new_run_id, "new_run_id")
        if fork_key == source_key:
            raise ValidationError.field("new_run_id", "must differ from source_run_id")
        return self._store.write(lambda txn: forks.fork_run(
            self._deps, txn, source_key, source_run_id, fork_key, new_run_id, from_seq, mode))

    # -- events -------------------------------------------------------------------------------

    def append_events(self, tenant: str, run_id: str, events: Sequence[NewEvent]) -> list[AppendResult]:
        """Append ``events`` in one transaction: all of them or none."""
        key = run_key(tenant, run_id)
        if not events:
            raise ValidationError.field("events", "at least one event is required")
        prepared = self._redacted(tenant, run_id, prepare_events(events, "events", self._deps.defaults))
        append = self._appender(key, prepared, "events")

        def write(txn: lmdb.Transaction) -> list[AppendResult]:
            writer = LogWriter(txn, self._db, key, load_run(txn, self._db, key) or self._new_run())
            results = append(writer)
            writer.flush()
            return results

        return self._store.write(write)

    def _new_run(self) -> Run:
        return Run(default_settings(self._deps.defaults))

    def _appender(self, key: bytes, events: Sequence[NewEvent], field: str) -> Callable[[LogWriter], list[AppendResult]]:
        """Count tokens now, outside the write lock; return what appends them in the transaction."""
        with self._store.read() as txn:
            run = load_run(txn, self._db, key)
        counter = run.settings.token_counter if run else self._deps.defaults.token_counter
        counts = count_events(self._deps.counters, counter, events, field) if events else []

        def append(writer: LogWriter) -> list[AppendResult]:
            nonlocal counter, counts
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
        check_at_least("limit", limit, 0)
        limit = min(limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
        with self._store.read() as txn:
            run = require_run(txn, self._db, key, run_id)
            end = min(run.next_seq, from_seq + limit)
            events = [decode_event(record) for record in read_records(txn, self._db, key, from_seq, end)]
        return events, (end if end < run.next_seq else None)

    # -- the per-turn window ------------------------------------------------------------------

    def assemble(self, tenant: str, run_id: str, iteration: int, new_events: Sequence[NewEvent] = (),
                 max_transcript_tokens: int | None = None) -> tuple[TranscriptWindow, list[AppendResult]]:
        """Append this turn's events, choose and persist the window for ``iteration``: one transaction."""
        key = run_key(tenant, run_id)
        check_at_least("iteration", iteration, 1)
        if max_transcript_tokens is not None:
            check_at_least("max_transcript_tokens", max_transcript_tokens, 1)
        events = self._redacted(tenant, run_id,
                                prepare_events(new_events, "append_events", self._deps.defaults, turn=iteration))

        if not events:
            # Re-assembling an iteration whose window is persisted and unchanged writes nothing.
            with self._store.read() as txn:
                run = require_run(txn, self._db, key, run_id)
                chosen, _ = plan(self._deps, txn, key, run, iteration, max_transcript_tokens)
                stored = txn.get(key + be32(iteration), db=self._db["windows"])
                if stored is not None and chosen.same_as(record := load_json(stored)):
                    return from_record(self._deps, txn, key, run_id, iteration, record), []
        append = self._appender(key, events, "append_events")

        def write(txn: lmdb.Transaction) -> tuple[TranscriptWindow, list[AppendResult]]:
            run = load_run(txn, self._db, key)
            if run is None:
                if not events:
                    raise NotFound(f"run {run_id!r} not found")
                run = self._new_run()
            writer = LogWriter(txn, self._db, key, run)
            appended = append(writer) if events else []
            replayed = forks.at_assembly(self._deps, writer, iteration) if run.replay_pending else False
            writer.flush()
            chosen, top = plan(self._deps, txn, key, run, iteration, max_transcript_tokens)
            stored = txn.get(key + be32(iteration), db=self._db["windows"])
            if stored is not None and chosen.same_as(record := load_json(stored)):
                return from_record(self._deps, txn, key, run_id, iteration, record), appended
            if self._summarises_itself(run, iteration, replayed):
                due = compaction(self._deps, txn, key, run, iteration, chosen.budget, top, chosen.end)
                text = extractive_summary(self._deps, txn, key, run, due.candidate_ids, due.tokens_before,
                                          chosen.budget) if due.due and due.candidate_ids else None
                if text:
                    record_summary(self._deps, writer, SummaryRequest(iteration, due.candidate_ids, text, ""))
                    writer.flush()
                    chosen, top = plan(self._deps, txn, key, run, iteration, max_transcript_tokens)
            record = persist(self._deps, txn, key, run, iteration, chosen, top)
            return from_record(self._deps, txn, key, run_id, iteration, record), appended

        return self._store.write(write)

    def _summarises_itself(self, run: Run, iteration: int, replayed: bool) -> bool:
        """The built-in summariser runs at an iteration's first assembly, when configured, on a
        run that counts its own tokens and is not replaying a source's summaries."""
        return (self._deps.defaults.summariser == "extractive" and run.settings.summarization
                and run.settings.token_counter != "host-defined" and iteration > run.last_assembled
                and not run.replay_pending and not replayed)

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
        self._store.write(lambda txn: forks.delete_artifact(txn, self._db, key, run_id, artifact_id))
