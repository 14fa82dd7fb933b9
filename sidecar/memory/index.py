"""The ranking index of a memory ref: its docs in recency order, the inverted index for BM25, the
embeddings for cosine similarity, and the expiry order. The API (``api.Memories``) keeps the
entries themselves and updates this index in the same transaction as each put and delete.

A term's ``mem_df`` record holds its document frequency, how many of its postings (ordinal, tf,
dl) are sealed, and its open chunk of up to ``POSTINGS_PER_CHUNK``; a full open chunk is appended
to the term's current segment in ``mem_postings`` (up to ``POSTINGS_PER_SEGMENT``). So a put
touches one small record per term, and a query reads a common term's postings in a few large
values rather than hundreds of small ones.

Every write to a ref first removes its entries whose time has come (``expired``), so the BM25
statistics count only live entries (an entry that expires between writes is already never
returned, but still counted until the next write). A deleted, replaced, expired or compacted
entry's document frequencies and length are taken out at once, so the BM25 statistics are exact.
Its postings are reclaimed too, so that no term (a late-registered secret's, say) outlives every
entry that held it: a term whose last live entry goes loses its ``mem_df`` record and its
segments in the same transaction; a term whose dead postings outnumber its live ones has its
postings rewritten without them. A term therefore keeps at most twice the postings of its live
entries, and a rewrite of P postings follows at least P/2 removals, so reclaiming costs a
constant per removal, amortised. Until then a ranked walk skips the dead ordinals (no longer in
``mem_docs``).
"""

from __future__ import annotations

import math
import re
import struct
from collections import Counter
from collections.abc import Iterator, Sequence

import fastcore
from sidecar.errors import ValidationError
from sidecar.memory.schema import POSTING, U16_MAX, Doc, MemoryDatabases, Meta, PreparedEntry, term_key
from sidecar.storage.keys import Txn

_TERM = re.compile(r"\w+")
MAX_TERM_BYTES = 64
# Part of the stored form: a term's postings are sealed and segmented by these counts, so a store
# written with other values reads wrongly.
POSTINGS_PER_CHUNK = 128  # 1 KiB: a term's record with its open chunk stays inline in a leaf page
POSTINGS_PER_SEGMENT = 8192  # 64 KiB sealed segments: 100k postings are ~13 reads
BM25_K1, BM25_B = 1.2, 0.75
FIRST_BATCH = 32  # entries a lexical ranking asks for first (by_relevance)
RRF_K = 60  # reciprocal rank fusion's usual constant


def terms(text: str) -> list[str]:
    """BM25 terms: lower-cased Unicode word runs (no stemming) of at most MAX_TERM_BYTES in
    UTF-8. (Only a term over 16 characters can be that long, so only those get encoded here;
    the index encodes each distinct term once.)"""
    return [t for t in _TERM.findall(text.lower()) if len(t) <= 16 or len(t.encode("utf-8")) <= MAX_TERM_BYTES]


