"""The per-turn transcript window: chosen by fastcore, persisted per iteration, read back.

The window for iteration N is chosen from the log's entries with iteration <= N (a prefix of
the log, since iterations never decrease), and from the summaries in force at N, which stand in
for every event below their floor. What was fed is persisted per iteration, so the seam
(GetTranscriptWindow) returns exactly it, and re-assembling an iteration reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lmdb

import fastcore
from sidecar.eventlog import CHUNK_EVENTS, log_entries_before, log_entries_in, prefix_end, read_ids, read_records
from sidecar.records import StoredEvent, decode_event, dump_json
from sidecar.runs import Deps, Run, save_run
from sidecar.store import be32
from sidecar.summaries import Compaction, Summary, in_force, load_summary, read_artifacts

MAX_COUNT = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Clip:
    """An oversized event of the active turn, fed clipped so the window fits its budget."""

    text: str  # head + elision marker + tail
    tokens: int  # count of ``text``
    original_tokens: int  # the event content's own count


@dataclass(frozen=True, slots=True)
class WindowEntry:
    event: StoredEvent  # a host event, or a summary (type context.summary, its ref as event_id)
    text: str  # what was fed: the content, or its clipped form
    tokens: int  # count of ``text`` in the run's counter
    clipped_from_tokens: int  # the content's own count when clipped, else 0


@dataclass(frozen=True, slots=True)
class SummarizedRange:
    summary_ref: str
    replaced_turns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TranscriptWindow:
    """What one turn is fed. ``records`` are its entries as stored, oldest first: the summaries
    in the window, then the events; ``clips`` (by position) replace the text of entries fed
    clipped. The per-turn answer is built from these bytes without decoding them;
    :meth:`entries` decodes them for everyone else."""

    run_id: str
    iteration: int
    token_counter: str
    token_budget: int
    token_count: int
    omitted_events: int  # events older than the window's first verbatim event, not fed verbatim
    event_ids: list[str]
    records: list[bytes]
    clips: dict[int, Clip] = field(default_factory=dict)
    compaction: Compaction = Compaction(False)
    summarized_ranges: tuple[SummarizedRange, ...] = ()
    summaries_fed: int = 0  # how many of ``records`` (the first ones) are summaries
    context: dict | None = None  # the rest of the accounting, as persisted (None: before sections)
    window_tokens: int = 0  # everything fed: the transcript's tokens and the sections' and tools'

    def entries(self) -> list[WindowEntry]:
        entries = []
        for position, record in enumerate(self.records):
            event = decode_event(record)
            clip = self.clips.get(position)
            if clip is None:
                entries.append(WindowEntry(event, event.content, event.tokens, 0))
            else:
                entries.append(WindowEntry(event, clip.text, clip.tokens, clip.original_tokens))
        return entries


@dataclass(frozen=True, slots=True)
class Plan:
    """The window fastcore chose, before any clipping; also what identifies a persisted window."""

    token_counter: str
    budget: int
    start: int
    end: int
    mandatory: int
    cap: int  # -1: nothing clipped
    tokens: int  # the window's count when nothing is clipped
    top: int  # the summary in force (its index), -1 for none
    prefix_in: int  # how many of the summaries in force are in the window

    def identity(self) -> list[Any]:
        return [self.token_counter, self.budget, self.start, self.end, self.cap, self.top, self.prefix_in]

    def same_as(self, record: dict) -> bool:
        return record["plan"] == self.identity()


def effective_budget(deps: Deps, run: Run, max_transcript_tokens: int | None) -> int:
    # The configured budget is what the capability document advertises; no run exceeds it.
    return min(run.settings.transcript_token_budget, deps.defaults.transcript_token_budget,
               max_transcript_tokens or MAX_COUNT)


def plan(deps: Deps, txn: lmdb.Transaction, key: bytes, run: Run, iteration: int,
         max_transcript_tokens: int | None) -> tuple[Plan, Summary | None]:
    """Choose the window for ``iteration``: read the tail's count chunks (doubling the history
    read while the answer reaches further back, never below the summarised floor)."""
    settings = run.settings
    budget = effective_budget(deps, run, max_transcript_tokens)
    end = prefix_end(txn, deps.db, key, run, iteration)
    top = in_force(txn, deps.db, key, run, iteration) if run.summaries else None
    floor = top.to_seq if top else 0
    prefix = top.stack_tokens if top else ()
    counts = deps.db["counts"]
    last_chunk = (end - 1) // CHUNK_EVENTS if end else 0
    first_chunk = last_chunk
    floor_chunk = min(floor // CHUNK_EVENTS, last_chunk)
    records = (txn.get(key + be32(last_chunk), b"", db=counts)[: (end - last_chunk * CHUNK_EVENTS) * fastcore.RECORD_SIZE]
               if end > floor else b"")
    base = first_chunk * CHUNK_EVENTS if end > floor else end
    while True:
        chosen = fastcore.select_window(records, base, iteration, budget, settings.transcript_window, floor, prefix)
        if chosen is not None:
            break
        earlier = max(floor_chunk, first_chunk - (last_chunk - first_chunk + 1))
        records = b"".join([txn.get(key + be32(c), db=counts) for c in range(earlier, first_chunk)] + [records])
        first_chunk = earlier
        base = first_chunk * CHUNK_EVENTS
    start, mandatory, tokens, cap, prefix_in = chosen
    return Plan(settings.token_counter, budget, start, end, mandatory, cap, tokens, top.index if top else -1,
                prefix_in), top


def persist(deps: Deps, txn: lmdb.Transaction, key: bytes, run: Run, iteration: int, chosen: Plan,
            top: Summary | None, due: Compaction | None, context: dict) -> dict:
    """Persist what ``chosen`` feeds for ``iteration`` (clipping what must be), with the
    compaction decision and the rest of the window's accounting (``context``); return the record."""
    db = deps.db
    skip = log_entries_in(txn, db, key, chosen.start, chosen.end)
    newest = len(top.stack) - chosen.prefix_in if top else 0
    summaries = list(zip(top.stack[newest:], top.stack_refs[newest:])) if top and chosen.prefix_in else []
    record: dict[str, Any] = {
        "plan": chosen.identity(), "start": chosen.start, "end": chosen.end, "counter": chosen.token_counter,
        "budget": chosen.budget, "tokens": chosen.tokens, "skip": skip, "clipped": [],
        "summaries": summaries,
        "omitted": chosen.start - log_entries_before(txn, db, key, run, chosen.start)}
    if chosen.cap >= 0:
        # Clip the mandatory events above the cap; the counts of the clipped texts, not the
        # cap, are what the window adds up.
        counter = deps.counters.get(chosen.token_counter)
        total = 0
        for raw in read_records(txn, db, key, chosen.start, chosen.end):
            event = decode_event(raw)
            if event.seq >= chosen.mandatory and event.tokens > chosen.cap:
                text = counter.clip(event.content, chosen.cap)
                clipped_tokens = counter.count(text)
                record["clipped"].append([event.seq, text, clipped_tokens])
                total += clipped_tokens
            else:
                total += event.tokens
        record["tokens"] = total
    if due is not None:
        record["compaction"] = [due.due, list(due.candidate_ids), due.tokens_before]
    record["context"] = context
    # Everything fed: the transcript as clipped, and what the sections and tools add to it.
    record["window_tokens"] = record["tokens"] + context["fixed_tokens"]
    txn.put(key + be32(iteration), dump_json(record), db=db["windows"])
    if iteration > run.last_assembled:
        run.last_assembled = iteration
        save_run(txn, db, key, run)
    return record


