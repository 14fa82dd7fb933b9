"""Agent memory (RFC 0004/0068 MemoryAdapter, RFC 0113 injection budget), one tenant at a time.

Each memory ref keeps, under ``scope(tenant, ref)``:

- ``mem_entries``: entry id -> its ordinal and its record (``MemoryRecord``, which is, byte for
  byte, the API's ``MemoryEntry``, so answers are spliced from stored bytes);
- ``mem_docs``: ordinal -> what a ranked walk needs (tokens, expiry, tags, id) without reading
  the content. Ordinals grow with every put, so this index, read backwards, is the recency order;
- ``mem_df`` and ``mem_postings``: the inverted index for BM25, updated in the same transaction as
  each put and delete. A term's ``mem_df`` record holds its document frequency, how many of its
  postings (ordinal, tf, dl) are sealed, and its open chunk of up to ``POSTINGS_PER_CHUNK``; a full
  open chunk is appended to the term's current segment in ``mem_postings`` (up to
  ``POSTINGS_PER_SEGMENT``). So a put touches one small record per term, and a query reads a
  common term's postings in a few large values rather than hundreds of small ones;
- ``mem_vectors``: ordinal -> embedding, when the host sends one;
- ``mem_expiry``: (expiry, ordinal) -> entry id, for the entries with a TTL. Every write to a ref
  first removes its entries whose time has come, so the BM25 statistics count only live
  entries (an entry that expires between writes is already never returned, but still counted
  until the next write);
- ``mem_meta``: the next ordinal, the live entries, their total length, the embedding dimension.

A deleted, replaced, expired or compacted entry's document frequencies and length are taken out
at once, so the BM25 statistics are exact. Its postings are reclaimed too, so that no term (a
late-registered secret's, say) outlives every entry that held it: a term whose last live entry
goes loses its ``mem_df`` record and its segments in the same transaction; a term whose dead
postings outnumber its live ones has its postings rewritten without them. A term therefore keeps
at most twice the postings of its live entries, and a rewrite of P postings follows at least P/2
removals, so reclaiming costs a constant per removal, amortised. Until then a ranked walk skips
the dead ordinals (no longer in ``mem_docs``).
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

import lmdb

import fastcore
from sidecar.errors import NotFound, ValidationError
from sidecar.settings import MemorySettings
from sidecar.storage.codec import dump_json, encode_memory, load_json, memory_content
from sidecar.storage.environment import Store
from sidecar.storage.keys import be32, records_under, scope
from sidecar.text.counting import Counters, TokenCounter
from sidecar.text.redaction import Redactor, refuse_secrets
from sidecar.validation import check_at_least, check_at_most, check_id, check_text_bytes, page_within_bytes

MAX_REF_BYTES = 256
_REF = re.compile(r"^[A-Za-z0-9_.:/@-]+$")
_TERM = re.compile(r"\w+")
MAX_TERM_BYTES = 64
MAX_TAGS = 32
MAX_TAG_BYTES = 64
MAX_EMBEDDING_DIM = 4096
# 100 years of 365 days: any real retention fits, and every expiry stays a valid protobuf
# Timestamp (before the year 10000) and a 64-bit count of milliseconds.
MAX_TTL_SECONDS = 100 * 365 * 24 * 3600
POSTINGS_PER_CHUNK = 128  # 1 KiB: a term's record with its open chunk stays inline in a leaf page
POSTINGS_PER_SEGMENT = 8192  # 64 KiB sealed segments: 100k postings are ~13 reads
BM25_K1, BM25_B = 1.2, 0.75
RRF_K = 60  # reciprocal rank fusion's usual constant
RANKS = ("recency", "relevance")
_DOC = struct.Struct("<IqqH")  # tokens, created ms, expires ms (0: never), id length; then id, tags
_POSTING = struct.Struct("<IHH")  # ordinal, tf, dl
_TERM_HEAD = struct.Struct("<II")  # df, sealed postings; the open chunk follows
_U16_MAX = 0xFFFF


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


def terms(text: str) -> list[str]:
    """BM25 terms: lower-cased Unicode word runs (no stemming) of at most MAX_TERM_BYTES in
    UTF-8. (Only a term over 16 characters can be that long, so only those get encoded here;
    the index encodes each distinct term once.)"""
    return [t for t in _TERM.findall(text.lower()) if len(t) <= 16 or len(t.encode("utf-8")) <= MAX_TERM_BYTES]


@dataclass(frozen=True, slots=True)
class PutResult:
    entry_id: str
    tokens: int
    redacted_secret_ids: tuple[str, ...]
    replaced: bool


@dataclass(frozen=True, slots=True)
class PreparedEntry:
    """An entry ready to store: redacted, counted, its terms known."""

    entry_id: str
    content: str
    tags: tuple[str, ...]
    tokens: int
    created_ms: int
    expires_ms: int
    terms: Counter
    length: int
    vector: bytes | None
    dim: int
    secret_ids: tuple[str, ...]


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


@dataclass(slots=True)
class _Meta:
    next_ordinal: int = 0
    live: int = 0
    total_length: int = 0
    dim: int = 0

    @classmethod
    def load(cls, data: bytes | None) -> _Meta:
        return cls(**load_json(data)) if data else cls()

    def record(self) -> bytes:
        return dump_json({name: getattr(self, name) for name in self.__slots__})


@dataclass(frozen=True, slots=True)
class _Doc:
    ordinal: int
    entry_id: str
    tokens: int
    expires_ms: int
    tags: tuple[str, ...]

    @staticmethod
    def pack(entry_id: str, tokens: int, created_ms: int, expires_ms: int, tags: Sequence[str]) -> bytes:
        encoded = entry_id.encode("utf-8")
        return _DOC.pack(tokens, created_ms, expires_ms, len(encoded)) + encoded + "\0".join(tags).encode("utf-8")

    @classmethod
    def unpack(cls, ordinal: int, data: bytes) -> _Doc:
        tokens, _, expires_ms, id_len = _DOC.unpack_from(data)
        at = _DOC.size + id_len
        tags = data[at:].decode("utf-8")
        return cls(ordinal, data[_DOC.size:at].decode("utf-8"), tokens, expires_ms, tuple(tags.split("\0")) if tags else ())

    def live(self, now_ms: int) -> bool:
        return not self.expires_ms or self.expires_ms > now_ms


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
    def __init__(self, store: Store, counters: Counters, settings: MemorySettings, redactor: Redactor,
                 clock: Callable[[], int] = _now_ms) -> None:
        self._clock = clock  # milliseconds since the epoch
        self._store = store
        self._db = store.handles("memory")
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
                             min(sum(entry_terms.values()), _U16_MAX), vector, len(embedding), redacted.secret_ids)

    def put(self, tenant: str, memory_ref: str, content: str, tags: Sequence[str] = (), ttl_seconds: int = 0,
            entry_id: str = "", embedding: Sequence[float] = ()) -> PutResult:
        key = scope(tenant, check_ref(memory_ref))
        entry = self.prepare(tenant, content, tags, ttl_seconds, entry_id, embedding)

        def write(txn: lmdb.Transaction) -> bool:
            meta = _Meta.load(txn.get(key, db=self._db["mem_meta"]))
            self._purge_expired(txn, key, meta, entry.created_ms)
            replaced = self._remove(txn, key, meta, entry.entry_id)
            self.insert(txn, key, meta, entry)
            txn.put(key, meta.record(), db=self._db["mem_meta"])
            return replaced

        replaced = self._store.write(write)
        return PutResult(entry.entry_id, entry.tokens, entry.secret_ids, replaced)

    def redact(self, tenant: str, text: str) -> str:
        """The text as a put would store it today (SR-1), e.g. a source stored before a secret in it
        was registered."""
        return self._redactor.redact(tenant, "", text).text

    def insert(self, txn: lmdb.Transaction, key: bytes, meta: _Meta, entry: PreparedEntry) -> None:
        """Store a prepared entry as the ref's newest, indexed; the caller saves ``meta``."""
        if entry.vector is not None:
            if meta.dim and meta.dim != entry.dim:
                raise ValidationError.field("embedding", f"has {entry.dim} dimensions; this memory_ref's "
                                            f"entries have {meta.dim}")
            meta.dim = entry.dim
        ordinal = meta.next_ordinal
        meta.next_ordinal += 1
        meta.live += 1
        meta.total_length += entry.length
        record = encode_memory(entry.entry_id, entry.content, entry.tags, entry.created_ms, entry.expires_ms,
                               entry.tokens)
        txn.put(key + entry.entry_id.encode("utf-8"), be32(ordinal) + record, db=self._db["mem_entries"])
        txn.put(key + be32(ordinal), _Doc.pack(entry.entry_id, entry.tokens, entry.created_ms, entry.expires_ms,
                                               entry.tags), db=self._db["mem_docs"])
        if entry.expires_ms:
            txn.put(key + entry.expires_ms.to_bytes(8, "big") + be32(ordinal), entry.entry_id.encode("utf-8"),
                    db=self._db["mem_expiry"])
        if entry.vector is not None:
            txn.put(key + be32(ordinal), entry.vector, db=self._db["mem_vectors"])
        for term, tf in entry.terms.items():
            self._post(txn, key, term, _POSTING.pack(ordinal, min(tf, _U16_MAX), entry.length))

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

    def _post(self, txn: lmdb.Transaction, key: bytes, term: str, posting: bytes) -> None:
        """Add one posting to the term's open chunk (sealing it when full) and count the entry in its df."""
        term_key = key + term.encode("utf-8") + b"\0"
        stored = txn.get(term_key, db=self._db["mem_df"])
        df, sealed = _TERM_HEAD.unpack_from(stored) if stored else (0, 0)
        open_chunk = (stored[_TERM_HEAD.size:] if stored else b"") + posting
        if len(open_chunk) == POSTINGS_PER_CHUNK * _POSTING.size:
            segment_key = term_key + be32(sealed // POSTINGS_PER_SEGMENT)
            segment = txn.get(segment_key, b"", db=self._db["mem_postings"])
            txn.put(segment_key, segment + open_chunk, db=self._db["mem_postings"])
            sealed, open_chunk = sealed + POSTINGS_PER_CHUNK, b""
        txn.put(term_key, _TERM_HEAD.pack(df + 1, sealed) + open_chunk, db=self._db["mem_df"])

    def _remove(self, txn: lmdb.Transaction, key: bytes, meta: _Meta, entry_id: str) -> bool:
        """Take an existing entry out (its doc, vector, df counts and length); False if none."""
        return bool(self.remove_many(txn, key, meta, [entry_id]))

    def remove_many(self, txn: lmdb.Transaction, key: bytes, meta: _Meta, entry_ids: Sequence[str],
                    known_terms: dict[str, Counter] | None = None) -> int:
        """Take existing entries out; each term's df is updated once for all of them (a compaction
        removes hundreds). ``known_terms`` spares re-reading contents whose terms are known.
        Returns how many existed; the caller saves ``meta``."""
        decrements: Counter = Counter()
        removed = 0
        for entry_id in entry_ids:
            stored = txn.get(key + entry_id.encode("utf-8"), db=self._db["mem_entries"])
            if stored is None:
                continue
            ordinal_key = stored[:4]
            doc = _Doc.unpack(0, txn.get(key + ordinal_key, db=self._db["mem_docs"]))
            if doc.expires_ms:
                txn.delete(key + doc.expires_ms.to_bytes(8, "big") + ordinal_key, db=self._db["mem_expiry"])
            old_terms = (known_terms or {}).get(entry_id) or Counter(terms(memory_content(stored[4:])))
            decrements.update(old_terms.keys())
            meta.live -= 1
            meta.total_length -= min(sum(old_terms.values()), _U16_MAX)
            txn.delete(key + entry_id.encode("utf-8"), db=self._db["mem_entries"])
            txn.delete(key + ordinal_key, db=self._db["mem_docs"])
            txn.delete(key + ordinal_key, db=self._db["mem_vectors"])
            removed += 1
        for term, count in decrements.items():
            self._discount(txn, key, term, count)
        return removed

    def _discount(self, txn: lmdb.Transaction, key: bytes, term: str, removed: int) -> None:
        """Take ``removed`` entries (already out of ``mem_docs``) out of a term's df, reclaiming
        its dead postings as the module docstring says."""
        term_key = key + term.encode("utf-8") + b"\0"
        stored = txn.get(term_key, db=self._db["mem_df"])
        df, sealed = _TERM_HEAD.unpack_from(stored)
        df -= removed
        open_chunk = stored[_TERM_HEAD.size:]
        segments = -(-sealed // POSTINGS_PER_SEGMENT)
        if df <= 0:  # no live entry holds the term any more: nothing of it stays
            txn.delete(term_key, db=self._db["mem_df"])
            for segment in range(segments):
                txn.delete(term_key + be32(segment), db=self._db["mem_postings"])
            return
        dead = sealed + len(open_chunk) // _POSTING.size - df
        if dead <= df:
            txn.put(term_key, _TERM_HEAD.pack(df, sealed) + open_chunk, db=self._db["mem_df"])
            return
        postings = b"".join(txn.get(term_key + be32(segment), db=self._db["mem_postings"])
                            for segment in range(segments)) + open_chunk
        ordinals = [ordinal for ordinal, _, _ in _POSTING.iter_unpack(postings)]
        live = {doc_key[len(key):] for doc_key, _ in txn.cursor(db=self._db["mem_docs"]).getmulti(
            [key + be32(ordinal) for ordinal in ordinals])}
        kept = b"".join(postings[i * _POSTING.size:(i + 1) * _POSTING.size]
                        for i, ordinal in enumerate(ordinals) if be32(ordinal) in live)
        count = len(kept) // _POSTING.size
        # Sealed postings stay whole chunks, so the next full open chunk lands where _post expects it.
        new_sealed = count - count % POSTINGS_PER_CHUNK
        new_segments = -(-new_sealed // POSTINGS_PER_SEGMENT)
        for segment in range(new_segments):
            end = min((segment + 1) * POSTINGS_PER_SEGMENT, new_sealed)
            txn.put(term_key + be32(segment), kept[segment * POSTINGS_PER_SEGMENT * _POSTING.size:end * _POSTING.size],
                    db=self._db["mem_postings"])
        for segment in range(new_segments, segments):
            txn.delete(term_key + be32(segment), db=self._db["mem_postings"])
        txn.put(term_key, _TERM_HEAD.pack(df, new_sealed) + kept[new_sealed * _POSTING.size:], db=self._db["mem_df"])

    def _purge_expired(self, txn: lmdb.Transaction, key: bytes, meta: _Meta, now: int) -> None:
        """Remove the ref's entries whose expiry has come (oldest expiry first, stop at the first
        still alive): the work is the entries removed, not the entries kept."""
        expired = []
        for expiry, entry_id in records_under(txn, self._db["mem_expiry"], key):
            if int.from_bytes(expiry[:8], "big") > now:
                break
            expired.append(entry_id.decode("utf-8"))
        for entry_id in expired:
            self._remove(txn, key, meta, entry_id)

    def delete(self, tenant: str, memory_ref: str, entry_id: str) -> None:
        key = scope(tenant, check_ref(memory_ref))
        check_id("entry_id", entry_id)
        now = self._clock()

        def write(txn: lmdb.Transaction) -> None:
            meta = _Meta.load(txn.get(key, db=self._db["mem_meta"]))
            self._purge_expired(txn, key, meta, now)
            if self._live_entry(txn, key, entry_id, now) is None:
                raise NotFound(f"memory entry {entry_id!r} not found")
            self._remove(txn, key, meta, entry_id)
            txn.put(key, meta.record(), db=self._db["mem_meta"])

        self._store.write(write, frees_space=True)

    # -- what compaction needs ----------------------------------------------------------------

    @property
    def store(self) -> Store:
        return self._store

    def load_meta(self, txn: lmdb.Transaction, key: bytes) -> _Meta:
        return _Meta.load(txn.get(key, db=self._db["mem_meta"]))

    def save_meta(self, txn: lmdb.Transaction, key: bytes, meta: _Meta) -> None:
        txn.put(key, meta.record(), db=self._db["mem_meta"])

    def refs_over(self, min_entries: int) -> list[tuple[str, str]]:
        """(tenant, memory ref) of every ref holding more than ``min_entries`` entries."""
        found = []
        with self._store.read() as txn:
            for key, value in txn.cursor(db=self._db["mem_meta"]):
                if _Meta.load(value).live > min_entries:
                    tenant, ref = key.decode("utf-8").split("\0")[:2]
                    found.append((tenant, ref))
        return found

    def oldest(self, txn: lmdb.Transaction, key: bytes, keep_recent: int, most: int) -> list[str]:
        """The ids of the oldest live entries beyond the newest ``keep_recent``, at most ``most``."""
        now = self._clock()
        live = [doc for doc in self._oldest_first(txn, key) if doc.live(now)]
        return [doc.entry_id for doc in live[:max(len(live) - keep_recent, 0)][:most]]

    def _oldest_first(self, txn: lmdb.Transaction, key: bytes) -> Iterator[_Doc]:
        for ordinal, value in records_under(txn, self._db["mem_docs"], key):
            yield _Doc.unpack(int.from_bytes(ordinal, "big"), value)

    def read_sources(self, txn: lmdb.Transaction, key: bytes, entry_ids: Sequence[str],
                     field: str = "source_ids") -> list[Source]:
        """The live entries named, oldest first as named; an absent or expired one is named in the error."""
        now = self._clock()
        sources = []
        for i, entry_id in enumerate(entry_ids):
            stored = txn.get(key + entry_id.encode("utf-8"), db=self._db["mem_entries"])
            doc = _Doc.unpack(0, txn.get(key + stored[:4], db=self._db["mem_docs"])) if stored else None
            if doc is None or not doc.live(now):
                raise ValidationError.field(f"{field}[{i}]", f"{entry_id!r} is not a live entry of this memory_ref")
            content = memory_content(stored[4:])
            sources.append(Source(entry_id, int.from_bytes(stored[:4], "big"), content, doc.tags,
                                  Counter(terms(content))))
        return sources

    def ordinal_of(self, txn: lmdb.Transaction, key: bytes, entry_id: str) -> int | None:
        stored = txn.get(key + entry_id.encode("utf-8"), db=self._db["mem_entries"])
        return None if stored is None else int.from_bytes(stored[:4], "big")

    # -- reads --------------------------------------------------------------------------------

    def _live_entry(self, txn: lmdb.Transaction, key: bytes, entry_id: str, now: int) -> bytes | None:
        stored = txn.get(key + entry_id.encode("utf-8"), db=self._db["mem_entries"])
        if stored is None:
            return None
        doc = _Doc.unpack(0, txn.get(key + stored[:4], db=self._db["mem_docs"]))
        return stored[4:] if doc.live(now) else None  # an expired entry never surfaces

    def get(self, tenant: str, memory_ref: str, entry_id: str) -> bytes:
        """The entry's record (a MemoryEntry on the wire)."""
        key = scope(tenant, check_ref(memory_ref))
        check_id("entry_id", entry_id)
        with self._store.read() as txn:
            record = self._live_entry(txn, key, entry_id, self._clock())
        if record is None:
            raise NotFound(f"memory entry {entry_id!r} not found")
        return record

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
            meta = _Meta.load(txn.get(key, db=self._db["mem_meta"]))
            if not meta.live:
                return empty
            if query_vector is not None and meta.dim and meta.dim != len(request.query_embedding):
                raise ValidationError.field("query_embedding", f"has {len(request.query_embedding)} dimensions; this "
                                            f"memory_ref's entries have {meta.dim}")
            if rank == "recency":
                ranked: Iterator[tuple[_Doc, float | None]] = ((doc, None) for doc in self._newest_first(txn, key))
            else:
                ranked = self._by_relevance(txn, key, meta, request.query, query_vector)
            selected, scores, used, left_out = self._walk(ranked, request, now)
            # Read one by one, so a walk with no count or token bound reads no more than the
            # answer's bytes allow.
            records, _ = page_within_bytes(
                txn.get(key + doc.entry_id.encode("utf-8"), db=self._db["mem_entries"])[4:] for doc in selected)
        if len(records) < len(selected):
            used -= sum(doc.tokens for doc in selected[len(records):])
            scores = scores[:len(records)]
        return MemoryList(self.token_counter, rank, records, scores if rank == "relevance" else None, used, left_out,
                          len(selected) - len(records))

    @staticmethod
    def _walk(ranked: Iterator[tuple[_Doc, float | None]], request: ListRequest,
              now: int) -> tuple[list[_Doc], list[float], int, int]:
        """RFC 0113: a prefix of the ranked list within the budget; an entry over the budget on
        its own is left out (never truncated); the walk stops at the first that does not fit."""
        budget = request.token_budget
        selected: list[_Doc] = []
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

    def _newest_first(self, txn: lmdb.Transaction, key: bytes) -> Iterator[_Doc]:
        cursor = txn.cursor(db=self._db["mem_docs"])
        if not cursor.set_range(key + b"\xff\xff\xff\xff"):  # past the ref's last ordinal
            if not cursor.last():
                return
        elif not cursor.prev():
            return
        for doc_key, value in cursor.iterprev():
            if not doc_key.startswith(key):
                return
            yield _Doc.unpack(int.from_bytes(doc_key[len(key):], "big"), value)

    def _by_relevance(self, txn: lmdb.Transaction, key: bytes, meta: _Meta, query: str,
                      query_vector: bytes | None) -> Iterator[tuple[_Doc, float]]:
        """Lexical BM25, fused with cosine similarity when the query has an embedding. Lexical
        alone ranks in batches, deeper only when the walk wants more than a batch held."""
        # Cosine reads every vector anyway, so a fused ranking ranks everything at once.
        top = 128 if query_vector is None else meta.next_ordinal
        seen: set[int] = set()
        while True:
            rankings = [self._bm25(txn, key, meta, query, top)]
            if query_vector is not None:
                rankings.append(self._cosine(txn, key, query_vector, meta.dim, top))
            ranking = rankings[0] if len(rankings) == 1 else _fuse(rankings)
            fresh = [(ordinal, score) for ordinal, score in ranking if ordinal not in seen]
            docs = txn.cursor(db=self._db["mem_docs"]).getmulti([key + be32(o) for o, _ in fresh])
            by_ordinal = {int.from_bytes(k[len(key):], "big"): v for k, v in docs}
            for ordinal, score in fresh:
                seen.add(ordinal)
                if ordinal in by_ordinal:  # else gone: its posting waits for its term's next rewrite
                    yield _Doc.unpack(ordinal, by_ordinal[ordinal]), score
            if len(rankings[0]) < top or top >= meta.next_ordinal:
                return
            top *= 4

    def _bm25(self, txn: lmdb.Transaction, key: bytes, meta: _Meta, query: str, top: int) -> list[tuple[int, float]]:
        postings, idfs = [], []
        n = max(meta.live, 1)
        for term in dict.fromkeys(terms(query)):
            term_key = key + term.encode("utf-8") + b"\0"
            stored = txn.get(term_key, db=self._db["mem_df"])
            if not stored:
                continue
            df, sealed = _TERM_HEAD.unpack_from(stored)
            if df <= 0:
                continue
            segments = [value for _, value in txn.cursor(db=self._db["mem_postings"]).getmulti(
                [term_key + be32(segment) for segment in range(-(-sealed // POSTINGS_PER_SEGMENT))])]
            postings.append(b"".join(segments) + stored[_TERM_HEAD.size:])
            idfs.append(math.log(1 + (n - df + 0.5) / (df + 0.5)))
        if not postings:
            return []
        avgdl = max(meta.total_length / n, 1.0)
        return fastcore.bm25_top(postings, idfs, avgdl, BM25_K1, BM25_B, meta.next_ordinal, top)

    def _cosine(self, txn: lmdb.Transaction, key: bytes, query_vector: bytes, dim: int,
                top: int) -> list[tuple[int, float]]:
        ordinals, vectors = [], []
        # Every vector of the ref, so the loop is inline: store.records_under's generator and key
        # slicing would add ~40% to a scan of 100k of them.
        cursor = txn.cursor(db=self._db["mem_vectors"])
        if cursor.set_range(key):
            prefix = len(key)
            for vector_key, value in cursor:
                if not vector_key.startswith(key):
                    break
                ordinals.append(int.from_bytes(vector_key[prefix:], "big"))
                vectors.append(value)
        if not ordinals:
            return []
        packed = struct.pack(f"<{len(ordinals)}I", *ordinals)
        return fastcore.cosine_top(query_vector, b"".join(vectors), packed, dim, top)


def _fuse(rankings: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: each ranking adds 1 / (k + rank); ties to the newer entry."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, (ordinal, _) in enumerate(ranking, start=1):
            fused[ordinal] = fused.get(ordinal, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(fused.items(), key=lambda item: (-item[1], -item[0]))
