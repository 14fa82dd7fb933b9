"""The transcript area's storage: the keys and records of its databases (``AREAS["runs"]``), their
byte layouts, and the reads and writes of them.

Everything of a run lives under its key, ``scope(tenant, run_id)`` (tenant NUL run id NUL,
:func:`run_key`). After it, a key holds a number (:func:`numbered_key`: 4 bytes big-endian, so
LMDB's key order is numeric order) or a name (:func:`name_key`)::

    database            key after the run's      value
    runs                (none)                   the run record, JSON (runs.Run)
    events              seq                      the entry, an EventRecord (storage.codec)
    event_ids           event id                 its seq, and the host's count when it sent one (codec)
    call_ids            call id                  the seq of the call's first event (its group)
    iterations          iteration                the seq of its first entry
    counts              chunk                    packed count records (COUNT_RECORD), CHUNK_EVENTS to a chunk
    id_chunks           chunk                    the chunk's event ids, NUL-joined
    log_entries         seq                      how many of the sidecar's own entries came before it
    windows             iteration                what was fed, JSON (WindowRecord)
    summaries           index                    a summary (summaries.Summary)
    artifacts           summary ref              the summary's entry, an EventRecord
    compaction_records  index                    JSON (CompactionRecord)
    fed_forms           seq, made_at             a fed form, JSON (FedForm)
    replay              seq                      a replay fork's pending summary or host event, JSON (forks)

The run record and a summary are typed where they are made (``runs``, ``summaries``); the
records every stage of a turn reads (the window, the compaction record, a fed form) are typed
here, and so are the count records and their chunks: the other modules read and change them
through :class:`CountTail`, :class:`LogChunks` and the count-record functions, never by offset.

Written elsewhere, by these layouts: an event's record is ``storage.codec``'s ``EventRecord``;
an append's host events (records, keys, id index, count records) are made in C by fastcore's
``_entries``, which reads each event tuple by the order ``log.NewEvent`` declares, and whose
constants ``tests/test_architecture.py`` holds to those here; and ``log.LogWriter.append_record``
puts one entry of the sidecar's own with this module's keys, inline, as it runs on the turn's
hot path.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import compress, islice
from typing import TYPE_CHECKING, cast

import fastcore
from sidecar.caching import Cache, CacheSpec, cache_of
from sidecar.storage.codec import (
    ID_SEPARATOR,
    StoredEvent,
    decode_event,
    decode_id_index,
    dump_plain_json,
    load_plain_json,
)
from sidecar.storage.keys import Db, Txn, be32, keys_under, records_under, scope
from sidecar.validation import check_id, page_within_bytes

if TYPE_CHECKING:
    import lmdb


# -- the count records' layout ------------------------------------------------------------------
# One count record per log entry: (tokens, iteration, group_first), three little-endian uint32,
# packed end to end. This is its one declaration: fastcore's compiled modules (_fastcore.pyx,
# _entries.pyx, and their twins) read and write it at these offsets, and
# tests/test_architecture.py holds their constants to these.
COUNT_RECORD = struct.Struct("<III")
RECORD_SIZE = COUNT_RECORD.size
TOKENS_AT, ITERATION_AT, GROUP_FIRST_AT = 0, 4, 8  # each field's byte offset in a record
assert RECORD_SIZE == fastcore.RECORD_SIZE, "fastcore was built from another count-record layout"
assert array("I").itemsize == 4, "count_columns reads the records' fields as 32-bit"
# 128 packed records are 1.5 KiB: small enough to stay inline in an LMDB leaf page, so an append
# rewrites one page instead of a chain of overflow pages (measured: ~15% off a durable turn).
CHUNK_EVENTS = 128
ID_SEPARATOR_BYTES = ID_SEPARATOR.encode("utf-8")


def pack_count(tokens: int, iteration: int, group_first: int) -> bytes:
    """One count record."""
    return COUNT_RECORD.pack(tokens, iteration, group_first)


def records_in(counts: bytes) -> int:
    """How many count records ``counts`` holds."""
    return len(counts) // RECORD_SIZE


def count_at(counts: bytes, base_seq: int, seq: int) -> tuple[int, int, int]:
    """Entry ``seq``'s count record, (tokens, iteration, group_first), in ``counts`` (which
    begin at entry ``base_seq``)."""
    return COUNT_RECORD.unpack_from(counts, (seq - base_seq) * RECORD_SIZE)


def tokens_at(counts: bytes, base_seq: int, seq: int) -> int:
    """What entry ``seq`` weighs, in ``counts`` (which begin at entry ``base_seq``)."""
    at = (seq - base_seq) * RECORD_SIZE + TOKENS_AT
    return int.from_bytes(counts[at:at + 4], "little")


def counts_from(counts: bytes, base_seq: int, seq: int) -> bytes:
    """The records of ``counts`` (which begin at entry ``base_seq``) from entry ``seq`` on."""
    return counts[(seq - base_seq) * RECORD_SIZE:]


def unpacked(counts: bytes) -> Iterator[tuple[int, int, int]]:
    """Each record of ``counts``, (tokens, iteration, group_first)."""
    return COUNT_RECORD.iter_unpack(counts)


# -- keys -------------------------------------------------------------------------------------

def run_key(tenant: str, run_id: str, field: str = "run_id") -> bytes:
    return scope(tenant, check_id(field, run_id))


def run_id_of(key: bytes) -> str:
    """The run id in a run key (``scope(tenant, run_id)``: tenant NUL run_id NUL)."""
    return key[:-1].split(b"\0", 1)[1].decode("utf-8")


def numbered_key(key: bytes, number: int) -> bytes:
    """The key of a run's record numbered ``number``: an entry's seq, an iteration, a chunk, an index."""
    return key + number.to_bytes(4, "big")


def name_key(key: bytes, name: str) -> bytes:
    """The key of a run's record named ``name``: an event id, a call id, a summary ref."""
    return key + name.encode("utf-8")


