"""Agent memory (RFC 0004/0068 MemoryAdapter, RFC 0113 injection budget), one tenant at a time.

``Memories`` is the API: it validates and redacts what a put brings, keeps the entries, and answers
gets and lists, updating the ranking index (``index.MemoryIndex``) in the same transaction as each
put and delete. How the entries and the index are stored is ``schema``'s business.
"""

from __future__ import annotations

import math
import re
import secrets
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from sidecar.errors import NotFound, ValidationError
from sidecar.memory.index import MemoryIndex, terms
from sidecar.memory.schema import U16_MAX, CompactionRecord, Doc, MemoryDatabases, Meta, PreparedEntry, alive
from sidecar.settings import MemorySettings
from sidecar.storage.codec import StoredMemory, decode_memory, memory_content
from sidecar.storage.environment import Store
from sidecar.storage.keys import Txn, scope
from sidecar.text.counting import Counters, TokenCounter
from sidecar.text.redaction import Redactor, refuse_secrets
from sidecar.validation import check_at_least, check_at_most, check_id, check_text_bytes, page_within_bytes

MAX_REF_BYTES = 256
_REF = re.compile(r"^[A-Za-z0-9_.:/@-]+$")
MAX_TAGS = 32
MAX_TAG_BYTES = 64
MAX_EMBEDDING_DIM = 4096
# 100 years of 365 days: any real retention fits, and every expiry stays a valid protobuf
# Timestamp (before the year 10000) and a 64-bit count of milliseconds.
MAX_TTL_SECONDS = 100 * 365 * 24 * 3600
RANKS = ("recency", "relevance")


def check_ref(memory_ref: str, field: str = "memory_ref") -> bytes:
    encoded = memory_ref.encode("utf-8")
    if not memory_ref:
        raise ValidationError.field(field, "is required")
    if len(encoded) > MAX_REF_BYTES:
        raise ValidationError.field(field, f"is {len(encoded)} bytes; at most {MAX_REF_BYTES} are allowed")
    if not _REF.match(memory_ref):
        raise ValidationError.field(field, "may hold only A-Z a-z 0-9 _ . : / @ -")
    if ".." in re.split(r"[/:]", memory_ref):
        raise ValidationError.field(field, "may not have a '..' segment")
    return encoded


@dataclass(frozen=True, slots=True)
class PutResult:
    entry_id: str
    tokens: int
    redacted_secret_ids: tuple[str, ...]
    replaced: bool


@dataclass(frozen=True, slots=True)
class Source:
    """An entry about to be compacted, as it was read."""

    entry_id: str
    ordinal: int
    content: str
    tags: tuple[str, ...]
    terms: Counter


@dataclass(frozen=True, slots=True)
class MemoryList:
    token_counter: str
    rank: str
    records: list[bytes]  # the entries as stored (MemoryEntry on the wire), in ranked order
    scores: list[float] | None  # per entry, in relevance answers
    tokens_used: int
    left_out_for_budget: int
    left_out_for_size: int = 0  # chosen, but past the answer's byte bound

    def entries(self) -> list[StoredMemory]:
        """The entries answered, decoded, in ranked order."""
        return [decode_memory(record) for record in self.records]


@dataclass(frozen=True, slots=True)
class RefOverview:
    """A memory ref of a tenant, in brief: what GetMemory and ListMemory would find in it now."""

    memory_ref: str
    entries: int  # live entries (an expired one is never answered, even before a write purges it)
    tokens: int  # theirs, in the memory's counter
    compactions: int  # recorded in the ref


@dataclass(frozen=True, slots=True)
class EntriesPage:
    """A page of a ref's live entries, newest first, with the ref's totals."""

    entries: list[StoredMemory]
    total: int  # live entries in the ref
    tokens: int  # their tokens
    compactions: list[CompactionRecord]  # recorded in the ref, newest first