class MemoryIndex:
    """What ranks a ref's entries and finds its expired ones. Each method works inside the
    caller's transaction on one ref's ``key``; the caller loads and saves its ``Meta``."""

    def __init__(self, databases: MemoryDatabases) -> None:
        self._db = databases

    # -- maintenance ----------------------------------------------------------------------------

    def add(self, txn: Txn, key: bytes, meta: Meta, ordinal: int, entry: PreparedEntry) -> None:
        """Index a new entry under ``ordinal``: its doc, expiry, vector and postings, and its share of
        the BM25 statistics. A vector of another dimension than the ref's is refused."""
        if entry.vector is not None:
            if meta.dim and meta.dim != entry.dim:
                raise ValidationError.field("embedding", f"has {entry.dim} dimensions; this memory_ref's "
                                            f"entries have {meta.dim}")
            meta.dim = entry.dim
        meta.live += 1
        meta.total_length += entry.length
        self._db.put_doc(txn, key, ordinal, entry)
        if entry.expires_ms:
            self._db.put_expiry(txn, key, entry.expires_ms, ordinal, entry.entry_id)
        if entry.vector is not None:
            self._db.put_vector(txn, key, ordinal, entry.vector)
        for term, tf in entry.terms.items():
            self._post(txn, key, term, POSTING.pack(ordinal, min(tf, U16_MAX), entry.length))

    def remove(self, txn: Txn, key: bytes, meta: Meta, removed: Sequence[tuple[int, Counter]]) -> None:
        """Take entries out, given as (ordinal, terms); each term's df is updated once for all of them
        (a compaction removes hundreds)."""
        decrements: Counter = Counter()
        for ordinal, old_terms in removed:
            doc = self._db.doc(txn, key, ordinal)
            if doc.expires_ms:
                self._db.delete_expiry(txn, key, doc.expires_ms, ordinal)
            decrements.update(old_terms.keys())
            meta.live -= 1
            meta.total_length -= min(sum(old_terms.values()), U16_MAX)
            self._db.delete_doc(txn, key, ordinal)
            self._db.delete_vector(txn, key, ordinal)
        for term, count in decrements.items():
            self._discount(txn, key, term, count)

    def expired(self, txn: Txn, key: bytes, now: int) -> list[str]:
        """The ids of the ref's entries whose expiry has come, oldest expiry first (the walk stops at
        the first still alive: the work is the entries expired, not the entries kept)."""
        expired = []
        for expiry, entry_id in self._db.expiring(txn, key):
            if expiry > now:
                break
            expired.append(entry_id)
        return expired

    def _post(self, txn: Txn, key: bytes, term: str, posting: bytes) -> None:
        """Add one posting to the term's open chunk (sealing it when full) and count the entry in its df."""
        term_at = term_key(key, term)
        df, sealed, open_chunk = self._db.term(txn, term_at) or (0, 0, b"")
        open_chunk += posting
        if len(open_chunk) == POSTINGS_PER_CHUNK * POSTING.size:
            segment = sealed // POSTINGS_PER_SEGMENT
            self._db.put_segment(txn, term_at, segment, self._db.segment(txn, term_at, segment) + open_chunk)
            sealed, open_chunk = sealed + POSTINGS_PER_CHUNK, b""
        self._db.put_term(txn, term_at, df + 1, sealed, open_chunk)

    def _discount(self, txn: Txn, key: bytes, term: str, removed: int) -> None:
        """Take ``removed`` entries (already out of ``mem_docs``) out of a term's df, reclaiming
        its dead postings as the module docstring says."""
        term_at = term_key(key, term)
        stored = self._db.term(txn, term_at)
        assert stored is not None, "a removed entry's term is indexed"
        df, sealed, open_chunk = stored
        df -= removed
        segments = -(-sealed // POSTINGS_PER_SEGMENT)
        if df <= 0:  # no live entry holds the term any more: nothing of it stays
            self._db.delete_term(txn, term_at)
            for segment in range(segments):
                self._db.delete_segment(txn, term_at, segment)
            return
        dead = sealed + len(open_chunk) // POSTING.size - df
        if dead <= df:
            self._db.put_term(txn, term_at, df, sealed, open_chunk)
            return
        postings = b"".join(self._db.segments(txn, term_at, segments)) + open_chunk
        ordinals = [ordinal for ordinal, _, _ in POSTING.iter_unpack(postings)]
        live = self._db.doc_records(txn, key, ordinals)
        kept = b"".join(postings[i * POSTING.size:(i + 1) * POSTING.size]
                        for i, ordinal in enumerate(ordinals) if ordinal in live)
        count = len(kept) // POSTING.size
        # Sealed postings stay whole chunks, so the next full open chunk lands where _post expects it.
        new_sealed = count - count % POSTINGS_PER_CHUNK
        new_segments = -(-new_sealed // POSTINGS_PER_SEGMENT)
        for segment in range(new_segments):
            end = min((segment + 1) * POSTINGS_PER_SEGMENT, new_sealed)
            self._db.put_segment(txn, term_at, segment,
                                 kept[segment * POSTINGS_PER_SEGMENT * POSTING.size:end * POSTING.size])
        for segment in range(new_segments, segments):
            self._db.delete_segment(txn, term_at, segment)
        self._db.put_term(txn, term_at, df, new_sealed, kept[new_sealed * POSTING.size:])

    # -- ranked walks ---------------------------------------------------------------------------

    def newest_first(self, txn: Txn, key: bytes) -> Iterator[Doc]:
        """The ref's docs by recency (ordinals grow with every put), expired ones included."""
        return self._db.docs_newest_first(txn, key)

    def oldest_first(self, txn: Txn, key: bytes) -> Iterator[Doc]:
        return self._db.docs_oldest_first(txn, key)

    def by_relevance(self, txn: Txn, key: bytes, meta: Meta, query: str,
                     query_vector: bytes | None) -> Iterator[tuple[Doc, float]]:
        """Lexical BM25, fused with cosine similarity when the query has an embedding. Lexical
        alone ranks in batches, deeper only when the walk wants more than a batch held."""
        # Cosine reads every vector anyway, so a fused ranking ranks everything at once. A lexical
        # first batch is small: a token budget rarely holds more entries, and the fewer are asked,
        # the sooner the rare terms decide them and the common terms' postings are skipped
        # (fastcore's bm25_top: 100k entries, a near-stopword and two rare words, 113 us for 128,
        # 28 us for 32). A walk that wants more ranks again, four times deeper.
        top = FIRST_BATCH if query_vector is None else meta.next_ordinal
        seen: set[int] = set()
        while True:
            rankings = [self._bm25(txn, key, meta, query, top)]
            if query_vector is not None:
                rankings.append(self._cosine(txn, key, query_vector, meta.dim, top))
            ranking = rankings[0] if len(rankings) == 1 else _fuse(rankings)
            fresh = [(ordinal, score) for ordinal, score in ranking if ordinal not in seen]
            by_ordinal = self._db.doc_records(txn, key, [ordinal for ordinal, _ in fresh])
            for ordinal, score in fresh:
                seen.add(ordinal)
                if ordinal in by_ordinal:  # else gone: its posting waits for its term's next rewrite
                    yield Doc.unpack(ordinal, by_ordinal[ordinal]), score
            if len(rankings[0]) < top or top >= meta.next_ordinal:
                return
            top *= 4

    def _bm25(self, txn: Txn, key: bytes, meta: Meta, query: str, top: int) -> list[tuple[int, float]]:
        postings, idfs = [], []
        n = max(meta.live, 1)
        for term in dict.fromkeys(terms(query)):
            term_at = term_key(key, term)
            stored = self._db.term(txn, term_at)
            if not stored:
                continue
            df, sealed, open_chunk = stored
            if df <= 0:
                continue
            segments = self._db.segments(txn, term_at, -(-sealed // POSTINGS_PER_SEGMENT))
            postings.append(b"".join(segments) + open_chunk)
            idfs.append(math.log(1 + (n - df + 0.5) / (df + 0.5)))
        if not postings:
            return []
        avgdl = max(meta.total_length / n, 1.0)
        return fastcore.bm25_top(postings, idfs, avgdl, BM25_K1, BM25_B, meta.next_ordinal, top)

    def _cosine(self, txn: Txn, key: bytes, query_vector: bytes, dim: int, top: int) -> list[tuple[int, float]]:
        ordinals, vectors = self._db.vectors(txn, key)
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