def form_key(key: bytes, seq: int, made_at: int) -> bytes:
    return key + seq.to_bytes(4, "big") + made_at.to_bytes(4, "big")


# -- typed reads --------------------------------------------------------------------------------
# The store opens its transactions with lmdb's default buffers=False, so every value and key read
# is bytes (lmdb's stubs say ``bytes | memoryview`` for the buffers=True case).

def _get(txn: Txn, handle: Db, key: bytes) -> bytes | None:
    return txn.get(key, db=handle)


def _cursor(txn: Txn, handle: Db) -> lmdb.Cursor[bytes]:
    return txn.cursor(db=handle)


def _stored(txn: Txn, handle: Db, key: bytes, what: str) -> bytes:
    """A record the run's other records say is there."""
    data = _get(txn, handle, key)
    if data is None:
        raise LookupError(f"the {what} record is missing")  # a defect, not a user error
    return data


# -- runs -------------------------------------------------------------------------------------

def run_record(txn: Txn, db: dict, key: bytes) -> bytes | None:
    return _get(txn, db["runs"], key)


def put_run_record(txn: Txn, db: dict, key: bytes, data: bytes) -> None:
    txn.put(key, data, db=db["runs"])


def run_keys_of(txn: Txn, db: dict, tenant: str) -> Iterator[bytes]:
    """The key of each run of ``tenant``, in key order (its id's bytes); no record read."""
    prefix = scope(tenant)
    return (prefix + suffix for suffix in keys_under(txn, db["runs"], prefix))


# -- the log: entries, ids, counts -------------------------------------------------------------

def event_record(txn: Txn, db: dict, key: bytes, seq: int) -> bytes:
    """The stored record of entry ``seq``."""
    return _stored(txn, db["events"], numbered_key(key, seq), "event")


def read_event(txn: Txn, db: dict, key: bytes, seq: int) -> StoredEvent:
    return decode_event(event_record(txn, db, key, seq))


def read_records(txn: Txn, db: dict, key: bytes, start: int, end: int) -> list[bytes]:
    """The stored records of entries ``[start, end)``: one cursor pass, iterated in C."""
    return list(iter_records(txn, db, key, start, end))


def iter_records(txn: Txn, db: dict, key: bytes, start: int, end: int) -> Iterator[bytes]:
    """The stored records of entries ``[start, end)``, read as they are taken."""
    if start >= end:
        return iter(())
    cursor = _cursor(txn, db["events"])
    cursor.set_key(numbered_key(key, start))
    return islice(cursor.iternext(keys=False), end - start)


def indexed_event(txn: Txn, db: dict, key: bytes, event_id: str) -> tuple[int, int | None] | None:
    """The event-id index: the seq of event ``event_id`` and the host's count when it sent one;
    None when the run has no such event."""
    indexed = _get(txn, db["event_ids"], name_key(key, event_id))
    if indexed is None:
        return None
    seq, host_count = decode_id_index(indexed)
    return int.from_bytes(seq, "big"), host_count


def event_seq(txn: Txn, db: dict, key: bytes, event_id: str) -> int | None:
    """The seq of event ``event_id``; None when the run has no such event."""
    indexed = indexed_event(txn, db, key, event_id)
    return None if indexed is None else indexed[0]


def event_by_id(txn: Txn, db: dict, key: bytes, event_id: str) -> StoredEvent:
    """Event ``event_id``, which the run's records say is there."""
    indexed = indexed_event(txn, db, key, event_id)
    if indexed is None:
        raise LookupError(f"the event {event_id!r} is missing")  # a defect, not a user error
    return read_event(txn, db, key, indexed[0])