@dataclass
class ListRequest:
    memory_ref: str
    limit: int = 0
    tag: str = ""
    token_budget: int | None = None
    rank: str = ""
    query: str = ""
    query_embedding: Sequence[float] = field(default_factory=list)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Memories:
    """The memory API over every tenant's memory refs. A put or delete is one transaction that first
    removes the ref's expired entries, then changes its entries and the index with them."""

    def __init__(self, store: Store, counters: Counters, settings: MemorySettings, redactor: Redactor,
                 clock: Callable[[], int] = _now_ms) -> None:
        self._clock = clock  # milliseconds since the epoch
        self._store = store
        self._db = MemoryDatabases(store)
        self._index = MemoryIndex(self._db)
        self._counter = counters.get(settings.token_counter)
        self._settings = settings
        self._redactor = redactor

    @property
    def token_counter(self) -> str:
        return self._counter.name

    @property
    def counter(self) -> TokenCounter:
        return self._counter

    # -- writes -------------------------------------------------------------------------------

    def prepare(self, tenant: str, content: str, tags: Sequence[str] = (), ttl_seconds: int = 0,
                entry_id: str = "", embedding: Sequence[float] = (),
                content_field: str = "content") -> PreparedEntry:
        """Validate, redact (SR-1: before anything is counted or stored), count and index an entry,
        all outside any transaction. ``content_field`` names the content in errors, as the caller sent it."""
        check_text_bytes(content_field, content, self._settings.max_entry_bytes, "[memory] max_entry_bytes")
        if len(tags) > MAX_TAGS:
            raise ValidationError.field("tags", f"at most {MAX_TAGS} tags are allowed")
        for i, tag in enumerate(tags):
            check_id(f"tags[{i}]", tag, max_bytes=MAX_TAG_BYTES)
        # A tag is an identifier (matched, keyed and answered as it is): one holding a secret is
        # refused, never redacted.
        refuse_secrets(lambda text: self.redact(tenant, text), [(f"tags[{i}]", tag) for i, tag in enumerate(tags)])
        check_at_least("ttl_seconds", ttl_seconds, 0)
        check_at_most("ttl_seconds", ttl_seconds, MAX_TTL_SECONDS, "100 years")
        entry_id = entry_id or f"mem_{secrets.token_hex(8)}"
        check_id("entry_id", entry_id)
        vector = self._check_embedding("embedding", embedding)
        redacted = self._redactor.redact(tenant, "", content)
        tokens = self._counter.count(redacted.text)
        now = self._clock()
        expires = now + ttl_seconds * 1000 if ttl_seconds else 0
        entry_terms = Counter(terms(redacted.text))
        return PreparedEntry(entry_id, redacted.text, tuple(tags), tokens, now, expires, entry_terms,
                             min(sum(entry_terms.values()), U16_MAX), vector, len(embedding), redacted.secret_ids)

    def put(self, tenant: str, memory_ref: str, content: str, tags: Sequence[str] = (), ttl_seconds: int = 0,
            entry_id: str = "", embedding: Sequence[float] = ()) -> PutResult:
        key = scope(tenant, check_ref(memory_ref))
        entry = self.prepare(tenant, content, tags, ttl_seconds, entry_id, embedding)

        def write(txn: Txn) -> bool:
            meta = self._db.meta(txn, key)
            self._purge_expired(txn, key, meta, entry.created_ms)
            replaced = self._remove(txn, key, meta, entry.entry_id)
            self._insert(txn, key, meta, entry)
            self._db.put_meta(txn, key, meta)
            return replaced

        replaced = self._store.write(write)
        return PutResult(entry.entry_id, entry.tokens, entry.secret_ids, replaced)

    def redact(self, tenant: str, text: str) -> str:
        """The text as a put would store it today (SR-1), e.g. a source stored before a secret in it
        was registered."""
        return self._redactor.redact(tenant, "", text).text

    def _insert(self, txn: Txn, key: bytes, meta: Meta, entry: PreparedEntry) -> None:
        """Store a prepared entry as the ref's newest, indexed; the caller saves ``meta``."""
        ordinal = meta.next_ordinal
        self._index.add(txn, key, meta, ordinal, entry)
        meta.next_ordinal += 1
        self._db.put_entry(txn, key, ordinal, entry)

    def _check_embedding(self, field: str, embedding: Sequence[float]) -> bytes | None:
        if not embedding:
            return None
        if not self._settings.embeddings:
            raise ValidationError.field(field, "embeddings are off ([memory] embeddings)")
        if len(embedding) > MAX_EMBEDDING_DIM:
            raise ValidationError.field(field, f"has {len(embedding)} dimensions; at most {MAX_EMBEDDING_DIM}")
        if not all(math.isfinite(x) for x in embedding):
            raise ValidationError.field(field, "must hold finite numbers")
        return struct.pack(f"<{len(embedding)}f", *embedding)

    def _remove(self, txn: Txn, key: bytes, meta: Meta, entry_id: str) -> bool:
        """Take an existing entry out (its record, and from the index); False if none."""
        return bool(self._remove_many(txn, key, meta, [entry_id]))

    def _remove_many(self, txn: Txn, key: bytes, meta: Meta, entry_ids: Sequence[str],
                     known_terms: dict[str, Counter] | None = None) -> int:
        """Take existing entries out, and out of the index all at once. ``known_terms`` spares
        re-reading contents whose terms are known. Returns how many existed; the caller saves ``meta``."""
        removed = []
        for entry_id in entry_ids:
            stored = self._db.entry(txn, key, entry_id)
            if stored is None:
                continue
            ordinal, record = stored
            removed.append((ordinal, (known_terms or {}).get(entry_id) or Counter(terms(memory_content(record)))))
            self._db.delete_entry(txn, key, entry_id)
        self._index.remove(txn, key, meta, removed)
        return len(removed)

    def _purge_expired(self, txn: Txn, key: bytes, meta: Meta, now: int) -> None:
        """Remove the ref's entries whose expiry has come, one by one."""
        for entry_id in self._index.expired(txn, key, now):
            self._remove(txn, key, meta, entry_id)

    def delete(self, tenant: str, memory_ref: str, entry_id: str) -> None:
        key = scope(tenant, check_ref(memory_ref))
        check_id("entry_id", entry_id)
        now = self._clock()

        def write(txn: Txn) -> None:
            meta = self._db.meta(txn, key)
            self._purge_expired(txn, key, meta, now)
            if self._live_entry(txn, key, entry_id, now) is None:
                raise NotFound(f"memory entry {entry_id!r} not found")
            self._remove(txn, key, meta, entry_id)
            self._db.put_meta(txn, key, meta)

        self._store.write(write, frees_space=True)

    # -- what compaction needs ----------------------------------------------------------------

    @property
    def store(self) -> Store:
        return self._store

    def refs_over(self, min_entries: int) -> list[tuple[str, str]]:
        """(tenant, memory ref) of every ref holding more than ``min_entries`` entries."""
        with self._store.read() as txn:
            return [(tenant, ref) for tenant, ref, meta in self._db.refs(txn) if meta.live > min_entries]

    def oldest(self, txn: Txn, key: bytes, keep_recent: int, most: int) -> list[str]:
        """The ids of the oldest live entries beyond the newest ``keep_recent``, at most ``most``."""
        now = self._clock()
        live = [doc for doc in self._index.oldest_first(txn, key) if doc.live(now)]
        return [doc.entry_id for doc in live[:max(len(live) - keep_recent, 0)][:most]]

    def read_sources(self, txn: Txn, key: bytes, entry_ids: Sequence[str],
                     field: str = "source_ids") -> list[Source]:
        """The live entries named, oldest first as named; an absent or expired one is named in the error."""
        now = self._clock()
        sources = []
        for i, entry_id in enumerate(entry_ids):
            found = self._live_entry(txn, key, entry_id, now)
            if found is None:
                raise ValidationError.field(f"{field}[{i}]", f"{entry_id!r} is not a live entry of this memory_ref")
            ordinal, record, doc = found
            content = memory_content(record)
            sources.append(Source(entry_id, ordinal, content, doc.tags, Counter(terms(content))))
        return sources

    def ordinal_of(self, txn: Txn, key: bytes, entry_id: str) -> int | None:
        stored = self._db.entry(txn, key, entry_id)
        return None if stored is None else stored[0]

    def replace(self, txn: Txn, key: bytes, sources: Sequence[Source], output: PreparedEntry) -> None:
        """In the caller's write transaction: take the sources out (their terms are known) and store
        ``output`` as the ref's newest, replacing an entry of its id as a put would."""
        meta = self._db.meta(txn, key)
        self._remove_many(txn, key, meta, [source.entry_id for source in sources],
                          {source.entry_id: source.terms for source in sources})
        self._remove_many(txn, key, meta, [output.entry_id])
        self._insert(txn, key, meta, output)
        self._db.put_meta(txn, key, meta)

    # -- reads --------------------------------------------------------------------------------

    def _live_entry(self, txn: Txn, key: bytes, entry_id: str, now: int) -> tuple[int, bytes, Doc] | None:
        """(ordinal, record, doc) of the entry; None when there is none or it expired (an expired
        entry never surfaces)."""
        stored = self._db.entry(txn, key, entry_id)
        if stored is None:
            return None
        ordinal, record = stored
        doc = self._db.doc(txn, key, ordinal)
        return (ordinal, record, doc) if doc.live(now) else None

    def get(self, tenant: str, memory_ref: str, entry_id: str) -> bytes:
        """The entry's record (a MemoryEntry on the wire)."""
        key = scope(tenant, check_ref(memory_ref))
        check_id("entry_id", entry_id)
        with self._store.read() as txn:
            found = self._live_entry(txn, key, entry_id, self._clock())
        if found is None:
            raise NotFound(f"memory entry {entry_id!r} not found")
        return found[1]

    def refs(self, tenant: str, skip: int = 0, limit: int = 100) -> tuple[list[RefOverview], int]:
        """Up to ``limit`` of the memory refs of ``tenant`` (those that ever held an entry), in
        byte order, after the first ``skip``, and how many there are. Each one's totals come from
        its docs (tokens and expiry, a few dozen bytes an entry), never its contents."""
        now = self._clock()
        with self._store.read() as txn:
            refs = list(self._db.refs_of(txn, tenant))
            overviews = []
            for ref in refs[skip:skip + limit]:
                key = scope(tenant, ref.encode("utf-8"))
                total, tokens, _ = self._live(txn, key, now)
                overviews.append(RefOverview(ref, total, tokens, len(self._db.compactions(txn, key))))
        return overviews, len(refs)

    def entries(self, tenant: str, memory_ref: str, skip: int = 0, limit: int = 100) -> EntriesPage:
        """Up to ``limit`` of the ref's live entries, newest first, after the first ``skip``; only
        those are read whole. NotFound: ``tenant`` has no such ref (another tenant's is one)."""
        key = scope(tenant, check_ref(memory_ref))
        now = self._clock()
        with self._store.read() as txn:
            if self._db.meta_record(txn, key) is None:
                raise NotFound(f"memory ref {memory_ref!r} not found")
            total, tokens, shown = self._live(txn, key, now, skip, limit)
            records = [decode_memory(self._db.entry_record(txn, key, entry_id)) for entry_id in shown]
            compactions = sorted(self._db.compactions(txn, key), key=lambda record: -record.seq)
        return EntriesPage(records, total, tokens, compactions)

    def _live(self, txn: Txn, key: bytes, now: int, skip: int = 0, limit: int = 0) -> tuple[int, int, list[str]]:
        """The ref's live entries and their tokens, and the ids of ``limit`` of them, newest first,
        after the first ``skip``."""
        total = tokens = 0
        shown = []
        for ordinal, entry_tokens, expires_ms in self._db.sizes_newest_first(txn, key):
            if alive(expires_ms, now):
                if skip <= total < skip + limit:
                    shown.append(ordinal)
                total += 1
                tokens += entry_tokens
        return total, tokens, [self._db.doc(txn, key, ordinal).entry_id for ordinal in shown]

    def list(self, tenant: str, request: ListRequest) -> MemoryList:
        check_at_least("limit", request.limit, 0)
        if request.token_budget is not None:
            check_at_least("token_budget", request.token_budget, 1)
        rank = request.rank or "recency"
        if rank not in RANKS:
            raise ValidationError.field("rank", f"must be one of {', '.join(RANKS)}")
        if rank == "relevance" and not request.query:
            raise ValidationError.field("query", "is required when rank is relevance")
        query_vector = self._check_embedding("query_embedding", request.query_embedding)
        empty = MemoryList(self.token_counter, rank, [], [] if rank == "relevance" else None, 0, 0)
        try:
            key = scope(tenant, check_ref(request.memory_ref))
        except ValidationError:
            return empty  # CTI-1: a malformed ref is answered like an unknown one, not told apart
        now = self._clock()
        with self._store.read() as txn:
            meta = self._db.meta(txn, key)
            if not meta.live:
                return empty
            if query_vector is not None and meta.dim and meta.dim != len(request.query_embedding):
                raise ValidationError.field("query_embedding", f"has {len(request.query_embedding)} dimensions; this "
                                            f"memory_ref's entries have {meta.dim}")
            ranked: Iterator[tuple[Doc, float | None]]
            if rank == "recency":
                ranked = ((doc, None) for doc in self._index.newest_first(txn, key))
            else:
                ranked = self._index.by_relevance(txn, key, meta, request.query, query_vector)
            selected, scores, used, left_out = _walk(ranked, request, now)
            # Read one by one, so a walk with no count or token bound reads no more than the
            # answer's bytes allow.
            records, _ = page_within_bytes(self._db.entry_record(txn, key, doc.entry_id) for doc in selected)
        if len(records) < len(selected):
            used -= sum(doc.tokens for doc in selected[len(records):])
            scores = scores[:len(records)]
        return MemoryList(self.token_counter, rank, records, scores if rank == "relevance" else None, used, left_out,
                          len(selected) - len(records))


def _walk(ranked: Iterator[tuple[Doc, float | None]], request: ListRequest,
          now: int) -> tuple[list[Doc], list[float], int, int]:
    """RFC 0113: a prefix of the ranked list within the budget; an entry over the budget on
    its own is left out (never truncated); the walk stops at the first that does not fit."""
    budget = request.token_budget
    selected: list[Doc] = []
    scores: list[float] = []
    used = left_out = 0
    for doc, score in ranked:
        if not doc.live(now) or (request.tag and request.tag not in doc.tags):
            continue
        if budget is not None:
            if doc.tokens > budget:
                left_out += 1
                continue
            if used + doc.tokens > budget:
                left_out += 1
                break
        selected.append(doc)
        scores.append(score or 0.0)
        used += doc.tokens
        if request.limit and len(selected) == request.limit:
            break
    return selected, scores, used, left_out
