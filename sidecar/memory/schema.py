"""The memory area's stored form: the keys and records of its databases (``AREAS["memory"]``), and
the only code that reads or writes them. The index and the API above speak of entries, docs and
postings; this module alone knows how they are laid out in LMDB.

Each memory ref keeps, under ``scope(tenant, ref)``:

- ``mem_entries``: entry id -> its ordinal (4 bytes, big-endian) and its record (``MemoryRecord``,
  which is, byte for byte, the API's ``MemoryEntry``, so answers are spliced from stored bytes);
- ``mem_docs``: ordinal -> what a ranked walk needs (``Doc``: tokens, expiry, tags, id) without
  reading the content. Ordinals grow with every put, so this database, read backwards, is the
  recency order;
- ``mem_df``: term NUL -> the term's document frequency and how many of its postings are sealed
  (``TERM_HEAD``), then its open chunk of postings (``POSTING``: ordinal, tf, dl);
- ``mem_postings``: term NUL segment (4 bytes) -> a run of the term's sealed postings;
- ``mem_vectors``: ordinal -> embedding (little-endian float32s), when the host sends one;
- ``mem_expiry``: expiry (8 bytes, milliseconds) ordinal -> entry id, for the entries with a TTL,
  so the entries that expire first come first;
- ``mem_meta``: the ref's key alone -> ``Meta``;
- ``mem_compactions``: a digest of a compaction's source ids -> the ``CompactionRecord`` of it.

Values are read as ``bytes``: the environment is opened without ``buffers=True``, so LMDB never
hands out a memoryview.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import lmdb

from sidecar.storage.codec import dump_json, encode_memory, load_json
from sidecar.storage.environment import Store
from sidecar.storage.keys import Db, Txn, be32, records_under, scope

DOC = struct.Struct("<IqqH")  # tokens, created ms, expires ms (0: never), id length; then id, tags
POSTING = struct.Struct("<IHH")  # ordinal, tf, dl
TERM_HEAD = struct.Struct("<II")  # df, sealed postings; the open chunk follows
U16_MAX = 0xFFFF  # a posting's tf and dl are capped here (and so is an entry's length in the BM25 totals)


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


@dataclass(slots=True)
class Meta:
    """A memory ref's totals: the next ordinal, the live entries, their total length (BM25's
    statistics) and the embedding dimension (0: none yet)."""

    next_ordinal: int = 0
    live: int = 0
    total_length: int = 0
    dim: int = 0

    @classmethod
    def load(cls, data: bytes | None) -> Meta:
        return cls(**load_json(data)) if data else cls()

    def record(self) -> bytes:
        return dump_json({name: getattr(self, name) for name in self.__slots__})


@dataclass(frozen=True, slots=True)
class Doc:
    ordinal: int
    entry_id: str
    tokens: int
    expires_ms: int
    tags: tuple[str, ...]

    @staticmethod
    def pack(entry_id: str, tokens: int, created_ms: int, expires_ms: int, tags: Sequence[str]) -> bytes:
        encoded = entry_id.encode("utf-8")
        return DOC.pack(tokens, created_ms, expires_ms, len(encoded)) + encoded + "\0".join(tags).encode("utf-8")

    @classmethod
    def unpack(cls, ordinal: int, data: bytes) -> Doc:
        tokens, _, expires_ms, id_len = DOC.unpack_from(data)
        at = DOC.size + id_len
        tags = data[at:].decode("utf-8")
        return cls(ordinal, data[DOC.size:at].decode("utf-8"), tokens, expires_ms,
                   tuple(tags.split("\0")) if tags else ())

    def live(self, now_ms: int) -> bool:
        return alive(self.expires_ms, now_ms)


def alive(expires_ms: int, now_ms: int) -> bool:
    """Whether an entry of that expiry (0: never) is live at ``now_ms``: never answered once expired."""
    return not expires_ms or expires_ms > now_ms


@dataclass(frozen=True, slots=True)
class CompactionRecord:
    """A compaction done, kept so that a retry of the same sources answers with it."""

    compaction_id: str
    output_id: str
    source_count: int
    seq: int  # of its memory.compacted event in the tenant's event log
    event: dict[str, Any]  # that event's payload

    @classmethod
    def load(cls, data: bytes) -> CompactionRecord:
        value = json.loads(data)
        return cls(value["compaction_id"], value["output_id"], value["source_count"], value["seq"], value["event"])

    def record(self) -> bytes:
        return json.dumps({"compaction_id": self.compaction_id, "output_id": self.output_id,
                           "source_count": self.source_count, "seq": self.seq,
                           "event": self.event}).encode("utf-8")


def term_key(key: bytes, term: str) -> bytes:
    """A term's key in ``mem_df``, and the prefix of its segments' keys in ``mem_postings``."""
    return key + term.encode("utf-8") + b"\0"


def _compaction_key(key: bytes, source_ids: Sequence[str]) -> bytes:
    return key + hashlib.sha256("\0".join(sorted(source_ids)).encode("utf-8")).digest()[:16]


def _cursor(txn: Txn, db: Db) -> lmdb.Cursor[bytes]:
    return txn.cursor(db=db)


class MemoryDatabases:
    """Typed reads and writes of the memory area's records. ``key`` is always a memory ref's key,
    ``scope(tenant, ref)``; ordinals are ints, entry ids and terms strs."""

    def __init__(self, store: Store) -> None:
        handles = store.handles("memory")
        self._entries = handles["mem_entries"]
        self._docs = handles["mem_docs"]
        self._df = handles["mem_df"]
        self._postings = handles["mem_postings"]
        self._vectors = handles["mem_vectors"]
        self._meta = handles["mem_meta"]
        self._expiry = handles["mem_expiry"]
        self._compactions = handles["mem_compactions"]

    # -- mem_meta -------------------------------------------------------------------------------

    def meta(self, txn: Txn, key: bytes) -> Meta:
        return Meta.load(self.meta_record(txn, key))

    def meta_record(self, txn: Txn, key: bytes) -> bytes | None:
        """The ref's stored totals; None when it never held an entry."""
        return txn.get(key, db=self._meta)

    def put_meta(self, txn: Txn, key: bytes, meta: Meta) -> None:
        txn.put(key, meta.record(), db=self._meta)

    def refs(self, txn: Txn) -> Iterator[tuple[str, str, Meta]]:
        """(tenant, memory ref, its totals) of every memory ref of every tenant."""
        for key, value in _cursor(txn, self._meta):
            tenant, ref = key.decode("utf-8").split("\0")[:2]
            yield tenant, ref, Meta.load(value)

    def refs_of(self, txn: Txn, tenant: str) -> Iterator[str]:
        """The memory refs of ``tenant``, in key (byte) order: those that ever held an entry."""
        for ref, _ in records_under(txn, self._meta, scope(tenant)):
            yield ref[:-1].decode("utf-8")  # the key's part after the tenant is the ref and a NUL

    # -- mem_entries ----------------------------------------------------------------------------

    def entry(self, txn: Txn, key: bytes, entry_id: str) -> tuple[int, bytes] | None:
        """(ordinal, record) of an entry, or None."""
        stored = txn.get(key + entry_id.encode("utf-8"), db=self._entries)
        return None if stored is None else (int.from_bytes(stored[:4], "big"), stored[4:])

    def entry_record(self, txn: Txn, key: bytes, entry_id: str) -> bytes:
        """The record of an entry known to exist (its doc was just read in the same transaction)."""
        return cast(bytes, txn.get(key + entry_id.encode("utf-8"), db=self._entries))[4:]

    def put_entry(self, txn: Txn, key: bytes, ordinal: int, entry: PreparedEntry) -> None:
        record = encode_memory(entry.entry_id, entry.content, entry.tags, entry.created_ms, entry.expires_ms,
                               entry.tokens)
        txn.put(key + entry.entry_id.encode("utf-8"), be32(ordinal) + record, db=self._entries)

    def delete_entry(self, txn: Txn, key: bytes, entry_id: str) -> None:
        txn.delete(key + entry_id.encode("utf-8"), db=self._entries)

    # -- mem_docs -------------------------------------------------------------------------------

    def doc(self, txn: Txn, key: bytes, ordinal: int) -> Doc:
        """The doc of an ordinal known to exist (its entry was just read in the same transaction)."""
        return Doc.unpack(ordinal, cast(bytes, txn.get(key + be32(ordinal), db=self._docs)))

    def doc_records(self, txn: Txn, key: bytes, ordinals: Sequence[int]) -> dict[int, bytes]:
        """The stored docs (``Doc.unpack`` them) of those of ``ordinals`` that are live, in one read."""
        found = _cursor(txn, self._docs).getmulti([key + be32(ordinal) for ordinal in ordinals])
        return {int.from_bytes(doc_key[len(key):], "big"): value for doc_key, value in found}

    def docs_oldest_first(self, txn: Txn, key: bytes) -> Iterator[Doc]:
        for ordinal, value in records_under(txn, self._docs, key):
            yield Doc.unpack(int.from_bytes(ordinal, "big"), value)

    def docs_newest_first(self, txn: Txn, key: bytes) -> Iterator[Doc]:
        return (Doc.unpack(ordinal, value) for ordinal, value in self._doc_records_newest_first(txn, key))

    def sizes_newest_first(self, txn: Txn, key: bytes) -> Iterator[tuple[int, int, int]]:
        """(ordinal, tokens, expiry ms) of the ref's docs, newest first, the rest of each left
        undecoded: a walk over all of a ref's entries (its totals) costs a tenth of one over its Docs."""
        for ordinal, value in self._doc_records_newest_first(txn, key):
            tokens, _, expires_ms, _ = DOC.unpack_from(value)
            yield ordinal, tokens, expires_ms

    def _doc_records_newest_first(self, txn: Txn, key: bytes) -> Iterator[tuple[int, bytes]]:
        cursor = _cursor(txn, self._docs)
        if not cursor.set_range(key + b"\xff\xff\xff\xff"):  # past the ref's last ordinal
            if not cursor.last():
                return
        elif not cursor.prev():
            return
        for doc_key, value in cursor.iterprev():
            if not doc_key.startswith(key):
                return
            yield int.from_bytes(doc_key[len(key):], "big"), value

    def put_doc(self, txn: Txn, key: bytes, ordinal: int, entry: PreparedEntry) -> None:
        txn.put(key + be32(ordinal), Doc.pack(entry.entry_id, entry.tokens, entry.created_ms, entry.expires_ms,
                                              entry.tags), db=self._docs)

    def delete_doc(self, txn: Txn, key: bytes, ordinal: int) -> None:
        txn.delete(key + be32(ordinal), db=self._docs)

    # -- mem_expiry -----------------------------------------------------------------------------

    def expiring(self, txn: Txn, key: bytes) -> Iterator[tuple[int, str]]:
        """(expiry in ms, entry id) of the ref's entries with a TTL, the first to expire first."""
        for expiry, entry_id in records_under(txn, self._expiry, key):
            yield int.from_bytes(expiry[:8], "big"), entry_id.decode("utf-8")

    def put_expiry(self, txn: Txn, key: bytes, expires_ms: int, ordinal: int, entry_id: str) -> None:
        txn.put(key + expires_ms.to_bytes(8, "big") + be32(ordinal), entry_id.encode("utf-8"), db=self._expiry)

    def delete_expiry(self, txn: Txn, key: bytes, expires_ms: int, ordinal: int) -> None:
        txn.delete(key + expires_ms.to_bytes(8, "big") + be32(ordinal), db=self._expiry)

    # -- mem_vectors ----------------------------------------------------------------------------

    def vectors(self, txn: Txn, key: bytes) -> tuple[list[int], list[bytes]]:
        """The ordinals and embeddings of every vector of the ref, in ordinal order."""
        ordinals, vectors = [], []
        # Every vector of the ref, so the loop is inline: records_under's generator and key
        # slicing would add ~40% to a scan of 100k of them.
        cursor = _cursor(txn, self._vectors)
        if cursor.set_range(key):
            prefix = len(key)
            for vector_key, value in cursor:
                if not vector_key.startswith(key):
                    break
                ordinals.append(int.from_bytes(vector_key[prefix:], "big"))
                vectors.append(value)
        return ordinals, vectors

    def put_vector(self, txn: Txn, key: bytes, ordinal: int, vector: bytes) -> None:
        txn.put(key + be32(ordinal), vector, db=self._vectors)

    def delete_vector(self, txn: Txn, key: bytes, ordinal: int) -> None:
        txn.delete(key + be32(ordinal), db=self._vectors)

    # -- mem_df and mem_postings (``term_key`` names a term of a ref) ----------------------------

    def term(self, txn: Txn, term_key: bytes) -> tuple[int, int, bytes] | None:
        """(df, sealed postings, open chunk) of a term, or None when the index has no record of it."""
        stored = txn.get(term_key, db=self._df)
        if stored is None:
            return None
        df, sealed = TERM_HEAD.unpack_from(stored)
        return df, sealed, stored[TERM_HEAD.size:]

    def put_term(self, txn: Txn, term_key: bytes, df: int, sealed: int, open_chunk: bytes) -> None:
        txn.put(term_key, TERM_HEAD.pack(df, sealed) + open_chunk, db=self._df)

    def delete_term(self, txn: Txn, term_key: bytes) -> None:
        txn.delete(term_key, db=self._df)

    def segment(self, txn: Txn, term_key: bytes, segment: int) -> bytes:
        """A segment of sealed postings; empty when none is stored yet."""
        return cast(bytes, txn.get(term_key + be32(segment), b"", db=self._postings))

    def segments(self, txn: Txn, term_key: bytes, count: int) -> list[bytes]:
        """The term's first ``count`` segments, in one read."""
        return [value for _, value in _cursor(txn, self._postings).getmulti(
            [term_key + be32(segment) for segment in range(count)])]

    def put_segment(self, txn: Txn, term_key: bytes, segment: int, postings: bytes) -> None:
        txn.put(term_key + be32(segment), postings, db=self._postings)

    def delete_segment(self, txn: Txn, term_key: bytes, segment: int) -> None:
        txn.delete(term_key + be32(segment), db=self._postings)

    # -- mem_compactions ------------------------------------------------------------------------

    def compaction(self, txn: Txn, key: bytes, source_ids: Sequence[str]) -> CompactionRecord | None:
        data = txn.get(_compaction_key(key, source_ids), db=self._compactions)
        return None if data is None else CompactionRecord.load(data)

    def compactions(self, txn: Txn, key: bytes) -> list[CompactionRecord]:
        """Every compaction recorded in the ref, in no particular order (their keys are digests)."""
        return [CompactionRecord.load(value) for _, value in records_under(txn, self._compactions, key)]

    def put_compaction(self, txn: Txn, key: bytes, source_ids: Sequence[str], record: CompactionRecord) -> None:
        txn.put(_compaction_key(key, source_ids), record.record(), db=self._compactions)