def call_group(txn: Txn, db: dict, key: bytes, call_id: str, seq: int) -> int:
    """The seq of the first event of call ``call_id`` (its group's); ``seq`` when the call is
    new, recorded as its first."""
    call_key = name_key(key, call_id)
    first = _get(txn, db["call_ids"], call_key)
    if first is None:
        txn.put(call_key, seq.to_bytes(4, "big"), db=db["call_ids"])
        return seq
    return int.from_bytes(first, "big")


def count_chunk(txn: Txn, db: dict, key: bytes, chunk: int) -> bytes:
    """The packed count records of chunk ``chunk`` (empty when it holds none yet)."""
    return _get(txn, db["counts"], numbered_key(key, chunk)) or b""


def count_chunks(txn: Txn, db: dict, key: bytes, first: int, end: int, then: bytes = b"") -> bytes:
    """The packed count records of chunks ``[first, end)``, joined, and ``then`` after them (the
    records of the chunks read before: one copy)."""
    handle = db["counts"]
    chunks = [txn.get(numbered_key(key, chunk), b"", db=handle) for chunk in range(first, end)]
    return b"".join(cast("list[bytes]", [*chunks, then]))


def id_chunk(txn: Txn, db: dict, key: bytes, chunk: int) -> list[str]:
    """The ids of the entries of chunk ``chunk`` (none when it holds none yet)."""
    ids = stored_id_chunk(txn, db, key, chunk)
    return ids.decode("utf-8").split(ID_SEPARATOR) if ids else []


def stored_id_chunk(txn: Txn, db: dict, key: bytes, chunk: int) -> bytes:
    """Chunk ``chunk``'s ids as stored: UTF-8, joined by ``ID_SEPARATOR`` (b"" when it holds none)."""
    return _get(txn, db["id_chunks"], numbered_key(key, chunk)) or b""


def joined_ids(ids: Sequence[str]) -> bytes:
    """Ids as a chunk stores them."""
    return ID_SEPARATOR.join(ids).encode("utf-8")


def put_chunk(txn: Txn, db: dict, key: bytes, chunk: int, counts: bytes, ids: bytes) -> None:
    """A chunk's count records and its ids as stored (:func:`joined_ids`)."""
    txn.put(numbered_key(key, chunk), counts, db=db["counts"])
    txn.put(numbered_key(key, chunk), ids, db=db["id_chunks"])


def put_counts(txn: Txn, db: dict, key: bytes, chunk: int, counts: bytes) -> None:
    txn.put(numbered_key(key, chunk), counts, db=db["counts"])


