"""Runs, their event logs, and the per-turn transcript window (RFC 0111's transcript budget).

A run is an append-only log of events. Each event's token count, in the run's counter, is
computed once when it is appended and kept twice: in the event record, and in a packed per-run
array of (tokens, iteration, group_first) records stored in chunks of ``CHUNK_EVENTS`` (beside
each chunk, its events' ids). A turn reads only the tail chunks it needs, lets fastcore choose
the window, then reads exactly the chosen events with one cursor pass: the work per turn is
bounded by the window, not the run.

The window for iteration N is chosen from the events with iteration <= N (a prefix of the log,
since iterations never decrease), so re-assembling an old iteration gives the window it had.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Callable, Sequence

import lmdb

import fastcore
from sidecar.counting import Counters
from sidecar.errors import Conflict, FieldViolation, NotFound, ValidationError
from sidecar.records import (ID_SEPARATOR, ROLES, StoredEvent, decode_event, decode_id_index, dump_json,
                             encode_event, encode_id_index, load_json, pack_count)
from sidecar.settings import ContextSettings
from sidecar.store import Store, be32, scope
from sidecar.validation import check_at_least, check_id

# 128 packed records are 1.5 KiB: small enough to stay inline in an LMDB leaf page, so an append
# rewrites one page instead of a chain of overflow pages (measured: ~15% off a durable turn).
CHUNK_EVENTS = 128
MAX_EVENTS_PER_RUN = 2**31 - 1  # seq travels as int32
MAX_TYPE_BYTES = 64
MAX_COUNT = 2**31 - 1
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class RunSettings:
    token_counter: str
    transcript_token_budget: int
    keep_last_turns: int
    transcript_window: int  # 0: no event-count bound


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event as the host sends it; ``iteration`` 0 means "the turn being assembled"."""

    event_id: str
    iteration: int
    role: str
    type: str
    content: str
    call_id: str = ""
    host_token_count: int | None = None


@dataclass(frozen=True, slots=True)
class AppendResult:
    event_id: str
    seq: int
    tokens: int
    already_recorded: bool


@dataclass(frozen=True, slots=True)
class Clip:
    """An oversized event of the active turn, fed clipped so the window fits its budget."""

    text: str  # head + elision marker + tail
    tokens: int  # count of ``text``
    original_tokens: int  # the event content's own count


@dataclass(frozen=True, slots=True)
class WindowEntry:
    event: StoredEvent
    text: str  # what was fed: the content, or its clipped form
    tokens: int  # count of ``text`` in the run's counter
    clipped_from_tokens: int  # the content's own count when clipped, else 0


@dataclass(frozen=True, slots=True)
class TranscriptWindow:
    """What one turn is fed. ``records`` are the entries' stored event records, oldest first;
    ``clips`` (by position) replace the text of the entries fed clipped. The per-turn answer is
    built from these bytes without decoding them; :meth:`entries` decodes them for everyone else."""

    run_id: str
    iteration: int
    token_counter: str
    token_budget: int
    token_count: int
    omitted_events: int  # events of the prefix left out (all older than the window)
    event_ids: list[str]
    records: list[bytes]
    clips: dict[int, Clip] = field(default_factory=dict)

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


@dataclass(slots=True)
class _Run:
    settings: RunSettings
    next_seq: int = 0
    last_iteration: int = 0

    def record(self) -> bytes:
        return dump_json({"settings": {name: getattr(self.settings, name) for name in RunSettings.__slots__},
                          "next_seq": self.next_seq, "last_iteration": self.last_iteration})

    @classmethod
    def parse(cls, data: bytes) -> _Run:
        value = load_json(data)
        return cls(RunSettings(**value["settings"]), value["next_seq"], value["last_iteration"])


@dataclass(frozen=True, slots=True)
class _Plan:
    """The window fastcore chose, before any clipping; also what identifies a persisted window."""

    token_counter: str
    budget: int
    start: int
    end: int
    mandatory: int
    cap: int  # -1: nothing clipped
    tokens: int  # the window's count when nothing is clipped

    def same_as(self, record: dict) -> bool:
        return (record["counter"], record["budget"], record["start"], record["end"], record["cap"]) == (
            self.token_counter, self.budget, self.start, self.end, self.cap)


