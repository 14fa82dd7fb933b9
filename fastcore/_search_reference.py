"""Readable pure-Python twins of ``fastcore._search``: relevance ranking for memory search.

These are the specification: the tests run the compiled functions and these side by side on
fixed and random inputs and require the same ordinals in the same order (and scores equal to
within rounding). ``bm25_top`` says what the ranking is, scoring every record;
``bm25_top_pruned`` is how the compiled module computes it, skipping most records of a common
term, and the tests hold both the compiled function and it to ``bm25_top``, double for double.
Nothing in the sidecar imports this module to serve requests.

Entries are named by a dense integer ordinal, assigned in insertion order: a larger ordinal is a
newer entry, and it wins a tie. Every function returns ``(ordinal, score)`` pairs best first.

Floating point: every score is computed here and in the compiled module with the same
operations in the same order (BM25: terms in the order given, each term's records in the order
given; cosine: the lane sums of ``_lane_sum``), so the two produce the same doubles and rank
them the same.

Packed postings (the postings of one query term): one record per entry holding the term,
``POSTING_SIZE`` bytes, little-endian:

    ordinal  uint32  the entry
    tf       uint16  how often the term occurs in the entry
    dl       uint16  the entry's length in terms
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import operator
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    from typing_extensions import Buffer

POSTING_SIZE = 8
LANES = 8  # cosine sums run in this many interleaved lanes (a power of two)
GATHER_SHARE = 64  # BM25 pruning gathers the rarest terms up to this share of the work (see _rank_pruned)
_POSTING = struct.Struct("<IHH")


def _bytes_view(data: Buffer) -> memoryview:
    """Any bytes-like object as flat bytes (what the compiled module accepts, too)."""
    return memoryview(data).cast("B")


def _lane_sum(values: Iterable[float]) -> float:
    """The sum of ``values`` as the compiled module adds it up: value i into lane i % LANES,
    each lane from 0.0 in order, then the lanes pairwise: ((l0 + l1) + (l2 + l3)) + ...

    (Independent lanes keep the compiled loop from waiting on each addition; ``sum`` would not
    do: since Python 3.12 it compensates float rounding.)
    """
    lanes = [0.0] * LANES
    for i, value in enumerate(values):
        lanes[i % LANES] += value
    while len(lanes) > 1:
        lanes = [lanes[i] + lanes[i + 1] for i in range(0, len(lanes), 2)]
    return lanes[0]


Record = tuple[int, int, int]  # ordinal, tf, dl


@dataclass(frozen=True)
class _Bm25Call:
    """A BM25 call's checked arguments: each query term's idf and unpacked records, in order."""

    terms: list[tuple[float, list[Record]]]
    avgdl: float
    k1: float
    b: float
    n_ordinals: int
    top: int

    @classmethod
    def check(cls, postings: Sequence[Buffer], idfs: Sequence[float], avgdl: float, k1: float, b: float,
              n_ordinals: int, top: int) -> _Bm25Call:
        n_ordinals = operator.index(n_ordinals)
        top = operator.index(top)
        if len(idfs) != len(postings):
            raise ValueError(f"{len(idfs)} idfs for {len(postings)} terms")
        avgdl, k1, b = float(avgdl), float(k1), float(b)
        # Within these bounds every denominator is at least tf >= 1, so no score divides by zero
        # (Python would raise where C would quietly make an infinity).
        if not avgdl > 0:
            raise ValueError(f"avgdl must be > 0, not {avgdl!r}")
        if not k1 >= 0:
            raise ValueError(f"k1 must be >= 0, not {k1!r}")
        if not 0 <= b <= 1:
            raise ValueError(f"b must be within [0, 1], not {b!r}")
        if n_ordinals < 0:
            raise ValueError(f"n_ordinals must be >= 0, not {n_ordinals}")
        views = [_bytes_view(records) for records in postings]
        for term, view in enumerate(views):
            if len(view) % POSTING_SIZE:
                raise ValueError(f"postings of term {term} are {len(view)} bytes, not a multiple of {POSTING_SIZE}")
        return cls([(float(idf), list(_POSTING.iter_unpack(view))) for idf, view in zip(idfs, views)],
                   avgdl, k1, b, n_ordinals, top)

    def check_ordinals(self) -> None:
        """The first ordinal out of range, terms in order, then each term's records, is an error."""
        for _, records in self.terms:
            for ordinal, _, _ in records:
                if ordinal >= self.n_ordinals:
                    raise ValueError(f"ordinal {ordinal} out of range for n_ordinals={self.n_ordinals}")

    def term_score(self, idf: float, tf: int, dl: int) -> float:
        return idf * tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * dl / self.avgdl))


def _best_first(hits: Iterable[tuple[int, float]], top: int) -> list[tuple[int, float]]:
    """The ``top`` hits scoring > 0 (never NaN), best first; equal scores, the larger ordinal first."""
    return sorted(((ordinal, score) for ordinal, score in hits if score > 0),
                  key=lambda hit: (hit[1], hit[0]), reverse=True)[:top]