def read_ids(txn: Txn, db: dict, key: bytes, start: int, end: int) -> list[str]:
    """The ids of entries ``[start, end)``, from the per-chunk id lists."""
    ids: list[str] = []
    for chunk in range(start // CHUNK_EVENTS, (end - 1) // CHUNK_EVENTS + 1 if end > start else 0):
        base = chunk * CHUNK_EVENTS
        ids += id_chunk(txn, db, key, chunk)[max(start - base, 0): end - base]
    return ids


def read_counts(txn: Txn, db: dict, key: bytes, start: int, end: int) -> bytes:
    """The packed count records of entries ``[start, end)``."""
    if start >= end:
        return b""
    first, last = start // CHUNK_EVENTS, (end - 1) // CHUNK_EVENTS
    records = count_chunks(txn, db, key, first, last + 1)
    offset = first * CHUNK_EVENTS
    return records[(start - offset) * RECORD_SIZE:(end - offset) * RECORD_SIZE]


class CountTail:
    """The count records of a log's tail ``[base, end)``, read by whole chunks back from ``end``
    and never below the chunk of ``floor``: a window is chosen from the newest chunk, and more of
    the history is read only while the answer reaches further back."""

    def __init__(self, txn: Txn, db: dict, key: bytes, floor: int, end: int) -> None:
        self._txn, self._db, self._key = txn, db, key
        self._last = (end - 1) // CHUNK_EVENTS if end else 0
        self._first = self._last
        self._floor = min(floor // CHUNK_EVENTS, self._last)
        self.records = (count_chunk(txn, db, key, self._last)[:(end - self._last * CHUNK_EVENTS) * RECORD_SIZE]
                        if end > floor else b"")
        self.base = self._first * CHUNK_EVENTS if end > floor else end  # the seq of the first record

    def reach_back_to(self, seq: int) -> None:
        """Hold entry ``seq`` (below the tail's end) too, or as much as the floor allows."""
        self._read_from(max(self._floor, min(self._last, seq // CHUNK_EVENTS)))

    def read_further(self) -> None:
        """Read back as many chunks again as held (never below the floor's)."""
        self._read_from(max(self._floor, self._first - (self._last - self._first + 1)))

    def _read_from(self, first: int) -> None:
        self.records = count_chunks(self._txn, self._db, self._key, first, self._first, then=self.records)
        self._first = first
        self.base = first * CHUNK_EVENTS


class LogChunks:
    """A run's per-chunk arrays while they are written: each chunk's count records and, ``with_ids``,
    its event ids as stored (joined), read once, changed in memory and put by :meth:`flush`. An
    appended id is joined on: every append rewrites its chunk, and splitting and joining the ids
    each time cost more than the rest of it."""

    def __init__(self, txn: Txn, db: dict, key: bytes, with_ids: bool = True) -> None:
        self._txn, self._db, self._key, self._with_ids = txn, db, key, with_ids
        self._counts: dict[int, bytearray] = {}
        self._ids: dict[int, bytearray] = {}
        self._changed: set[int] = set()  # chunks changed since the last flush

    def append(self, first_seq: int, counts: bytes, event_ids: Sequence[str]) -> None:
        """Entries ``first_seq``, ``first_seq + 1``, ... (the log's next): their packed count
        records and their ids, into the chunks they fall in."""
        placed = 0
        while placed < len(event_ids):
            chunk = self._chunk(first_seq + placed)
            end = min(len(event_ids), (chunk + 1) * CHUNK_EVENTS - first_seq)
            self._counts[chunk] += counts[placed * RECORD_SIZE:end * RECORD_SIZE]
            ids = self._ids[chunk]
            if ids:
                ids += ID_SEPARATOR_BYTES
            ids += joined_ids(event_ids[placed:end])
            placed = end

    def set_tokens(self, seq: int, tokens: int) -> None:
        """Make entry ``seq``'s count record say it weighs ``tokens``."""
        chunk = self._chunk(seq)
        at = (seq - chunk * CHUNK_EVENTS) * RECORD_SIZE + TOKENS_AT
        self._counts[chunk][at:at + 4] = tokens.to_bytes(4, "little")

    def _chunk(self, seq: int) -> int:
        """The chunk holding ``seq``, read into memory once (and marked changed)."""
        chunk = seq // CHUNK_EVENTS
        if chunk not in self._counts:
            self._counts[chunk] = bytearray(count_chunk(self._txn, self._db, self._key, chunk))
            if self._with_ids:
                self._ids[chunk] = bytearray(stored_id_chunk(self._txn, self._db, self._key, chunk))
        self._changed.add(chunk)
        return chunk

    def flush(self) -> None:
        for chunk in sorted(self._changed):
            if self._with_ids:
                put_chunk(self._txn, self._db, self._key, chunk, bytes(self._counts[chunk]), bytes(self._ids[chunk]))
            else:
                put_counts(self._txn, self._db, self._key, chunk, bytes(self._counts[chunk]))
        self._changed.clear()


def count_columns(counts: bytes) -> array:
    """Packed count records (three little-endian uint32s each: tokens, iteration, group_first) as
    one array of their fields: ``[0::3]`` the tokens, ``[2::3]`` the group firsts, for sums and
    scans in C."""
    columns = array("I", counts)
    if sys.byteorder == "big":
        columns.byteswap()
    return columns


def log_entries_in(txn: Txn, db: dict, key: bytes, start: int, end: int) -> list[int]:
    """The seqs of the sidecar's own entries (not transcript) in ``[start, end)``: those whose
    count record is marked ``NOT_A_UNIT``, found by fastcore in the range's count records. A
    window holds one per summary recorded since its start, and a turn asks twice: a walk of
    ``log_entries`` cost a Python step per entry, and the count records are a read per chunk."""
    return fastcore.own_entries(read_counts(txn, db, key, start, end), start)


def leave_out(own: list[int], start: int, *columns: list) -> list[list]:
    """Each of ``columns`` (one item per entry of the log from ``start`` on) without the items of
    the sidecar's own entries ``own`` (their seqs): by one mask, in C, whether they are a few or
    one per summary recorded since ``start``."""
    if not own:
        return list(columns)
    kept = bytearray(b"\x01") * len(columns[0])
    for seq in own:
        kept[seq - start] = 0
    return [list(compress(column, kept)) for column in columns]


def log_entries_from_seq(txn: Txn, db: dict, key: bytes, start: int, end: int) -> Iterator[int]:
    """The same, read as they are consumed: a caller that needs only the first few stops early."""
    cursor = _cursor(txn, db["log_entries"])
    if cursor.set_range(numbered_key(key, start)):
        for entry_key in cursor.iternext(values=False):
            if not entry_key.startswith(key) or (seq := int.from_bytes(entry_key[len(key):], "big")) >= end:
                return
            yield seq


def log_entries_from(txn: Txn, db: dict, key: bytes, seq: int) -> int | None:
    """How many of the sidecar's own entries come before the first one at or after ``seq``;
    None when there is none there."""
    cursor = _cursor(txn, db["log_entries"])
    if cursor.set_range(numbered_key(key, seq)) and cursor.key().startswith(key):
        return int.from_bytes(cursor.value(), "big")
    return None


def iteration_start(txn: Txn, db: dict, key: bytes, iteration: int) -> int | None:
    """The first seq of the first iteration at or after ``iteration`` that the log holds; None
    when it holds none."""
    cursor = _cursor(txn, db["iterations"])
    if cursor.set_range(numbered_key(key, iteration)) and cursor.key().startswith(key):
        return int.from_bytes(cursor.value(), "big")
    return None


def copy_under(txn: Txn, handle: Db, source_key: bytes, fork_key: bytes,
               wanted: Callable[[bytes, bytes], bool]) -> list[bytes]:
    """Copy the source's records of one database that ``wanted(key suffix, value)`` accepts; their
    key suffixes."""
    copied = [(suffix, value) for suffix, value in records_under(txn, handle, source_key) if wanted(suffix, value)]
    for suffix, value in copied:
        txn.put(fork_key + suffix, value, db=handle)
    return [suffix for suffix, _ in copied]


def copy_log(txn: Txn, db: dict, source_key: bytes, fork_key: bytes, from_seq: int) -> None:
    """The entries below ``from_seq`` and every index over them, under the fork's key."""
    if not from_seq:
        return
    cursor = _cursor(txn, db["events"])
    cursor.set_key(numbered_key(source_key, 0))
    for seq, value in zip(range(from_seq), cursor.iternext(keys=False)):
        txn.put(numbered_key(fork_key, seq), value, db=db["events"])
    for event_id in read_ids(txn, db, source_key, 0, from_seq):
        indexed = _stored(txn, db["event_ids"], name_key(source_key, event_id), "event id")
        txn.put(name_key(fork_key, event_id), indexed, db=db["event_ids"])
    # call_ids and iterations map to a first seq; log_entries are keyed by their seq.
    for name in ("call_ids", "iterations"):
        copy_under(txn, db[name], source_key, fork_key, lambda _, seq: int.from_bytes(seq, "big") < from_seq)
    copy_under(txn, db["log_entries"], source_key, fork_key, lambda seq, _: int.from_bytes(seq, "big") < from_seq)
    for chunk in range((from_seq - 1) // CHUNK_EVENTS + 1):
        kept = min(CHUNK_EVENTS, from_seq - chunk * CHUNK_EVENTS)
        put_chunk(txn, db, fork_key, chunk, count_chunk(txn, db, source_key, chunk)[:kept * RECORD_SIZE],
                  joined_ids(id_chunk(txn, db, source_key, chunk)[:kept]))


# -- the window fed per iteration -------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Compaction:
    """Whether compaction is due, and what to summarise (the compaction policy decides both)."""

    due: bool
    candidate_ids: tuple[str, ...] = ()
    tokens_before: int = 0
    # Said once (due False) when compaction would be due but nothing can be summarised.
    reason: str = ""
    # That case's marker, persisted with the window: the summary in force (-1: none) under which
    # the reason was said, so the following turns stay quiet until another summary is recorded.
    said_under: int | None = None


@dataclass(frozen=True, slots=True)
class WindowRecord:
    """What was fed for one iteration (``windows``), as ``window.persist`` makes it: enough to
    read the window back exactly as fed, and to know whether assembling it again feeds the same.
    Stored as a JSON object of these fields; an optional one is left out when None."""

    plan: tuple[str, int, int, int, int, int, int]  # window.Plan.identity(): what identifies the choice
    start: int  # the window's first seq
    end: int  # one past its last
    counter: str
    budget: int
    tokens: int  # the transcript fed, its clips as clipped
    skip: list[int]  # the sidecar's own entries in [start, end): not fed
    clipped: tuple[tuple[int, str, int], ...]  # (seq, text, tokens) of each event clipped in its own turn
    summaries: tuple[tuple[int, str], ...]  # (index, ref) of each summary fed, oldest first
    omitted: int  # host events before the window that no summary in it stands in for
    # Host events the summaries fed stand in for; None in records persisted before the two counts
    # were apart, whose ``omitted`` holds them too.
    summarized: int | None = None
    fed: list[list[int]] | None = None  # [seq, made_at] of each fed form (FedForm) in the window
    compaction: Compaction | None = None  # None: not decided (a run without summaries)
    context: dict | None = None  # the sections' accounting (context_window), as persisted
    window_tokens: int | None = None  # everything fed: the transcript, the sections and the tools

    @property
    def fed_tokens(self) -> int:
        """Everything fed (records persisted before the sections were: the transcript)."""
        return self.tokens if self.window_tokens is None else self.window_tokens

    @property
    def cache(self) -> dict | None:
        """The request's cache state as persisted with the window (``context_window.cache_state``)."""
        return (self.context or {}).get("cache")

    def encode(self) -> bytes:
        value = {"plan": self.plan, "start": self.start, "end": self.end, "counter": self.counter,
                 "budget": self.budget, "tokens": self.tokens, "skip": self.skip, "clipped": self.clipped,
                 "summaries": self.summaries, "omitted": self.omitted}
        if self.summarized is not None:
            value["summarized"] = self.summarized
        if self.fed is not None:
            value["fed"] = self.fed
        if self.compaction is not None:
            due = self.compaction
            value["compaction"] = [due.due, due.candidate_ids, due.tokens_before, due.reason, due.said_under]
        if self.context is not None:
            value["context"] = self.context
        if self.window_tokens is not None:
            value["window_tokens"] = self.window_tokens
        return dump_plain_json(value)  # tuples are JSON arrays, as the lists they are read back as

    @classmethod
    def parse(cls, data: bytes) -> WindowRecord:
        value = load_plain_json(data)
        # Records persisted before the reason existed hold only its first three fields.
        compaction = value.get("compaction")
        return cls(
            tuple(value["plan"]), value["start"], value["end"], value["counter"], value["budget"], value["tokens"],
            value["skip"], tuple(map(tuple, value["clipped"])), tuple(map(tuple, value["summaries"])),
            value["omitted"], value.get("summarized"), value.get("fed"),
            Compaction(compaction[0], tuple(compaction[1]), *compaction[2:]) if compaction is not None else None,
            value.get("context"), value.get("window_tokens"))


def window_at(txn: Txn, db: dict, key: bytes, iteration: int) -> WindowRecord | None:
    """The window persisted for ``iteration``; None when it was never assembled."""
    stored = _get(txn, db["windows"], numbered_key(key, iteration))
    return None if stored is None else WindowRecord.parse(stored)


def window_count(txn: Txn, db: dict, key: bytes) -> int:
    """How many windows are persisted for the run (by their keys: no record read)."""
    return sum(1 for _ in keys_under(txn, db["windows"], key))


def windows_from(txn: Txn, db: dict, key: bytes, skip: int, limit: int) -> list[tuple[int, WindowRecord]]:
    """Up to ``limit`` of the run's windows, by iteration, after its first ``skip`` (those skipped
    by their keys alone, only the page's records read and parsed)."""
    first = next(islice(keys_under(txn, db["windows"], key), skip, None), None)
    if first is None or limit < 1:
        return []
    return [(int.from_bytes(suffix, "big"), WindowRecord.parse(value))
            for suffix, value in islice(records_under(txn, db["windows"], key, first), limit)]


def window_bytes(txn: Txn, db: dict, key: bytes, iteration: int) -> bytes | None:
    """The window record persisted for ``iteration``, as stored; None when it was never assembled."""
    return _get(txn, db["windows"], numbered_key(key, iteration))


def previous_window(txn: Txn, db: dict, key: bytes, iteration: int) -> WindowRecord | None:
    """The newest window persisted for an iteration before ``iteration`` (so re-assembling an
    old iteration, or a replay fork's, finds the same one); None when there is none."""
    stored = previous_window_bytes(txn, db, key, iteration)
    return None if stored is None else WindowRecord.parse(stored)


def previous_window_bytes(txn: Txn, db: dict, key: bytes, iteration: int) -> bytes | None:
    """:func:`previous_window`'s record, as stored."""
    cursor = _cursor(txn, db["windows"])
    if cursor.set_range(numbered_key(key, iteration)):
        found = cursor.prev()
    else:
        found = cursor.last()
    if not found or len(cursor.key()) != len(key) + 4 or not cursor.key().startswith(key):
        return None
    return cursor.value()


def previous_iteration(txn: Txn, db: dict, key: bytes, iteration: int) -> int:
    """The iteration of :func:`previous_window`'s record; 0 when there is none."""
    cursor = _cursor(txn, db["windows"])
    found = cursor.prev() if cursor.set_range(numbered_key(key, iteration)) else cursor.last()
    if not found or len(cursor.key()) != len(key) + 4 or not cursor.key().startswith(key):
        return 0
    return int.from_bytes(cursor.key()[len(key):], "big")


def put_window(txn: Txn, db: dict, key: bytes, iteration: int, record: WindowRecord) -> None:
    txn.put(numbered_key(key, iteration), record.encode(), db=db["windows"])


# -- summaries and their artifacts ------------------------------------------------------------

def summary_record(txn: Txn, db: dict, key: bytes, index: int) -> bytes:
    return _stored(txn, db["summaries"], numbered_key(key, index), "summary")


def summary_records(txn: Txn, db: dict, key: bytes) -> Callable[[int], bytes]:
    """The run's summary records by index, read on one cursor: a turn walks a stack of dozens."""
    cursor = _cursor(txn, db["summaries"])

    def record(index: int) -> bytes:
        if not cursor.set_key(numbered_key(key, index)):
            raise LookupError("the summary record is missing")  # a defect, not a user error
        return cursor.value()
    return record


def put_summary_record(txn: Txn, db: dict, key: bytes, index: int, data: bytes) -> None:
    txn.put(numbered_key(key, index), data, db=db["summaries"])


def artifact(txn: Txn, db: dict, key: bytes, ref: str) -> bytes | None:
    """A summary's artifact: its entry as stored (a WindowEntry on the wire); None when deleted."""
    return _get(txn, db["artifacts"], name_key(key, ref))


def artifacts(txn: Txn, db: dict, key: bytes, refs: list[str]) -> tuple[list[bytes], str | None]:
    """Several artifacts in one C-level pass (a window may feed dozens of summaries), and the
    first ref of them that is not there (None when all are)."""
    if not refs:
        return [], None
    found = _cursor(txn, db["artifacts"]).getmulti([name_key(key, ref) for ref in refs])
    if len(found) != len(refs):
        present = {stored_key[len(key):].decode("utf-8") for stored_key, _ in found}
        return [], next(ref for ref in refs if ref not in present)
    return [value for _, value in found], None


def put_artifact(txn: Txn, db: dict, key: bytes, ref: str, data: bytes) -> None:
    txn.put(name_key(key, ref), data, db=db["artifacts"])


def drop_artifact(txn: Txn, db: dict, key: bytes, ref: str) -> bool:
    """False when there was no such artifact."""
    return txn.delete(name_key(key, ref), db=db["artifacts"])


# -- compaction records ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CompactionRecord:
    """One compaction (a summary recorded, tool results cleared), one per log entry of the
    sidecar's, numbered by the entry's place among them. Stored as a JSON object of these fields,
    ``removed_event_ids`` under "removed" and ``summarised_by`` under "by"."""

    index: int
    task_id: str
    iteration: int
    recorded_ms: int
    seq: int  # its log entry's
    kind: str  # "summary" or "cleared"
    removed_event_ids: tuple[str, ...]  # a summary's replaced turns, the cleared results' ids
    summary_ref: str  # "" for a clearing
    tokens_before: int
    tokens_after: int
    summarised_by: str  # "host", "plugin", "built-in" or "replay"

    def encode(self) -> bytes:
        return dump_plain_json({
            "index": self.index, "task_id": self.task_id, "iteration": self.iteration,
            "recorded_ms": self.recorded_ms, "seq": self.seq, "kind": self.kind, "removed": self.removed_event_ids,
            "summary_ref": self.summary_ref, "tokens_before": self.tokens_before, "tokens_after": self.tokens_after,
            "by": self.summarised_by})

    @classmethod
    def from_json(cls, value: dict) -> CompactionRecord:
        # Records made before clearings existed were all summaries, and say no kind.
        return cls(value["index"], value["task_id"], value["iteration"], value["recorded_ms"], value["seq"],
                   value.get("kind", "summary"), tuple(value["removed"]), value["summary_ref"],
                   value["tokens_before"], value["tokens_after"], value["by"])

    @classmethod
    def parse(cls, data: bytes) -> CompactionRecord:
        return cls.from_json(load_plain_json(data))


def put_compaction_record(txn: Txn, db: dict, key: bytes, record: CompactionRecord) -> None:
    txn.put(numbered_key(key, record.index), record.encode(), db=db["compaction_records"])


def compaction_records(txn: Txn, db: dict, key: bytes, from_index: int, limit: int) -> list[CompactionRecord]:
    """The run's compaction records from ``from_index``: at most ``limit``, and no more than a
    page's bytes (measured as JSON, longer than the answer's protobuf: a record lists ids)."""
    found = records_under(txn, db["compaction_records"], key, be32(from_index))
    values = [load_plain_json(value) for _, value in islice(found, limit)]
    values, _ = page_within_bytes(values, lambda value: len(json.dumps(value)))
    return [CompactionRecord.from_json(value) for value in values]


def copy_compaction_records(txn: Txn, db: dict, source_key: bytes, fork_key: bytes, from_seq: int) -> None:
    """The source's compaction records of the log entries below ``from_seq``, under the fork's key."""
    copy_under(txn, db["compaction_records"], source_key, fork_key,
               lambda _, value: CompactionRecord.parse(value).seq < from_seq)


# -- fed forms ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class FedForm:
    """What event ``seq`` is fed as, from the assembly that made it on (``clearing``). Stored
    under (seq, made_at) as JSON: kind, text, tokens, original_tokens and the iteration of the
    assembly that made it."""

    seq: int
    made_at: int  # the run's next seq then (a clearing's: its log entry's seq); orders an event's forms
    kind: str  # "cleared" or "clipped"
    text: str
    tokens: int
    original_tokens: int  # the event content's own count

    def as_event(self, event: StoredEvent) -> StoredEvent:
        return replace(event, content=self.text, tokens=self.tokens)


_MEMOISED_FORM_BYTES = 4096  # a placeholder's form is ~250 bytes; a clip's can be half the budget


def _parse_form(key: bytes, stored_key: bytes, value: bytes, parsed: Cache) -> FedForm:
    """A stored form, parsed (``parsed``: :data:`PARSED_FORMS`, fetched once per read)."""
    suffix = stored_key[len(key):]
    if len(value) > _MEMOISED_FORM_BYTES:
        return _form_of(suffix, value)
    form = parsed.get((suffix, value))
    if form is None:
        form = _form_of(suffix, value)
        parsed.put((suffix, value), form, 4 * len(value))
    return form


def _form_of(suffix: bytes, value: bytes) -> FedForm:
    fields = load_plain_json(value)
    return FedForm(int.from_bytes(suffix[:4], "big"), int.from_bytes(suffix[4:8], "big"), fields["kind"],
                   fields["text"], fields["tokens"], fields["original_tokens"])


# Every turn reads the forms of its whole window (a cleared run's window is mostly placeholders),
# and a stored form is a pure function of its bytes: the parse of the small ones is kept by them,
# never stale whatever is deleted, forked or written again under the same key.
PARSED_FORMS = CacheSpec(
    "parsed_forms", key="a fed form's key suffix (seq, made_at) and its bytes, up to 4 KiB",
    valid="a parse is a pure function of the bytes", max_bytes=8 << 20)


def current_forms(txn: Txn, db: dict, key: bytes, start: int, end: int) -> dict[int, FedForm]:
    """The newest form of each event of ``[start, end)`` that has one, by seq."""
    forms: dict[int, FedForm] = {}
    parsed = cache_of(PARSED_FORMS)
    for suffix, value in records_under(txn, db["fed_forms"], key, be32(start)):
        if int.from_bytes(suffix[:4], "big") >= end:
            break
        form = _parse_form(key, key + suffix, value, parsed)
        forms[form.seq] = form  # keys ascend by (seq, made_at): the last one of a seq is its newest
    return forms


def forms_listed(txn: Txn, db: dict, key: bytes, listed: list[list[int]]) -> list[FedForm]:
    """The forms a window record lists as [seq, made_at] pairs, in one C-level pass."""
    if not listed:
        return []
    found = _cursor(txn, db["fed_forms"]).getmulti([form_key(key, seq, made_at) for seq, made_at in listed])
    parsed = cache_of(PARSED_FORMS)
    return [_parse_form(key, stored_key, value, parsed) for stored_key, value in found]


def forms_below(txn: Txn, db: dict, key: bytes, end: int) -> Iterator[tuple[FedForm, bytes]]:
    """Every form of the events below ``end``, in key order, with its stored value."""
    parsed = cache_of(PARSED_FORMS)
    for suffix, value in records_under(txn, db["fed_forms"], key):
        if int.from_bytes(suffix[:4], "big") >= end:
            return
        yield _parse_form(key, key + suffix, value, parsed), value


def made_in(value: bytes) -> int:
    """The iteration of the assembly that made a stored form."""
    return load_plain_json(value)["iteration"]


def put_form(txn: Txn, db: dict, key: bytes, form: FedForm, iteration: int) -> None:
    txn.put(form_key(key, form.seq, form.made_at), dump_plain_json({
        "kind": form.kind, "text": form.text, "tokens": form.tokens, "original_tokens": form.original_tokens,
        "iteration": iteration}), db=db["fed_forms"])


def copy_form(txn: Txn, db: dict, key: bytes, form: FedForm, value: bytes) -> None:
    """Put a form (as another run stores it) under ``key``."""
    txn.put(form_key(key, form.seq, form.made_at), value, db=db["fed_forms"])


# -- a replay fork's pending records -------------------------------------------------------------

def put_replay(txn: Txn, db: dict, key: bytes, seq: int, data: bytes) -> None:
    txn.put(numbered_key(key, seq), data, db=db["replay"])


def first_replay(txn: Txn, db: dict, key: bytes) -> tuple[int, bytes] | None:
    """The replay fork's first pending record: (its seq, its value); None when none is left."""
    cursor = _cursor(txn, db["replay"])
    if not cursor.set_range(key) or not cursor.key().startswith(key):
        return None
    return int.from_bytes(cursor.key()[len(key):], "big"), cursor.value()


def delete_replay(txn: Txn, db: dict, key: bytes, seq: int) -> None:
    txn.delete(numbered_key(key, seq), db=db["replay"])


def drop_replay(txn: Txn, db: dict, key: bytes) -> None:
    """Delete every pending record of the replay fork."""
    cursor = _cursor(txn, db["replay"])
    if cursor.set_range(key):
        while cursor.key().startswith(key):
            if not cursor.delete():
                break