class Transcripts:
    def __init__(self, store: Store, counters: Counters, defaults: ContextSettings) -> None:
        self._store = store
        self._counters = counters
        self._defaults = defaults
        self._db = store.db

    # -- runs ---------------------------------------------------------------------------------

    def open_run(self, tenant: str, run_id: str, token_counter: str | None = None,
                 transcript_token_budget: int | None = None, keep_last_turns: int | None = None,
                 transcript_window: int | None = None) -> tuple[RunSettings, bool]:
        """Create the run, or confirm an existing one whose settings match every field given."""
        key = scope(tenant, check_id("run_id", run_id))
        given = {"token_counter": token_counter, "transcript_token_budget": transcript_token_budget,
                 "keep_last_turns": keep_last_turns, "transcript_window": transcript_window}
        given = {name: value for name, value in given.items() if value is not None}
        if "token_counter" in given:
            self._counters.get(given["token_counter"])
        if "transcript_token_budget" in given:
            budget = check_at_least("transcript_token_budget", given["transcript_token_budget"], 1)
            if budget > self._defaults.transcript_token_budget:
                raise ValidationError.field(
                    "transcript_token_budget",
                    f"{budget} exceeds the sidecar's advertised transcriptTokenBudget "
                    f"({self._defaults.transcript_token_budget}); raise [context] "
                    "transcript_token_budget to allow it")
        if "keep_last_turns" in given:
            check_at_least("keep_last_turns", given["keep_last_turns"], 0)
        if "transcript_window" in given:
            check_at_least("transcript_window", given["transcript_window"], 0)
        requested = replace(self._default_settings(), **given)

        def confirm(run: _Run) -> tuple[RunSettings, bool]:
            differing = [name for name, value in given.items() if getattr(run.settings, name) != value]
            if differing:
                raise Conflict(
                    f"run {run_id!r} already exists with different {', '.join(differing)}",
                    tuple(FieldViolation(name, f"the run has {getattr(run.settings, name)!r}")
                          for name in differing))
            return run.settings, False

        with self._store.read() as txn:
            existing = self._load_run(txn, key)
        if existing is not None:
            return confirm(existing)

        def create(txn: lmdb.Transaction) -> tuple[RunSettings, bool]:
            run = self._load_run(txn, key)
            if run is not None:  # created between our read and this write
                return confirm(run)
            txn.put(key, _Run(requested).record(), db=self._db["runs"])
            return requested, True

        return self._store.write(create)

    def _default_settings(self) -> RunSettings:
        d = self._defaults
        return RunSettings(d.token_counter, d.transcript_token_budget, d.keep_last_turns, d.transcript_window)

    def _load_run(self, txn: lmdb.Transaction, key: bytes) -> _Run | None:
        data = txn.get(key, db=self._db["runs"])
        return None if data is None else _Run.parse(data)

    def _require_run(self, txn: lmdb.Transaction, key: bytes, run_id: str) -> _Run:
        run = self._load_run(txn, key)
        if run is None:
            raise NotFound(f"run {run_id!r} not found")
        return run

    # -- events -------------------------------------------------------------------------------

    def append_events(self, tenant: str, run_id: str, events: Sequence[NewEvent]) -> list[AppendResult]:
        """Append ``events`` in one transaction: all of them or none."""
        key = scope(tenant, check_id("run_id", run_id))
        if not events:
            raise ValidationError.field("events", "at least one event is required")
        events = self._prepare(events, "events")
        return self._store.write(self._appender(key, events, "events"))

    def _appender(self, key: bytes, events: Sequence[NewEvent],
                  field: str) -> Callable[[lmdb.Transaction], list[AppendResult]]:
        """Count tokens outside the write lock, then return the work for the write transaction."""
        with self._store.read() as txn:
            run = self._load_run(txn, key)
        counter = run.settings.token_counter if run else self._defaults.token_counter
        counts = self._count(counter, events, field)

        def append(txn: lmdb.Transaction) -> list[AppendResult]:
            run = self._load_run(txn, key) or _Run(self._default_settings())
            nonlocal counter, counts
            if run.settings.token_counter != counter:  # the run was opened meanwhile
                counter = run.settings.token_counter
                counts = self._count(counter, events, field)
            return self._append(txn, key, run, events, counts, field)

        return append

    def _prepare(self, events: Sequence[NewEvent], field: str, turn: int | None = None) -> list[NewEvent]:
        """Fill in defaults (type ``message``; iteration ``turn`` when 0 and a turn is given) and
        validate every field, naming the first bad one."""
        prepared = [replace(event, type=event.type or "message",
                            iteration=event.iteration or (turn or 0)) for event in events]
        limit = self._defaults.max_event_bytes
        for i, event in enumerate(prepared):
            at = f"{field}[{i}]"
            check_id(f"{at}.event_id", event.event_id)
            check_at_least(f"{at}.iteration", event.iteration, 1)
            if turn is not None and event.iteration > turn:
                raise ValidationError.field(
                    f"{at}.iteration", f"is {event.iteration}, after the iteration being assembled ({turn})")
            if event.role not in ROLES:
                raise ValidationError.field(f"{at}.role", f"must be one of {', '.join(ROLES)}")
            check_id(f"{at}.type", event.type, max_bytes=MAX_TYPE_BYTES)
            size = len(event.content.encode("utf-8"))
            if size > limit:
                raise ValidationError.field(
                    f"{at}.content", f"is {size} bytes; at most {limit} are allowed ([context] max_event_bytes)")
            check_id(f"{at}.call_id", event.call_id, required=False)
            if event.host_token_count is not None and not 0 <= event.host_token_count <= MAX_COUNT:
                raise ValidationError.field(f"{at}.host_token_count", f"must be between 0 and {MAX_COUNT}")
        return prepared

    def _count(self, counter_name: str, events: Sequence[NewEvent], field: str) -> list[int]:
        if counter_name == "host-defined":
            for i, event in enumerate(events):
                if event.host_token_count is None:
                    raise ValidationError.field(
                        f"{field}[{i}].host_token_count", "is required: the run counts tokens as host-defined")
            return [event.host_token_count for event in events]  # type: ignore[misc]
        counter = self._counters.get(counter_name)
        return [counter.count(event.content) for event in events]

    def _append(self, txn: lmdb.Transaction, key: bytes, run: _Run, events: Sequence[NewEvent],
                counts: Sequence[int], field: str) -> list[AppendResult]:
        db = self._db
        results: list[AppendResult] = []
        in_batch: dict[str, tuple[NewEvent, AppendResult]] = {}
        count_chunks: dict[int, bytearray] = {}
        id_chunks: dict[int, list[str]] = {}
        for i, (event, tokens) in enumerate(zip(events, counts)):
            at = f"{field}[{i}]"
            earlier = in_batch.get(event.event_id)
            if earlier is not None:
                if earlier[0] != event:
                    raise Conflict.field(f"{at}.event_id", "appears twice in this call with different fields")
                results.append(replace(earlier[1], already_recorded=True))
                continue
            id_key = key + event.event_id.encode("utf-8")
            indexed = txn.get(id_key, db=db["event_ids"])
            if indexed is not None:
                seq_key, host_count = decode_id_index(indexed)
                stored = decode_event(txn.get(key + seq_key, db=db["events"]))
                if not _same_event(stored, host_count, event):
                    raise Conflict.field(f"{at}.event_id", "is already recorded with different fields")
                results.append(AppendResult(stored.event_id, stored.seq, stored.tokens, True))
                continue
            if event.iteration < run.last_iteration:
                raise ValidationError.field(
                    f"{at}.iteration",
                    f"is {event.iteration}, but the run is already at iteration {run.last_iteration}; "
                    "iterations never decrease")
            seq = run.next_seq
            if seq >= MAX_EVENTS_PER_RUN:
                raise ValidationError.field(at, f"the run already holds {seq} events, the most one run can")
            group_first = seq
            if event.call_id:
                call_key = key + event.call_id.encode("utf-8")
                first = txn.get(call_key, db=db["call_ids"])
                if first is None:
                    txn.put(call_key, be32(seq), db=db["call_ids"])
                else:
                    group_first = int.from_bytes(first, "big")
            if event.iteration > run.last_iteration:
                txn.put(key + be32(event.iteration), be32(seq), db=db["iterations"])
            stored = StoredEvent(seq, event.event_id, event.iteration, event.role, event.type,
                                 event.content, event.call_id, tokens)
            txn.put(key + be32(seq), encode_event(stored), db=db["events"])
            txn.put(id_key, encode_id_index(seq, event.host_token_count), db=db["event_ids"])
            chunk = seq // CHUNK_EVENTS
            if chunk not in count_chunks:
                count_chunks[chunk] = bytearray(txn.get(key + be32(chunk), b"", db=db["counts"]))
                ids = txn.get(key + be32(chunk), db=db["id_chunks"])
                id_chunks[chunk] = ids.decode("utf-8").split(ID_SEPARATOR) if ids else []
            count_chunks[chunk] += pack_count(tokens, event.iteration, group_first)
            id_chunks[chunk].append(event.event_id)
            run.next_seq = seq + 1
            run.last_iteration = event.iteration
            result = AppendResult(event.event_id, seq, tokens, False)
            in_batch[event.event_id] = (event, result)
            results.append(result)
        for chunk, records in count_chunks.items():
            txn.put(key + be32(chunk), bytes(records), db=db["counts"])
            txn.put(key + be32(chunk), ID_SEPARATOR.join(id_chunks[chunk]).encode("utf-8"), db=db["id_chunks"])
        txn.put(key, run.record(), db=db["runs"])
        return results

    def list_events(self, tenant: str, run_id: str, from_seq: int = 0,
                    limit: int = 0) -> tuple[list[StoredEvent], int | None]:
        """Stored events from ``from_seq`` on, and the seq to continue from (None at the end)."""
        key = scope(tenant, check_id("run_id", run_id))
        check_at_least("from_seq", from_seq, 0)
        check_at_least("limit", limit, 0)
        limit = min(limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
        with self._store.read() as txn:
            run = self._require_run(txn, key, run_id)
            end = min(run.next_seq, from_seq + limit)
            events = [decode_event(record) for record in self._read_records(txn, key, from_seq, end)]
        return events, (end if end < run.next_seq else None)

    def _read_records(self, txn: lmdb.Transaction, key: bytes, start: int, end: int) -> list[bytes]:
        """The stored records of events ``[start, end)``: one cursor pass, iterated in C."""
        if start >= end:
            return []
        cursor = txn.cursor(db=self._db["events"])
        cursor.set_key(key + be32(start))
        return list(islice(cursor.iternext(keys=False), end - start))

    def _read_ids(self, txn: lmdb.Transaction, key: bytes, start: int, end: int) -> list[str]:
        """The event ids of ``[start, end)``, from the per-chunk id lists."""
        ids: list[str] = []
        for chunk in range(start // CHUNK_EVENTS, (end - 1) // CHUNK_EVENTS + 1 if end > start else 0):
            base = chunk * CHUNK_EVENTS
            chunk_ids = txn.get(key + be32(chunk), db=self._db["id_chunks"]).decode("utf-8").split(ID_SEPARATOR)
            ids += chunk_ids[max(start - base, 0): end - base]
        return ids

    # -- the per-turn window ------------------------------------------------------------------

    def assemble(self, tenant: str, run_id: str, iteration: int, new_events: Sequence[NewEvent] = (),
                 max_transcript_tokens: int | None = None) -> tuple[TranscriptWindow, list[AppendResult]]:
        """Append this turn's events, choose and persist the window for ``iteration``: one transaction."""
        key = scope(tenant, check_id("run_id", run_id))
        check_at_least("iteration", iteration, 1)
        if max_transcript_tokens is not None:
            check_at_least("max_transcript_tokens", max_transcript_tokens, 1)
        events = self._prepare(new_events, "append_events", turn=iteration)

        if events:
            append = self._appender(key, events, "append_events")

            def append_and_assemble(txn: lmdb.Transaction) -> tuple[TranscriptWindow, list[AppendResult]]:
                appended = append(txn)
                return self._assemble_in(txn, key, run_id, iteration, max_transcript_tokens), appended

            return self._store.write(append_and_assemble)

        # Re-assembling an iteration whose window is persisted and unchanged writes nothing.
        with self._store.read() as txn:
            run = self._require_run(txn, key, run_id)
            plan = self._plan(txn, key, run, iteration, max_transcript_tokens)
            stored = txn.get(key + be32(iteration), db=self._db["windows"])
            if stored is not None and plan.same_as(record := load_json(stored)):
                return self._window(txn, key, run_id, iteration, record), []

        return self._store.write(
            lambda txn: (self._assemble_in(txn, key, run_id, iteration, max_transcript_tokens), []))

    def transcript_window(self, tenant: str, run_id: str, iteration: int) -> TranscriptWindow:
        """What AssembleContext fed for ``iteration`` (RFC 0111's transcript-window seam)."""
        key = scope(tenant, check_id("run_id", run_id))
        check_at_least("iteration", iteration, 1)
        with self._store.read() as txn:
            self._require_run(txn, key, run_id)
            stored = txn.get(key + be32(iteration), db=self._db["windows"])
            if stored is None:
                raise NotFound(f"iteration {iteration} of run {run_id!r} was never assembled")
            return self._window(txn, key, run_id, iteration, load_json(stored))

    def _plan(self, txn: lmdb.Transaction, key: bytes, run: _Run, iteration: int,
              max_transcript_tokens: int | None) -> _Plan:
        settings = run.settings
        # The configured budget is what the capability document advertises; no run exceeds it.
        budget = min(settings.transcript_token_budget, self._defaults.transcript_token_budget,
                     max_transcript_tokens or MAX_COUNT)
        end = self._prefix_end(txn, key, run, iteration)
        if end == 0:
            return _Plan(settings.token_counter, budget, 0, 0, 0, -1, 0)
        counts = self._db["counts"]
        last_chunk = (end - 1) // CHUNK_EVENTS
        first_chunk = last_chunk
        records = txn.get(key + be32(last_chunk), db=counts)[: (end - last_chunk * CHUNK_EVENTS) * fastcore.RECORD_SIZE]
        while True:
            chosen = fastcore.select_window(records, first_chunk * CHUNK_EVENTS, iteration, budget,
                                            settings.transcript_window)
            if chosen is not None:
                break
            # The answer reaches further back: double the history read so far.
            earlier = max(0, first_chunk - (last_chunk - first_chunk + 1))
            records = b"".join([txn.get(key + be32(c), db=counts) for c in range(earlier, first_chunk)] + [records])
            first_chunk = earlier
        start, mandatory, tokens, cap = chosen
        return _Plan(settings.token_counter, budget, start, end, mandatory, cap, tokens)

    def _prefix_end(self, txn: lmdb.Transaction, key: bytes, run: _Run, iteration: int) -> int:
        """One past the last seq of the events with iteration <= ``iteration``."""
        if iteration >= run.last_iteration:
            return run.next_seq
        cursor = txn.cursor(db=self._db["iterations"])
        if cursor.set_range(key + be32(iteration + 1)) and cursor.key().startswith(key):
            return int.from_bytes(cursor.value(), "big")
        return run.next_seq

    def _assemble_in(self, txn: lmdb.Transaction, key: bytes, run_id: str, iteration: int,
                     max_transcript_tokens: int | None) -> TranscriptWindow:
        """Choose the window inside a write transaction and persist it unless it is unchanged."""
        run = self._require_run(txn, key, run_id)
        plan = self._plan(txn, key, run, iteration, max_transcript_tokens)
        window_key = key + be32(iteration)
        stored = txn.get(window_key, db=self._db["windows"])
        if stored is not None and plan.same_as(record := load_json(stored)):
            return self._window(txn, key, run_id, iteration, record)
        record = {"counter": plan.token_counter, "budget": plan.budget, "start": plan.start, "end": plan.end,
                  "cap": plan.cap, "tokens": plan.tokens, "clipped": []}
        if plan.cap >= 0:
            # Clip the mandatory events above the cap; the counts of the clipped texts, not the
            # cap, are what the window adds up.
            counter = self._counters.get(plan.token_counter)
            total = 0
            for raw in self._read_records(txn, key, plan.start, plan.end):
                event = decode_event(raw)
                if event.seq >= plan.mandatory and event.tokens > plan.cap:
                    text = counter.clip(event.content, plan.cap)
                    clipped_tokens = counter.count(text)
                    record["clipped"].append([event.seq, text, clipped_tokens])
                    total += clipped_tokens
                else:
                    total += event.tokens
            record["tokens"] = total
        txn.put(window_key, dump_json(record), db=self._db["windows"])
        return self._window(txn, key, run_id, iteration, record)

    def _window(self, txn: lmdb.Transaction, key: bytes, run_id: str, iteration: int, record: dict) -> TranscriptWindow:
        start, end = record["start"], record["end"]
        records = self._read_records(txn, key, start, end)
        clips = {}
        if record["clipped"]:
            original = {seq: decode_event(records[seq - start]).tokens for seq, _, _ in record["clipped"]}
            clips = {seq - start: Clip(text, tokens, original[seq]) for seq, text, tokens in record["clipped"]}
        return TranscriptWindow(run_id, iteration, record["counter"], record["budget"], record["tokens"], start,
                                self._read_ids(txn, key, start, end), records, clips)


def _same_event(stored: StoredEvent, stored_host_count: int | None, event: NewEvent) -> bool:
    return (stored.iteration, stored.role, stored.type, stored.content, stored.call_id, stored_host_count) == (
        event.iteration, event.role, event.type, event.content, event.call_id, event.host_token_count)
