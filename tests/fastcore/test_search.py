"""fastcore._search, memory search's ranking, against hand-computed answers and its twin.

The twin (``fastcore._search_reference``) is the readable specification: on random inputs the
compiled functions must return the same ordinals in the same order with the same scores (to a
relative 1e-9; they are in fact computed with the same operations). The fixed cases run both.
"""

from __future__ import annotations

import importlib.machinery
import math
import random
import struct
import threading

import pytest

from fastcore import _search, _search_reference
from tests.helpers import POSTING, postings


@pytest.fixture(params=[_search, _search_reference], ids=["compiled", "twin"])
def impl(request):
    return request.param


def floats(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def uint32s(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def assert_same_ranking(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [ordinal for ordinal, _ in got] == [ordinal for ordinal, _ in want]
    for (_, got_score), (_, want_score) in zip(got, want):
        assert got_score == pytest.approx(want_score, rel=1e-9, abs=0)


def assert_ranked(hits: list[tuple[int, float]]) -> None:
    """Best first, equal scores newest first: strictly decreasing (score, ordinal)."""
    keys = [(score, ordinal) for ordinal, score in hits]
    assert all(a > b for a, b in zip(keys, keys[1:])), hits


def test_the_compiled_module_is_compiled() -> None:
    assert _search.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert _search.POSTING_SIZE == _search_reference.POSTING_SIZE == POSTING.size
    assert _search.LANES == _search_reference.LANES
    assert _search.GATHER_SHARE == _search_reference.GATHER_SHARE


# -- BM25, by hand ----------------------------------------------------------------------------
# With k1 = 1.2, b = 0.75 and dl == avgdl the length factor is 1.2, so tf = 1 scores exactly
# idf * 2.2 / 2.2 = idf and tf = 3 scores idf * 6.6 / 4.2 = idf * 11 / 7.


def test_bm25_one_term(impl) -> None:
    hits = impl.bm25_top([postings((0, 1, 10), (4, 3, 10))], [2.0], 10.0, 1.2, 0.75, 5, 10)
    assert [o for o, _ in hits] == [4, 0]
    assert hits[0][1] == pytest.approx(2.0 * 11 / 7, rel=1e-12)
    assert hits[1][1] == pytest.approx(2.0, rel=1e-12)


def test_bm25_two_terms_add_up(impl) -> None:
    # k1 = 1, b = 0: a term scores idf * 2 * tf / (tf + 1), whatever the length.
    rare = postings((1, 1, 7), (2, 1, 50))
    common = postings((0, 1, 3), (2, 3, 50))
    hits = impl.bm25_top([rare, common], [3.0, 0.5], 20.0, 1.0, 0.0, 3, 10)
    assert [o for o, _ in hits] == [2, 1, 0]
    assert hits[0][1] == pytest.approx(3.0 + 0.5 * 6 / 4, rel=1e-12)
    assert hits[1][1] == pytest.approx(3.0, rel=1e-12)
    assert hits[2][1] == pytest.approx(0.5, rel=1e-12)


def test_bm25_entry_with_several_terms(impl) -> None:
    terms = [postings((5, 1, 10)), postings((5, 3, 10), (6, 1, 10)), postings((5, 1, 10))]
    hits = impl.bm25_top(terms, [1.0, 2.0, 4.0], 10.0, 1.2, 0.75, 7, 10)
    assert [o for o, _ in hits] == [5, 6]
    assert hits[0][1] == pytest.approx(1.0 + 2.0 * 11 / 7 + 4.0, rel=1e-12)
    assert hits[1][1] == pytest.approx(2.0, rel=1e-12)


def test_bm25_shorter_entries_score_higher(impl) -> None:
    # k1 = 1, b = 1, avgdl = 10, tf = 1: 2 / (1 + dl / 10): 4/3 at dl 5, 1 at 10, 2/3 at 20.
    hits = impl.bm25_top([postings((0, 1, 20), (1, 1, 5), (2, 1, 10))], [1.0], 10.0, 1.0, 1.0, 3, 10)
    assert [o for o, _ in hits] == [1, 2, 0]
    assert [s for _, s in hits] == pytest.approx([4 / 3, 1.0, 2 / 3], rel=1e-12)
    # b = 0 ignores length: all three tie, newest first.
    hits = impl.bm25_top([postings((0, 1, 20), (1, 1, 5), (2, 1, 10))], [1.0], 10.0, 1.0, 0.0, 3, 10)
    assert hits == [(2, 1.0), (1, 1.0), (0, 1.0)]


def test_bm25_ties_go_newest_first(impl) -> None:
    records = [(o, 2, 8) for o in (3, 9, 1, 7)]
    hits = impl.bm25_top([postings(*records)], [1.5], 8.0, 1.2, 0.75, 10, 10)
    assert [o for o, _ in hits] == [9, 7, 3, 1]
    assert len({s for _, s in hits}) == 1
    # Many equal scores, a small top: the newest ones.
    hits = impl.bm25_top([postings(*[(o, 1, 4) for o in range(2000)])], [1.0], 4.0, 1.2, 0.75, 2000, 37)
    assert [o for o, _ in hits] == list(range(1999, 1962, -1))


def test_bm25_top_smaller_than_the_matches(impl) -> None:
    records = [(o, o % 5 + 1, 10) for o in range(50)]
    full = impl.bm25_top([postings(*records)], [1.0], 10.0, 1.2, 0.75, 50, 1000)
    assert len(full) == 50
    assert_ranked(full)
    for top in (1, 2, 3, 10, 11, 49, 50):
        assert impl.bm25_top([postings(*records)], [1.0], 10.0, 1.2, 0.75, 50, top) == full[:top]
    assert [o for o, _ in full[:3]] == [49, 44, 39]  # tf 5, newest first


def test_bm25_top_zero_or_negative(impl) -> None:
    terms = [postings((0, 1, 10))]
    assert impl.bm25_top(terms, [1.0], 10.0, 1.2, 0.75, 1, 0) == []
    assert impl.bm25_top(terms, [1.0], 10.0, 1.2, 0.75, 1, -5) == []


def test_bm25_empty_postings(impl) -> None:
    assert impl.bm25_top([], [], 10.0, 1.2, 0.75, 100, 10) == []
    assert impl.bm25_top([b"", b""], [1.0, 2.0], 10.0, 1.2, 0.75, 100, 10) == []
    assert impl.bm25_top([b""], [1.0], 10.0, 1.2, 0.75, 0, 10) == []
    assert impl.bm25_top([postings((0, 1, 10)), b""], [1.0, 2.0], 10.0, 1.2, 0.75, 1, 10) == [(0, 1.0)]


def test_bm25_only_positive_scores(impl) -> None:
    # idf 0 scores 0; a negative idf can cancel a term (the domain's idf is always > 0).
    terms = [postings((0, 1, 10), (1, 1, 10), (2, 1, 10)), postings((1, 1, 10), (2, 1, 10))]
    assert impl.bm25_top(terms, [0.0, 0.0], 10.0, 1.2, 0.75, 3, 10) == []
    hits = impl.bm25_top(terms, [1.0, -1.0], 10.0, 1.2, 0.75, 3, 10)
    assert hits == [(0, 1.0)]
    assert impl.bm25_top(terms, [1.0, -2.0], 10.0, 1.2, 0.75, 3, 10) == [(0, 1.0)]
    assert impl.bm25_top(terms, [math.nan, 1.0], 10.0, 1.2, 0.75, 3, 10) == []


def test_bm25_tf_zero_is_no_occurrence(impl) -> None:
    # With k1 = 0 it would be 0 / 0.
    terms = [postings((0, 0, 10), (1, 2, 10))]
    assert impl.bm25_top(terms, [1.0], 10.0, 0.0, 0.75, 2, 10) == [(1, 1.0)]
    assert impl.bm25_top(terms, [1.0], 10.0, 1.2, 0.75, 2, 10) == impl.bm25_top(
        [postings((1, 2, 10))], [1.0], 10.0, 1.2, 0.75, 2, 10)


def test_bm25_records_in_any_order_and_any_buffer(impl) -> None:
    records = [(o, o % 4 + 1, 3 + o % 9) for o in range(0, 300, 3)]
    want = impl.bm25_top([postings(*records)], [1.1], 6.0, 1.2, 0.75, 300, 20)
    shuffled = records[:]
    random.Random(3).shuffle(shuffled)
    assert impl.bm25_top([postings(*shuffled)], [1.1], 6.0, 1.2, 0.75, 300, 20) == want
    for buffer in (bytearray(postings(*records)), memoryview(postings(*records))):
        assert impl.bm25_top([buffer], [1.1], 6.0, 1.2, 0.75, 300, 20) == want


def test_bm25_long_entries_past_the_length_table(impl) -> None:
    # The compiled module tables the length factor for short entries: the long ones agree too.
    records = [(o, 1 + o % 3, dl) for o, dl in enumerate((0, 1, 1023, 1024, 1025, 4000, 65535))]
    hits = impl.bm25_top([postings(*records)], [1.0], 300.0, 1.2, 0.75, 7, 10)
    want = {o: 1.0 * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * dl / 300.0)) for o, tf, dl in records}
    assert_ranked(hits)
    assert dict(hits) == pytest.approx(want, rel=1e-12)


# -- BM25, against the twin -------------------------------------------------------------------

def random_bm25_case(rng: random.Random):
    n = rng.randrange(0, 2001)
    n_terms = rng.randrange(0, 9)
    coarse = rng.random() < 0.5  # few distinct tf/dl: many exact ties
    terms = []
    for _ in range(n_terms):
        count = rng.randrange(0, n + 1) if n and rng.random() < 0.3 else rng.randrange(0, max(n // 4, 1) + 1)
        ordinals = rng.sample(range(n), min(count, n))
        if rng.random() < 0.7:
            ordinals.sort()
        records = []
        for ordinal in ordinals:
            if coarse:
                records.append((ordinal, rng.randrange(1, 4), rng.choice((5, 10, 20))))
            else:
                records.append((ordinal, rng.choice((0, 1, 1, 2, 3, 7, 40, 65535)), rng.randrange(0, 3000)))
        terms.append(postings(*records))
    idfs = [rng.choice((0.0, 1.0, rng.uniform(0.01, 12.0), -rng.uniform(0, 1))) if rng.random() < 0.15
            else rng.uniform(0.01, 12.0) for _ in range(n_terms)]
    if coarse:
        idfs = [rng.choice((0.5, 1.0, 2.0)) for _ in range(n_terms)]
    avgdl = rng.uniform(1.0, 500.0)
    k1 = rng.choice((0.0, 1.2, 2.0, rng.uniform(0.0, 3.0)))
    b = rng.choice((0.0, 0.75, 1.0, rng.random()))
    top = rng.choice((rng.randrange(-2, 5), rng.randrange(0, 100), rng.randrange(0, 3000), 10**6))
    return terms, idfs, avgdl, k1, b, n, top


def test_bm25_random_against_twin() -> None:
    rng = random.Random(20240531)
    for _ in range(400):
        args = random_bm25_case(rng)
        got = _search.bm25_top(*args)
        want = _search_reference.bm25_top(*args)
        assert_same_ranking(got, want)
        assert_ranked(got)
        assert len(got) <= max(args[-1], 0)


def test_bm25_top_k_is_a_prefix_of_the_full_ranking() -> None:
    rng = random.Random(11)
    for _ in range(50):
        terms, idfs, avgdl, k1, b, n, _ = random_bm25_case(rng)
        full = _search.bm25_top(terms, idfs, avgdl, k1, b, n, n + 1)
        for top in (1, 2, 5, 17, 100, len(full), len(full) + 3):
            assert _search.bm25_top(terms, idfs, avgdl, k1, b, n, top) == full[:top]


def test_bm25_threads_share_nothing() -> None:
    # The loops run without the GIL: concurrent calls must not disturb each other.
    rng = random.Random(5)
    cases = [random_bm25_case(rng) for _ in range(8)]
    want = [_search.bm25_top(*case) for case in cases]
    failures: list[int] = []

    def run(i: int) -> None:
        for _ in range(20):
            if _search.bm25_top(*cases[i]) != want[i]:
                failures.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


# -- BM25, errors -----------------------------------------------------------------------------

def test_bm25_ordinal_out_of_range(impl) -> None:
    terms = [postings((0, 1, 10)), postings((1, 1, 10), (5, 1, 10))]
    with pytest.raises(ValueError, match=r"ordinal 5 out of range for n_ordinals=5"):
        impl.bm25_top(terms, [1.0, 1.0], 10.0, 1.2, 0.75, 5, 10)
    with pytest.raises(ValueError, match="out of range"):
        impl.bm25_top([postings((0, 1, 10))], [1.0], 10.0, 1.2, 0.75, 0, 10)
    with pytest.raises(ValueError, match="out of range"):  # even with tf 0
        impl.bm25_top([postings((0xFFFFFFFF, 0, 10))], [1.0], 10.0, 1.2, 0.75, 100, 10)


@pytest.mark.parametrize("args, message", [
    (([b""], [], 10.0, 1.2, 0.75, 1, 10), "0 idfs for 1 terms"),
    (([b"", b""], [1.0], 10.0, 1.2, 0.75, 1, 10), "1 idfs for 2 terms"),
    (([], [1.0], 10.0, 1.2, 0.75, 1, 10), "1 idfs for 0 terms"),
    (([postings((0, 1, 1))[:7]], [1.0], 10.0, 1.2, 0.75, 1, 10), "not a multiple of 8"),
    (([b"", postings((0, 1, 1)) + b"\0"], [1.0, 1.0], 10.0, 1.2, 0.75, 1, 10), "term 1 are 9 bytes"),
    (([b""], [1.0], 0.0, 1.2, 0.75, 1, 10), "avgdl"),
    (([b""], [1.0], -1.0, 1.2, 0.75, 1, 10), "avgdl"),
    (([b""], [1.0], math.nan, 1.2, 0.75, 1, 10), "avgdl"),
    (([b""], [1.0], 10.0, -0.1, 0.75, 1, 10), "k1"),
    (([b""], [1.0], 10.0, 1.2, 1.5, 1, 10), "b must"),
    (([b""], [1.0], 10.0, 1.2, -0.5, 1, 10), "b must"),
    (([b""], [1.0], 10.0, 1.2, 0.75, -1, 10), "n_ordinals"),
])
def test_bm25_bad_arguments(impl, args, message) -> None:
    with pytest.raises(ValueError, match=message):
        impl.bm25_top(*args)


# -- cosine, by hand --------------------------------------------------------------------------

def test_cosine_orthogonal_parallel_antiparallel_zero(impl) -> None:
    query = floats(1, 2, 3)
    rows = [(10, (2, 4, 6)), (11, (-1, -2, -3)), (12, (3, 0, -1)), (13, (0, 0, 0)), (14, (1, 2, 4))]
    vectors = b"".join(floats(*v) for _, v in rows)
    hits = impl.cosine_top(query, vectors, uint32s(*(o for o, _ in rows)), 3, 10)
    assert [o for o, _ in hits] == [10, 14, 13, 12, 11]  # the zero vector and the orthogonal tie at 0
    scores = dict(hits)
    assert scores[10] == pytest.approx(1.0, rel=1e-12)
    assert scores[11] == pytest.approx(-1.0, rel=1e-12)
    assert scores[12] == 0.0 and scores[13] == 0.0
    assert scores[14] == pytest.approx(17 / math.sqrt(14 * 21), rel=1e-12)


def test_cosine_zero_query_scores_every_row_zero(impl) -> None:
    vectors = floats(1, 0, 0, 1, 5, 5)
    hits = impl.cosine_top(floats(0, 0), vectors, uint32s(4, 9, 2), 2, 10)
    assert hits == [(9, 0.0), (4, 0.0), (2, 0.0)]


def test_cosine_top_and_ties(impl) -> None:
    rows = [(o, (1.0, 1.0) if o % 2 else (1.0, -1.0)) for o in (5, 2, 8, 3, 7, 1)]
    vectors = b"".join(floats(*v) for _, v in rows)
    ordinals = uint32s(*(o for o, _ in rows))
    query = floats(1, 0)
    assert [o for o, _ in impl.cosine_top(query, vectors, ordinals, 2, 100)] == [8, 7, 5, 3, 2, 1]
    assert [o for o, _ in impl.cosine_top(query, vectors, ordinals, 2, 2)] == [8, 7]
    assert impl.cosine_top(query, vectors, ordinals, 2, 0) == []
    assert impl.cosine_top(query, vectors, ordinals, 2, -1) == []
    assert impl.cosine_top(query, b"", b"", 2, 10) == []


def test_cosine_leaves_out_non_numbers(impl) -> None:
    vectors = floats(1, 0, math.nan, 1, math.inf, 0, 0, 1)
    hits = impl.cosine_top(floats(1, 1), vectors, uint32s(1, 2, 3, 4), 2, 10)
    assert [o for o, _ in hits] == [4, 1]


def test_cosine_reads_float32_little_endian(impl) -> None:
    # 0.1 is not a float32: the score is that of the rounded values, in double.
    q, v = struct.unpack("<3f", floats(0.1, 0.2, 0.3)), struct.unpack("<3f", floats(0.3, 0.1, 0.2))
    want = sum(a * b for a, b in zip(q, v)) / math.sqrt(sum(a * a for a in q) * sum(b * b for b in v))
    hits = impl.cosine_top(bytearray(floats(*q)), memoryview(floats(*v)), uint32s(0x01020304), 3, 1)
    assert hits[0][0] == 0x01020304
    assert hits[0][1] == pytest.approx(want, rel=1e-12)


# -- cosine, against the twin and errors --------------------------------------------------------

def test_cosine_random_against_twin() -> None:
    rng = random.Random(8)
    for _ in range(200):
        dim = rng.choice((1, 2, 3, 7, 8, 9, 16, 17, 31, 64, rng.randrange(1, 70)))
        n = rng.randrange(0, 300)
        rows = []
        for _ in range(n):
            kind = rng.random()
            if kind < 0.1 and rows:
                rows.append(rng.choice(rows))  # duplicates: exact ties
            elif kind < 0.15:
                rows.append([0.0] * dim)
            else:
                rows.append([rng.gauss(0, 1) if rng.random() < 0.9 else 0.0 for _ in range(dim)])
        query = [rng.gauss(0, 1) for _ in range(dim)] if rng.random() < 0.95 else [0.0] * dim
        ordinals = rng.sample(range(10 * n + 1), n)
        top = rng.choice((rng.randrange(-1, 5), rng.randrange(0, 50), n, n + 10))
        args = (floats(*query), b"".join(floats(*row) for row in rows), uint32s(*ordinals), dim, top)
        got = _search.cosine_top(*args)
        assert_same_ranking(got, _search_reference.cosine_top(*args))
        assert_ranked(got)
        assert len(got) == min(max(top, 0), n)


@pytest.mark.parametrize("args, message", [
    ((floats(), b"", b"", 0, 10), "dim must be > 0"),
    ((floats(1), floats(1), uint32s(0), -1, 10), "dim must be > 0"),
    ((floats(1, 2), b"", b"", 3, 10), "query is 8 bytes"),
    ((floats(1, 2) + b"\0", b"", b"", 2, 10), "query is 9 bytes"),
    ((floats(1, 2), floats(1, 2), uint32s(0) + b"\0", 2, 10), "ordinals are 5 bytes"),
    ((floats(1, 2), floats(1, 2, 3), uint32s(0), 2, 10), "vectors are 12 bytes, not 1 rows"),
    ((floats(1, 2), floats(1, 2), uint32s(0, 1), 2, 10), "vectors are 8 bytes, not 2 rows"),
    ((floats(1, 2), floats(1, 2, 3, 4), uint32s(0), 2, 10), "not 1 rows of 2"),
])
def test_cosine_bad_arguments(impl, args, message) -> None:
    with pytest.raises(ValueError, match=message):
        impl.cosine_top(*args)