def bm25_top(postings: Sequence[Buffer], idfs: Sequence[float], avgdl: float, k1: float, b: float,
             n_ordinals: int, top: int) -> list[tuple[int, float]]:
    """The ``top`` entries by BM25 score, best first: ``[(ordinal, score), ...]``. The
    specification: every record scored, every entry ranked (``bm25_top_pruned`` is the walk the
    compiled module takes, to the same answer).

    ``postings[i]`` holds the packed postings of query term i (bytes-like; an entry appears at
    most once per term, in any order) and ``idfs[i]`` its idf. An entry scores

        sum over the query terms in it of  idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))

    added up in term order. A record with tf 0 is not an occurrence and adds nothing. Only
    entries scoring > 0 are returned (never one whose score is NaN, from a NaN idf); equal
    scores put the larger (newer) ordinal first.
    ``top <= 0`` returns [].

    ValueError: ``len(idfs) != len(postings)``, postings not a whole number of records, an
    ordinal ``>= n_ordinals``, ``avgdl <= 0``, ``k1 < 0``, ``b`` outside [0, 1], or
    ``n_ordinals < 0``.
    """
    call = _Bm25Call.check(postings, idfs, avgdl, k1, b, n_ordinals, top)
    if call.top <= 0:
        return []
    call.check_ordinals()
    scores: dict[int, float] = {}
    for idf, records in call.terms:
        for ordinal, tf, dl in records:
            if tf:
                scores[ordinal] = scores.get(ordinal, 0.0) + call.term_score(idf, tf, dl)
    return _best_first(scores.items(), call.top)


def bm25_top_pruned(postings: Sequence[Buffer], idfs: Sequence[float], avgdl: float, k1: float, b: float,
                    n_ordinals: int, top: int) -> list[tuple[int, float]]:
    """``bm25_top`` as the compiled module computes it: the same list, ordinal for ordinal and
    double for double, without scoring most records of the common terms when the rare ones
    decide the top (MaxScore, term at a time); otherwise, every record, as ``bm25_top`` does.

    A term adds at most ``idf * (k1 + 1)`` to an entry's score, whatever tf and dl (tf / (tf +
    norm) <= 1): its bound. ``_rank_pruned`` says how the bounds prune. It needs every idf
    finite and non-negative (so that a partial sum never exceeds the entry's score) and gives
    up, for ``bm25_top``, when pruning would not pay or a term's records are not in ascending
    ordinal order (the index stores them so: appended as entries are put, each once).

    The margin: pruning compares sums added up in other orders than an entry's own (bounds,
    partials, the top's cut), each of which may be a few units in the last place off; the
    margin is thousands of times what that can make, with a floor for subnormal scores, so it
    costs a little pruning, never an entry.
    """
    call = _Bm25Call.check(postings, idfs, avgdl, k1, b, n_ordinals, top)
    if call.top <= 0:
        return []
    capacity = min(call.top, call.n_ordinals)
    magnitude = sum(abs(idf) * (call.k1 + 1) for idf, _ in call.terms)
    margin = (len(call.terms) + 8) * (magnitude * 2.0**-40 + 2.0**-1000)
    if capacity > 0 and math.isfinite(margin) and all(idf >= 0 for idf, _ in call.terms):
        ranked = _rank_pruned(call, capacity, margin)
        if ranked is not None:
            return ranked
    return bm25_top(postings, idfs, avgdl, k1, b, n_ordinals, top)


