"""Readable pure-Python twins of ``fastcore._search``: relevance ranking for memory search.

These are the specification: the tests run the compiled functions and these side by side on
fixed and random inputs and require the same ordinals in the same order (and scores equal to
within rounding). Nothing in the sidecar imports this module to serve requests.

Entries are named by a dense integer ordinal, assigned in insertion order: a larger ordinal is a
newer entry, and it wins a tie. Both functions return ``(ordinal, score)`` pairs best first.

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

import math
import operator
import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    from typing_extensions import Buffer

POSTING_SIZE = 8
LANES = 8  # cosine sums run in this many interleaved lanes (a power of two)
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


def _check_bm25_parameters(avgdl: float, k1: float, b: float, n_ordinals: int) -> None:
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


def bm25_top(postings: Sequence[Buffer], idfs: Sequence[float], avgdl: float, k1: float, b: float,
             n_ordinals: int, top: int) -> list[tuple[int, float]]:
    """The ``top`` entries by BM25 score, best first: ``[(ordinal, score), ...]``.

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
    n_ordinals = operator.index(n_ordinals)
    top = operator.index(top)
    if len(idfs) != len(postings):
        raise ValueError(f"{len(idfs)} idfs for {len(postings)} terms")
    avgdl, k1, b = float(avgdl), float(k1), float(b)
    _check_bm25_parameters(avgdl, k1, b, n_ordinals)
    views = [_bytes_view(records) for records in postings]
    for term, view in enumerate(views):
        if len(view) % POSTING_SIZE:
            raise ValueError(f"postings of term {term} are {len(view)} bytes, not a multiple of {POSTING_SIZE}")
    if top <= 0:
        return []

    scores: dict[int, float] = {}
    for view, idf in zip(views, [float(idf) for idf in idfs]):
        for ordinal, tf, dl in _POSTING.iter_unpack(view):
            if ordinal >= n_ordinals:
                raise ValueError(f"ordinal {ordinal} out of range for n_ordinals={n_ordinals}")
            if tf == 0:
                continue
            score = idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
            scores[ordinal] = scores.get(ordinal, 0.0) + score

    ranked = sorted(((ordinal, score) for ordinal, score in scores.items() if score > 0),
                    key=lambda hit: (hit[1], hit[0]), reverse=True)
    return ranked[:top]


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

