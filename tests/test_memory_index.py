"""The memory search index against BM25 recomputed from scratch over what is live: after puts,
replacements, deletions and expiries, with chunks sealed into several segments."""

from __future__ import annotations

import math
import random
import re

import pytest

from sidecar import memory as memory_module
from sidecar.memory import BM25_B, BM25_K1, ListRequest, Memories
from sidecar.records import MemoryRecord
from sidecar.redaction import Redactor
from sidecar.settings import MemorySettings

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