def _rank_pruned(call: _Bm25Call, capacity: int, margin: float) -> list[tuple[int, float]] | None:
    """The top, or None when pruning would not pay or a term's records are not ascending and in range.

    Terms sorted by bound, the rarest first; ``rest[t]`` adds up the bounds of terms[t:]. The
    rarest are gathered (every record scored) into ``partials`` until ``capacity`` entries
    outscore the bounds of the terms left: an entry holding none of the gathered terms cannot
    make the top, and the ``capacity``-th best partial, ``floor``, is below the top's cut.
    Gathering gives up past ``1 / GATHER_SHARE`` of the work of scoring everything (records and
    ordinals), and before it starts when the records it would need to stop are already more.
    Then each gathered entry, newest first, has the other terms looked up (a binary search),
    the largest bound first, while its partial and the bounds still to look up can reach the
    floor and the worst hit kept (once ``capacity`` are); one that can gets its score added up
    in query order, as ``bm25_top`` adds it. (The compiled module looks up from a cursor that
    only goes down, entries coming newest first.)
    """
    query_bounds = [idf * (call.k1 + 1) for idf, _ in call.terms]
    terms = sorted(range(len(call.terms)), key=query_bounds.__getitem__, reverse=True)  # positions in the query
    bounds = [query_bounds[term] for term in terms]
    rest = list(itertools.accumulate(reversed(bounds), initial=0.0))[::-1]
    records = [call.terms[term][1] for term in terms]
    ordinals = [[ordinal for ordinal, _, _ in term_records] for term_records in records]
    gather_limit = (sum(map(len, records)) + call.n_ordinals) // GATHER_SHARE
    needed = 0
    for gathered in range(1, len(terms) + 1):
        needed += len(records[gathered - 1])
        if needed > gather_limit:
            return None
        if rest[0] - rest[gathered] > rest[gathered] + margin:
            break

    def ascending_in_range(t: int) -> bool:
        column = ordinals[t]
        return all(older < newer for older, newer in itertools.pairwise(column)) and (
            not column or column[-1] < call.n_ordinals)

    def record_score(t: int, record: Record) -> float | None:
        _, tf, dl = record
        return call.term_score(call.terms[terms[t]][0], tf, dl) if tf else None

    partials: dict[int, float] = {}
    floor = -math.inf
    gathered = 0
    while gathered < len(terms):
        if len(partials) + len(records[gathered]) > gather_limit or not ascending_in_range(gathered):
            return None
        for record in records[gathered]:
            partials[record[0]] = partials.get(record[0], 0.0) + (record_score(gathered, record) or 0.0)
        gathered += 1
        if sum(partial > rest[gathered] + margin for partial in partials.values()) >= capacity:
            floor = heapq.nlargest(capacity, partials.values())[-1]
            break
    if not all(ascending_in_range(t) for t in range(gathered, len(terms))):
        return None

    def look_up(t: int, ordinal: int) -> float | None:
        at = bisect.bisect_left(ordinals[t], ordinal)
        return record_score(t, records[t][at]) if at < len(ordinals[t]) and ordinals[t][at] == ordinal else None

    heap: list[tuple[float, int]] = []  # (score, ordinal): the worst kept hit first

    def out_of_reach(most: float) -> bool:
        return most < floor or (len(heap) == capacity and most < heap[0][0])

    for candidate in sorted(partials, reverse=True):
        term_scores: list[float | None] = [None] * len(terms)  # by position in the query
        estimate = partials[candidate]
        t = gathered
        while t < len(terms) and not out_of_reach(estimate + rest[t] + margin):
            term_scores[terms[t]] = look_up(t, candidate)
            estimate += term_scores[terms[t]] or 0.0
            t += 1
        if t < len(terms) or out_of_reach(estimate + margin):
            continue
        for t in range(gathered):
            term_scores[terms[t]] = look_up(t, candidate)
        score = 0.0
        for term_score in term_scores:
            if term_score is not None:
                score += term_score
        if score > 0 and (len(heap) < capacity or (score, candidate) > heap[0]):
            (heapq.heappush if len(heap) < capacity else heapq.heapreplace)(heap, (score, candidate))
    return [(ordinal, score) for score, ordinal in sorted(heap, reverse=True)]


def cosine_top(query: Buffer, vectors: Buffer, ordinals: Buffer, dim: int, top: int) -> list[tuple[int, float]]:
    """The ``top`` rows most similar to ``query``, best first: ``[(ordinal, score), ...]``.

    ``query`` is ``dim`` float32 values, ``vectors`` ``n * dim`` (row j, from ``j * dim``,
    belongs to ``ordinals[j]``) and ``ordinals`` ``n`` uint32 values, all little-endian
    bytes-like. The score is the cosine similarity ``dot / (|q| * |v|)``, computed in double
    precision (each sum a ``_lane_sum``); a zero vector (query or row) scores 0. Every row is
    ranked whatever the sign of its score (a semantic ranking orders everything), except one
    whose score is not a number (from a NaN or infinite component), which is left out. Equal
    scores put the larger (newer) ordinal first. ``top <= 0`` returns [].

    ValueError: ``dim <= 0``, or lengths that disagree with ``dim`` or with each other.
    """
    dim = operator.index(dim)
    top = operator.index(top)
    if dim <= 0:
        raise ValueError(f"dim must be > 0, not {dim}")
    query, vectors, ordinals = _bytes_view(query), _bytes_view(vectors), _bytes_view(ordinals)
    if len(query) != 4 * dim:
        raise ValueError(f"query is {len(query)} bytes, not {dim} float32 values")
    if len(ordinals) % 4:
        raise ValueError(f"ordinals are {len(ordinals)} bytes, not a whole number of uint32 values")
    n = len(ordinals) // 4
    if len(vectors) != 4 * dim * n:
        raise ValueError(f"vectors are {len(vectors)} bytes, not {n} rows of {dim} float32 values")
    if top <= 0:
        return []

    q = struct.unpack(f"<{dim}f", query)
    q_norm = math.sqrt(_lane_sum(x * x for x in q))
    hits: list[tuple[int, float]] = []
    for ordinal, v in zip(struct.unpack(f"<{n}I", ordinals), struct.iter_unpack(f"<{dim}f", vectors)):
        dot = _lane_sum(x * y for x, y in zip(q, v))
        v_norm = math.sqrt(_lane_sum(y * y for y in v))
        score = 0.0 if q_norm == 0.0 or v_norm == 0.0 else dot / (q_norm * v_norm)
        if not math.isnan(score):
            hits.append((ordinal, score))
    hits.sort(key=lambda hit: (hit[1], hit[0]), reverse=True)
    return hits[:top]