def from_record(deps: Deps, txn: lmdb.Transaction, key: bytes, run_id: str, iteration: int, record: dict,
                with_ranges: bool = False) -> TranscriptWindow:
    db = deps.db
    start, end = record["start"], record["end"]
    records = read_records(txn, db, key, start, end)
    ids = read_ids(txn, db, key, start, end)
    if record["skip"]:
        skip = set(record["skip"])
        kept = [position for position, seq in enumerate(range(start, end)) if seq not in skip]
        records = [records[p] for p in kept]
        ids = [ids[p] for p in kept]
    refs = [ref for _, ref in record["summaries"]]
    clips = {}
    if record["clipped"]:
        positions = [seq for seq in range(start, end) if seq not in set(record["skip"])]
        for seq, text, tokens in record["clipped"]:
            position = positions.index(seq)
            clips[len(refs) + position] = Clip(text, tokens, decode_event(records[position]).tokens)
    ranges: tuple[SummarizedRange, ...] = ()
    if with_ranges:
        ranges = tuple(SummarizedRange(s.ref, s.replaced_turns)
                       for s in (load_summary(txn, db, key, index) for index, _ in record["summaries"]))
    due = Compaction(record["compaction"][0], tuple(record["compaction"][1]), record["compaction"][2]) \
        if "compaction" in record else Compaction(False)
    return TranscriptWindow(
        run_id, iteration, record["counter"], record["budget"], record["tokens"], record["omitted"],
        refs + ids, read_artifacts(txn, db, key, refs) + records, clips, due, ranges, len(refs),
        record.get("context"), record.get("window_tokens", record["tokens"]))
