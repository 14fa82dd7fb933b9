"""The memory search index against BM25 recomputed from scratch over what is live: after puts,
replacements, deletions and expiries, with chunks sealed into several segments."""

from __future__ import annotations

import math
import random
import re
import struct

import pytest

from sidecar.memory import index as memory_module
from sidecar.memory.api import ListRequest, Memories
from sidecar.memory.index import BM25_B, BM25_K1
from sidecar.settings import MemorySettings
from sidecar.storage.codec import MemoryRecord
from sidecar.text.redaction import Redactor

WORDS = ["alpha", "beta", "gamma", "delta", "policy", "refund", "order", "ship", "label", "zeta",
         "ünïcödé", "日本", "common"]


def bm25_ranking(live: dict[str, tuple[int, str]], query: str) -> list[tuple[str, float]]:
    """Independent BM25: live maps entry id -> (ordinal, content)."""
    docs = {entry_id: re.findall(r"\w+", content.lower()) for entry_id, (_, content) in live.items()}
    n = len(docs)
    avgdl = sum(len(terms) for terms in docs.values()) / n
    scores: dict[str, float] = {}
    for term in dict.fromkeys(re.findall(r"\w+", query.lower())):
        df = sum(term in terms for terms in docs.values())
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for entry_id, terms in docs.items():
            tf = terms.count(term)
            if tf:
                norm = tf + BM25_K1 * (1 - BM25_B + BM25_B * len(terms) / avgdl)
                scores[entry_id] = scores.get(entry_id, 0.0) + idf * tf * (BM25_K1 + 1) / norm
    return sorted(scores.items(), key=lambda item: (-item[1], -live[item[0]][0]))


@pytest.fixture
def small_segments(monkeypatch):
    """Seal after 8 postings, 3 chunks a segment: a few hundred entries cross many segments."""
    monkeypatch.setattr(memory_module, "POSTINGS_PER_CHUNK", 8)
    monkeypatch.setattr(memory_module, "POSTINGS_PER_SEGMENT", 24)


def test_relevance_equals_bm25_recomputed_over_the_live_entries(store, counters, small_segments) -> None:
    now = [10_000_000]
    memories = Memories(store, counters, MemorySettings(token_counter="chars"), Redactor(detectors=False),
                        clock=lambda: now[0])
    rng = random.Random(42)
    live: dict[str, tuple[int, str]] = {}
    ordinal = 0
    for step in range(400):
        entry_id = f"e{rng.randrange(300)}"  # some ids come back: replacements
        content = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 25)))
        ttl = 5 if rng.random() < 0.05 else 0
        memories.put("t", "mem:idx", content, entry_id=entry_id, ttl_seconds=ttl)
        live[entry_id] = (ordinal, content)
        if ttl:
            live.pop(entry_id)  # it will have expired by the time we ask
        ordinal += 1
        if rng.random() < 0.1 and live:
            gone = rng.choice(sorted(live))
            memories.delete("t", "mem:idx", gone)
            live.pop(gone)
    now[0] += 60_000  # past every TTL; the next write takes the expired entries out
    memories.put("t", "mem:idx", "common last", entry_id="last")
    live["last"] = (ordinal, "common last")
    for query in ("refund policy", "common", "日本 ünïcödé", "alpha zeta label", "nothing-matches"):
        expected = bm25_ranking(live, query)
        listed = memories.list("t", ListRequest("mem:idx", rank="relevance", query=query))
        got_ids = [MemoryRecord.FromString(record).id for record in listed.records]
        assert got_ids == [entry_id for entry_id, _ in expected], query
        for score, (_, expected_score) in zip(listed.scores, expected):
            assert score == pytest.approx(expected_score, rel=1e-9)


def test_a_deep_ranking_is_read_in_batches(store, counters, small_segments) -> None:
    memories = Memories(store, counters, MemorySettings(token_counter="chars"), Redactor(detectors=False))
    for i in range(600):
        memories.put("t", "mem:deep", f"common word number {i}", entry_id=f"e{i}")
    # More matching entries than the first batch ranks (128): the walk asks for more.
    listed = memories.list("t", ListRequest("mem:deep", rank="relevance", query="common", limit=500))
    ids = [MemoryRecord.FromString(record).id for record in listed.records]
    assert len(ids) == 500 == len(set(ids))
    # Equal BM25 scores (same length, same tf): the newest first.
    assert ids[:3] == ["e599", "e598", "e597"]


def postings_kept(store, key: bytes, term: str) -> tuple[int, int] | None:
    """(df, postings kept in the df record's open chunk and the sealed segments) of one term, or
    None when the index has no record of it."""
    term_key = key + term.encode("utf-8") + b"\0"
    with store.env.begin() as txn:
        stored = txn.get(term_key, db=store.db["mem_df"])
        if stored is None:
            return None
        df, _ = struct.unpack_from("<II", stored)
        kept = (len(stored) - 8) // 8
        for segment_key, value in txn.cursor(db=store.db["mem_postings"]):
            if segment_key.startswith(term_key) and len(segment_key) == len(term_key) + 4:
                kept += len(value) // 8
    return df, kept


def test_dead_postings_are_reclaimed_through_puts_and_deletes(store, counters, small_segments) -> None:
    """Heavy churn with small segments: every term keeps at most twice the postings of its live
    entries, a term no live entry holds has no record at all, and the ranking still equals BM25
    recomputed from scratch (rewrites are followed by more puts that seal chunks again)."""
    memories = Memories(store, counters, MemorySettings(token_counter="chars"), Redactor(detectors=False))
    rng = random.Random(7)
    live: dict[str, tuple[int, str]] = {}
    key = b"t\0mem:churn\0"
    for ordinal in range(1500):
        while live and rng.random() < 0.45:
            gone = rng.choice(sorted(live))
            memories.delete("t", "mem:churn", gone)
            live.pop(gone)
        entry_id = f"e{rng.randrange(150)}"  # replacements too
        # "transient" only in the first 500 puts: by the end every entry holding it is gone.
        vocabulary = WORDS[:6] + ["transient"] if ordinal < 500 else WORDS
        content = " ".join(rng.choice(vocabulary) for _ in range(rng.randrange(1, 12)))
        memories.put("t", "mem:churn", content, entry_id=entry_id)
        live[entry_id] = (ordinal, content)
    assert postings_kept(store, key, "transient") is None
    for word in WORDS:
        holding = sum(word in re.findall(r"\w+", content.lower()) for _, content in live.values())
        kept = postings_kept(store, key, word)
        if not holding:
            assert kept is None, word
        else:
            assert kept is not None and kept[0] == holding and kept[1] <= 2 * holding, (word, holding, kept)
    for query in ("alpha", "refund policy order", "beta gamma delta", "日本 zeta"):
        expected = bm25_ranking(live, query)
        listed = memories.list("t", ListRequest("mem:churn", rank="relevance", query=query))
        assert [MemoryRecord.FromString(record).id for record in listed.records] == [e for e, _ in expected], query
        assert listed.scores == pytest.approx([score for _, score in expected], rel=1e-9)
