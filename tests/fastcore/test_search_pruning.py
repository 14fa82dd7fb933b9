"""fastcore._search.bm25_top's pruned walk (MaxScore) against the exhaustive specification.

``_search_reference.bm25_top`` scores every record; the compiled ``bm25_top`` and its readable
twin ``_search_reference.bm25_top_pruned`` skip most records of a common term. On corpora shaped
like the index's (records ascending by ordinal, one term in most entries, deleted entries'
ordinals missing) both must return exactly the exhaustive list: the same ordinals in the same
order and the same doubles, not scores within rounding.
"""

from __future__ import annotations

import math
import random

import pytest

from fastcore import _search, _search_reference
from tests.helpers import postings

PRUNED = {"compiled": _search.bm25_top, "twin": _search_reference.bm25_top_pruned}


def idf(live: int, df: int) -> float:
    """As the index computes it."""
    return math.log(1 + (live - df + 0.5) / (df + 0.5))


def random_corpus(rng: random.Random):
    """bm25_top's arguments for a random memory ref: ordinals with gaps (deleted entries), each
    entry one length (its dl in every term), one term in most entries and others from rare to
    common. Half of them are the queries pruning is for: a few rare terms and a small top."""
    prunable = rng.random() < 0.5
    n = rng.randrange(1000, 4000) if prunable else rng.choice((rng.randrange(1, 40), rng.randrange(40, 4000)))
    deleted = rng.choice((0.0, 0.1, 0.6))
    live = [o for o in range(n) if rng.random() >= deleted] or [n - 1]
    coarse = rng.random() < 0.5  # few distinct tf, dl and idf: many exact ties
    lengths = {o: rng.choice((5, 10, 20)) if coarse else rng.choice((rng.randrange(1, 300), rng.randrange(0, 3000)))
               for o in live}
    shares = [rng.uniform(0.6, 1.0)]  # the common term
    if prunable:
        shares += [rng.randrange(2, 30) / len(live) for _ in range(rng.randrange(1, 4))]
        top = rng.randrange(1, 12)
    else:
        shares += [rng.choice((rng.uniform(0.0, 0.03), rng.uniform(0.03, 0.5), rng.uniform(0.6, 1.0)))
                   for _ in range(rng.randrange(0, 6))]
        top = rng.choice((1, rng.randrange(2, 12), rng.randrange(12, 80), len(live), n + 7, 10**6))
    rng.shuffle(shares)  # the common term anywhere in the query
    terms, idfs = [], []
    for share in shares:
        holders = sorted(rng.sample(live, round(share * len(live))))
        tfs = (1, 2, 3) if coarse else (0, 1, 1, 1, 2, 3, 5, 9, 40, 65535)
        records = [(o, rng.choice(tfs), lengths[o]) for o in holders]
        if rng.random() < 0.03:
            rng.shuffle(records)  # not as the index stores them: the exhaustive walk
        terms.append(postings(*records))
        coarse_idf = rng.choice((2.0, 4.0) if share < 0.05 else (0.5, 1.0))
        idfs.append(coarse_idf if coarse else idf(len(live), len(holders)))
    if rng.random() < 0.05:
        idfs[rng.randrange(len(idfs))] = rng.choice((0.0, -0.5, math.inf, math.nan, 1e-310))
    avgdl = sum(lengths.values()) / len(live) or 1.0
    k1, b = rng.choice(((1.2, 0.75), (1.2, 0.75), (0.0, 0.75), (1.2, 0.0), (2.0, 1.0),
                        (rng.uniform(0, 3), rng.random())))
    return terms, idfs, avgdl, k1, b, n, top


@pytest.mark.parametrize("name, cases", [("compiled", 800), ("twin", 300)])
def test_pruned_ranking_is_the_exhaustive_one(name, cases) -> None:
    pruned = PRUNED[name]
    rng = random.Random(20250601)
    for case in range(cases):
        args = random_corpus(rng)
        assert pruned(*args) == _search_reference.bm25_top(*args), f"case {case}"


@pytest.mark.parametrize("name", PRUNED)
def test_the_newest_of_equal_scores_make_the_cut(name) -> None:
    # The common term scores every even entry alike; the rare one lifts six entries above the
    # rest, at two levels. Wherever the cut falls among equal scores, the newest make it, as in
    # the exhaustive ranking: among the rare term's entries (pruned), or past them (every entry
    # scored).
    common = postings(*[(o, 1, 10) for o in range(0, 3000, 2)])
    rare = postings(*[(o, 1, 10) for o in (10, 700, 1501, 2222, 2501, 2999)])
    args = ([common, rare], [0.4, 6.0], 10.0, 1.2, 0.75, 3000)
    for top in (*range(1, 10), 40, 1506, 1507, 3000):
        assert PRUNED[name](*args, top) == _search_reference.bm25_top(*args, top)
    hits = PRUNED[name](*args, 8)
    assert [o for o, _ in hits] == [2222, 700, 10, 2999, 2501, 1501, 2998, 2996]


@pytest.mark.parametrize("name", PRUNED)
def test_rounding_at_the_cut_leaves_no_entry_out(name) -> None:
    # k1 = 0: a term scores idf * tf / tf, its bound give or take a unit in the last place, so
    # entries holding the same terms score within a few units of each other, and pruning adds
    # up their partial sums in another order than their scores. Without the margin it leaves
    # out entries that score a unit more than the worst one kept (in a few of these cases).
    rng = random.Random(4)
    for _ in range(500):
        holders = sorted(rng.sample(range(6000), 40))  # most of the 6,000 entries deleted: few records
        terms = [postings(*[(o, rng.choice((3, 5, 6, 7)), 4) for o in holders]) for _ in range(5)]
        args = (terms, [rng.uniform(0.1, 10) for _ in terms], 4.0, 0.0, 0.5, 6000, rng.randrange(1, 8))
        assert PRUNED[name](*args) == _search_reference.bm25_top(*args)


@pytest.mark.parametrize("name", PRUNED)
def test_an_ordinal_out_of_range_in_a_term_pruning_skips_is_still_an_error(name) -> None:
    common = postings(*[(o, 1, 10) for o in range(0, 5000)], (5000, 1, 10))
    rare = postings(*[(o, 1, 10) for o in (10, 700, 1500)])
    args = ([common, rare], [0.1, 7.0], 10.0, 1.2, 0.75)
    assert PRUNED[name](*args, 5001, 2) == _search_reference.bm25_top(*args, 5001, 2)
    with pytest.raises(ValueError, match="ordinal 5000 out of range for n_ordinals=5000"):
        PRUNED[name](*args, 5000, 2)


def test_the_twin_scores_few_records_of_a_common_term(monkeypatch) -> None:
    """What pruning is for: with a rare term deciding the top, most of the common term's records
    are never scored (the twin takes the compiled module's walk, step for step)."""
    rng = random.Random(9)
    n = 20_000
    common = postings(*[(o, rng.randrange(1, 4), rng.randrange(5, 50)) for o in range(n)])
    rare = postings(*[(o, 1, 20) for o in sorted(rng.sample(range(n), 60))])
    args = ([common, rare], [idf(n, n), idf(n, 60)], 27.0, 1.2, 0.75, n, 10)
    scored = 0
    term_score = _search_reference._Bm25Call.term_score

    def counting(self, *record):
        nonlocal scored
        scored += 1
        return term_score(self, *record)

    monkeypatch.setattr(_search_reference._Bm25Call, "term_score", counting)
    hits = _search_reference.bm25_top_pruned(*args)
    assert scored < n // 5
    assert hits == _search_reference.bm25_top(*args) == _search.bm25_top(*args)
