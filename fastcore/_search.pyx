# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -ffp-contract=off
"""Relevance ranking for memory search, compiled: BM25 over postings, cosine over embeddings.

Every function here has a readable twin in ``fastcore/_search_reference.py`` that documents it
and that the tests hold it to, ordinal for ordinal (``bm25_top``'s pruning, the way it gets to
the specification's answer, is ``bm25_top_pruned`` there). Plain values in and out: bytes-like
postings and vectors, floats, ints; this module knows nothing of LMDB or protobuf.

Both rank with a bounded heap of the ``top`` best hits: the caller walks the ranking under a
token budget and needs its head, never the full sort. Scores are computed with the twin's
operations in the twin's order, and the compile flag above keeps the C compiler from fusing a
multiply and an add (one rounding instead of two) where the target has FMA, so both produce
the same doubles and break ties the same way: equal scores, larger (newer) ordinal first.
"""

from libc.math cimport INFINITY, fabs, isfinite, ldexp, sqrt
from libc.stdint cimport uint16_t, uint32_t
from libc.stdlib cimport calloc, free, malloc, qsort
from libc.string cimport memcpy, memset

cdef enum:
    _POSTING_SIZE = 8
    _NORM_TABLE = 1024  # entry lengths below this get their length normalisation from a table
    _LANES = 8  # cosine sums run in this many interleaved lanes (a power of two)
    # BM25 pruning gathers the rarest terms while they hold at most 1 / _GATHER_SHARE of the
    # work of scoring everything (records and ordinals): pruning that needs more seldom pays,
    # and giving up wastes little.
    _GATHER_SHARE = 64

POSTING_SIZE = _POSTING_SIZE
LANES = _LANES
GATHER_SHARE = _GATHER_SHARE


cdef inline uint32_t _u32(const unsigned char* p) noexcept nogil:
    # Records are little-endian on every platform; compilers turn this into one load on LE.
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint16_t _u16(const unsigned char* p) noexcept nogil:
    return <uint16_t>(p[0] | (p[1] << 8))


cdef inline double _f32(const unsigned char* p) noexcept nogil:
    # A little-endian float32, widened exactly to double.
    cdef uint32_t bits = _u32(p)
    cdef float value
    memcpy(&value, &bits, 4)
    return value


# -- the bounded heap -------------------------------------------------------------------------

cdef struct Hit:
    double score
    uint32_t ordinal


cdef inline bint _outranks(const Hit* a, const Hit* b) noexcept nogil:
    # Scores reaching the heap are never NaN, so this is a total order: the twin's sort key.
    # Bitwise, not short-circuit: inside the heap it is a coin toss, better without branches.
    return (a.score > b.score) | ((a.score == b.score) & (a.ordinal > b.ordinal))


cdef void _sift_down(Hit* heap, Py_ssize_t size, Py_ssize_t i) noexcept nogil:
    # A min-heap on rank: heap[0] is the worst hit kept, the one a better candidate evicts.
    cdef Hit moving = heap[i]
    cdef Py_ssize_t child
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _outranks(&heap[child], &heap[child + 1]):
            child += 1
        if not _outranks(&moving, &heap[child]):
            break
        heap[i] = heap[child]
        i = child
    heap[i] = moving


cdef inline void _offer(Hit* heap, Py_ssize_t* size, Py_ssize_t capacity, double score,
                        uint32_t ordinal) noexcept nogil:
    # Keep the candidate while the heap has room, then only if it outranks the worst kept.
    cdef Hit hit
    cdef Py_ssize_t i, parent
    hit.score = score
    hit.ordinal = ordinal
    if size[0] < capacity:
        i = size[0]
        size[0] += 1
        while i > 0:
            parent = (i - 1) // 2
            if not _outranks(&heap[parent], &hit):
                break
            heap[i] = heap[parent]
            i = parent
        heap[i] = hit
    elif capacity > 0 and _outranks(&hit, &heap[0]):
        heap[0] = hit
        _sift_down(heap, size[0], 0)


cdef list _best_first(Hit* heap, Py_ssize_t size):
    """Empties the heap into a list, best first (a heapsort: the worst goes to the back)."""
    cdef Py_ssize_t end
    cdef Hit worst
    with nogil:
        for end in range(size - 1, 0, -1):
            worst = heap[0]
            heap[0] = heap[end]
            heap[end] = worst
            _sift_down(heap, end, 0)
    return [(heap[end].ordinal, heap[end].score) for end in range(size)]


# -- BM25 -------------------------------------------------------------------------------------

cdef struct Lengths:
    # BM25's length normalisation k1 * (1 - b + b * dl / avgdl), tabled for the short lengths.
    double k1, b, avgdl
    double table[_NORM_TABLE]


cdef inline double _norm(const Lengths* lengths, uint16_t dl) noexcept nogil:
    if dl < _NORM_TABLE:
        return lengths.table[dl]
    return lengths.k1 * (1 - lengths.b + lengths.b * dl / lengths.avgdl)


cdef inline double _term_score(double idf, uint16_t tf, double norm, double k1_plus_1) noexcept nogil:
    # The twin's expression, so the same double. A record with tf 0 is not an occurrence and
    # scores 0 (not 0 / 0 when k1 == 0): adding +0.0 leaves every sum but -0.0 as it was.
    if tf == 0:
        return 0
    return idf * tf * k1_plus_1 / (tf + norm)


cdef struct Term:
    const unsigned char* records
    Py_ssize_t count
    double idf
    Py_ssize_t position  # in the query: an entry adds up its term scores in this order
    double bound  # no record of the term scores more (to within the margin)
    Py_ssize_t cursor  # lookups go from the last record down: the last one not yet passed


cdef inline uint32_t _ordinal(const Term* term, Py_ssize_t r) noexcept nogil:
    return _u32(term.records + r * _POSTING_SIZE)


cdef inline double _record_score(const Term* term, Py_ssize_t r, const Lengths* lengths) noexcept nogil:
    cdef const unsigned char* p = term.records + r * _POSTING_SIZE
    return _term_score(term.idf, _u16(p + 4), _norm(lengths, _u16(p + 6)), lengths.k1 + 1)


cdef bint _accumulate(const Term* terms, Py_ssize_t n_terms, const Lengths* lengths, double* scores,
                      Py_ssize_t n_ordinals, Hit* heap, Py_ssize_t* size, Py_ssize_t capacity,
                      uint32_t* bad_ordinal) noexcept nogil:
    """Ranks every entry, records in any order: each record's score added into ``scores``, dense
    by ordinal, term by term in query order (so each sum is added up as the twin adds it), then
    one pass over every ordinal. False, with ``bad_ordinal``, at an ordinal out of range."""
    cdef Py_ssize_t term, r, o
    cdef const unsigned char* p
    cdef uint32_t ordinal
    # Locals, not reads through ``terms`` and ``lengths`` per record: a store to ``scores``
    # could change those, as far as the compiler knows.
    cdef double idf, k1_plus_1 = lengths.k1 + 1, score, limit = 0
    for term in range(n_terms):
        idf = terms[term].idf
        p = terms[term].records
        for r in range(terms[term].count):
            ordinal = _u32(p)
            if ordinal >= n_ordinals:
                bad_ordinal[0] = ordinal
                return False
            scores[ordinal] += _term_score(idf, _u16(p + 4), _norm(lengths, _u16(p + 6)), k1_plus_1)
            p += _POSTING_SIZE
    # Newest first, against the worst kept score once the heap is full (0 until then): one
    # test, seldom passed, so seldom mispredicted; > also leaves out NaN (from a NaN idf). A
    # later candidate that only ties the worst kept hit is older and could not evict it.
    for o in range(n_ordinals - 1, -1, -1):
        score = scores[o]
        if score > limit:
            _offer(heap, size, capacity, score, <uint32_t>o)
            if size[0] == capacity:
                limit = heap[0].score
    return True


cdef bint _ascending_in_range(const Term* term, Py_ssize_t n_ordinals) noexcept nogil:
    """Whether the term's ordinals strictly ascend, as the index stores them (appended as entries
    are put, each once), below ``n_ordinals``: what lookups need. One read, without a branch."""
    cdef Py_ssize_t r
    cdef uint32_t ordinal, previous
    cdef bint descends = False
    if term.count == 0:
        return True
    previous = _ordinal(term, 0)
    for r in range(1, term.count):
        ordinal = _ordinal(term, r)
        descends |= ordinal <= previous
        previous = ordinal
    return not descends and previous < n_ordinals


cdef struct Pool:
    # The entries the rarest terms hold, ascending by ordinal, with what those terms score them.
    uint32_t* ordinals
    double* partials
    Py_ssize_t size


cdef void _gather(Pool* pool, Pool* spare, const Term* term, const Lengths* lengths) noexcept nogil:
    """Adds a term's records to the pool: two ascending runs merged into ``spare``, then the two
    swapped. Each partial is added up in the order the terms are gathered: an estimate."""
    cdef Py_ssize_t i = 0, j = 0, k = 0
    cdef uint32_t ordinal
    cdef Pool merged
    while i < pool.size or j < term.count:
        ordinal = _ordinal(term, j) if j < term.count else 0
        if j == term.count or (i < pool.size and pool.ordinals[i] < ordinal):
            spare.ordinals[k] = pool.ordinals[i]
            spare.partials[k] = pool.partials[i]
            i += 1
        else:
            spare.ordinals[k] = ordinal
            spare.partials[k] = _record_score(term, j, lengths)
            if i < pool.size and pool.ordinals[i] == ordinal:
                spare.partials[k] += pool.partials[i]
                i += 1
            j += 1
        k += 1
    spare.size = k
    merged = spare[0]
    spare[0] = pool[0]
    pool[0] = merged


cdef Py_ssize_t _count_above(const Pool* pool, double score) noexcept nogil:
    cdef Py_ssize_t i, count = 0
    for i in range(pool.size):
        count += pool.partials[i] > score
    return count


cdef double _kth_best(const Pool* pool, Hit* heap, Py_ssize_t capacity) noexcept nogil:
    """The ``capacity``-th best partial in the pool (which holds at least that many); the heap
    is scratch."""
    cdef Py_ssize_t i, size = 0
    for i in range(pool.size):
        _offer(heap, &size, capacity, pool.partials[i], pool.ordinals[i])
    return heap[0].score


cdef double _look_up(Term* term, uint32_t ordinal, const Lengths* lengths) noexcept nogil:
    """The term's score of the entry (0 if it holds no record of it). Entries are looked up newest
    first, so the cursor only goes down: a gallop from it, then a binary search of the last
    stride."""
    cdef Py_ssize_t at = term.cursor, low, middle, stride = 1
    if at >= 0 and _ordinal(term, at) > ordinal:
        while True:  # _ordinal(term, at) > ordinal
            low = at - stride
            if low < 0:
                low = -1
                break
            if _ordinal(term, low) <= ordinal:
                break
            at = low
            stride *= 2
        while at - low > 1:  # _ordinal(term, low) <= ordinal < _ordinal(term, at); -1 is below all
            middle = low + (at - low) // 2
            if _ordinal(term, middle) <= ordinal:
                low = middle
            else:
                at = middle
        at = low
    if at < 0 or _ordinal(term, at) != ordinal:
        term.cursor = at
        return 0
    term.cursor = at - 1
    return _record_score(term, at, lengths)


cdef inline bint _out_of_reach(double most, double floor, const Hit* heap, Py_ssize_t size,
                               Py_ssize_t capacity) noexcept nogil:
    # ``most`` (with the margin) is the most a candidate can score. Below ``floor`` it is below
    # the top's cut; below the worst hit of a full heap it has no room, whatever its ordinal.
    return most < floor or (size == capacity and most < heap[0].score)


cdef int _rarest_first(const void* a, const void* b) noexcept nogil:
    cdef double x = (<const Term*>a).bound, y = (<const Term*>b).bound
    return (x < y) - (x > y)


cdef bint _gather_rarest(Term* terms, Py_ssize_t n_terms, Py_ssize_t n_ordinals, const double* rest, double margin,
                        const Lengths* lengths, Pool* pool, Pool* spare, Py_ssize_t gather_limit, Hit* heap,
                        Py_ssize_t capacity, Py_ssize_t* gathered, double* floor) noexcept nogil:
    """Gathers the rarest terms into the pool until its ``capacity``-th best partial, ``floor``,
    outscores the bounds of the terms left (or every term is gathered). False when that takes
    more than ``gather_limit`` records, or a gathered term's records are not ascending and in
    range."""
    while gathered[0] < n_terms:
        if (pool.size + terms[gathered[0]].count > gather_limit
                or not _ascending_in_range(&terms[gathered[0]], n_ordinals)):
            return False
        _gather(pool, spare, &terms[gathered[0]], lengths)
        gathered[0] += 1
        if pool.size >= capacity and _count_above(pool, rest[gathered[0]] + margin) >= capacity:
            floor[0] = _kth_best(pool, heap, capacity)
            return True
    return True


cdef void _rank_pool(Term* terms, Py_ssize_t n_terms, Py_ssize_t gathered, const double* rest, double margin,
                     double floor, const Lengths* lengths, const Pool* pool, double* term_scores, Hit* heap,
                     Py_ssize_t* size, Py_ssize_t capacity) noexcept nogil:
    """Ranks the pool's entries that can make the top: the terms not gathered looked up, the
    largest bound first, while the entry is within reach; then its score added up in query
    order, as the dense walk adds it (the same double)."""
    cdef Py_ssize_t i, t
    cdef uint32_t candidate
    cdef double estimate, score
    for t in range(n_terms):
        terms[t].cursor = terms[t].count - 1
    for i in range(pool.size - 1, -1, -1):  # newest first, as the lookups need
        candidate = pool.ordinals[i]
        estimate = pool.partials[i]
        t = gathered
        while t < n_terms and not _out_of_reach(estimate + rest[t] + margin, floor, heap, size[0], capacity):
            score = _look_up(&terms[t], candidate, lengths)
            term_scores[terms[t].position] = score
            estimate += score
            t += 1
        if t == n_terms and not _out_of_reach(estimate + margin, floor, heap, size[0], capacity):
            for t in range(gathered):
                term_scores[terms[t].position] = _look_up(&terms[t], candidate, lengths)
            score = 0
            for t in range(n_terms):
                score += term_scores[t]
            # Newest first: a candidate that only ties the worst kept hit is older.
            if score > 0 and (size[0] < capacity or score > heap[0].score):
                _offer(heap, size, capacity, score, candidate)
        memset(term_scores, 0, n_terms * sizeof(double))


cdef bint _rank_pruned(const Term* query, Term* terms, Py_ssize_t n_terms, Py_ssize_t n_ordinals, double margin,
                       const Lengths* lengths, double* rest, double* term_scores, Py_ssize_t gather_limit,
                       Hit* heap, Py_ssize_t* size, Py_ssize_t capacity) noexcept nogil:
    """MaxScore, term at a time: ranks into the heap every entry that can make the top without
    scoring most records of the common terms. False (heap empty) when that would not pay, when
    a term's records are not ascending and in range, or without memory for the pool: the dense
    walk then ranks (or raises).

    Terms sorted by bound, the rarest first; ``rest[t]`` adds up the bounds of terms[t:]. The
    rarest are gathered (``_gather_rarest``) until an entry holding none of them cannot make
    the top; the pool's entries are then ranked (``_rank_pool``). Every term score is
    non-negative, so a partial never exceeds the entry's score (give or take the margin).
    ``terms`` (n_terms), ``rest`` (n_terms + 1) and ``term_scores`` (n_terms, zeros) are scratch."""
    cdef Py_ssize_t gathered = 0, t, records = 0, slots = gather_limit if gather_limit > 0 else 1
    cdef double floor = -INFINITY
    cdef bint ranked
    cdef Pool pool, spare
    cdef void* block
    memcpy(terms, query, n_terms * sizeof(Term))
    qsort(terms, n_terms, sizeof(Term), _rarest_first)
    rest[n_terms] = 0
    for t in range(n_terms - 1, -1, -1):
        rest[t] = rest[t + 1] + terms[t].bound
    # Gathering cannot stop before the gathered terms' bounds outscore the others': when the
    # records up to there are too many, give up before gathering any.
    for t in range(n_terms):
        records += terms[t].count
        if records > gather_limit:
            return False
        if rest[0] - rest[t + 1] > rest[t + 1] + margin:
            break
    block = malloc(2 * slots * (sizeof(double) + sizeof(uint32_t)))
    if block == NULL:
        return False
    pool.partials = <double*>block
    spare.partials = pool.partials + slots
    pool.ordinals = <uint32_t*>(spare.partials + slots)
    spare.ordinals = pool.ordinals + slots
    pool.size = spare.size = 0
    ranked = _gather_rarest(terms, n_terms, n_ordinals, rest, margin, lengths, &pool, &spare, gather_limit, heap,
                            capacity, &gathered, &floor)
    for t in range(gathered, n_terms):
        ranked = ranked and _ascending_in_range(&terms[t], n_ordinals)
    if ranked:
        _rank_pool(terms, n_terms, gathered, rest, margin, floor, lengths, &pool, term_scores, heap, size, capacity)
    free(block)
    return ranked


def bm25_top(postings, idfs, double avgdl, double k1, double b, Py_ssize_t n_ordinals, Py_ssize_t top):
    """The ``top`` entries by BM25 score, best first. See ``_search_reference.bm25_top``, the
    specification, and ``_search_reference.bm25_top_pruned``, how this computes it."""
    cdef Py_ssize_t n_terms = len(postings)
    if len(idfs) != n_terms:
        raise ValueError(f"{len(idfs)} idfs for {n_terms} terms")
    if not avgdl > 0:
        raise ValueError(f"avgdl must be > 0, not {avgdl!r}")
    if not k1 >= 0:
        raise ValueError(f"k1 must be >= 0, not {k1!r}")
    if not 0 <= b <= 1:
        raise ValueError(f"b must be within [0, 1], not {b!r}")
    if n_ordinals < 0:
        raise ValueError(f"n_ordinals must be >= 0, not {n_ordinals}")
    # The views keep every buffer exported (alive, unresizable) while the GIL is released.
    cdef list views = [memoryview(data).cast("B") for data in postings]
    cdef Py_ssize_t term
    for term in range(n_terms):
        if len(views[term]) % _POSTING_SIZE:
            raise ValueError(f"postings of term {term} are {len(views[term])} bytes, "
                             f"not a multiple of {_POSTING_SIZE}")
    if top <= 0:
        return []

    # Every allocation gets at least one slot: malloc(0) may return NULL.
    cdef Py_ssize_t terms_alloc = n_terms if n_terms > 0 else 1
    cdef Py_ssize_t capacity = top if top < n_ordinals else n_ordinals
    cdef Py_ssize_t records = 0
    cdef const unsigned char[::1] view
    cdef Term* terms = <Term*>malloc(terms_alloc * sizeof(Term))
    cdef Term* by_bound = <Term*>malloc(terms_alloc * sizeof(Term))
    cdef double* rest = <double*>malloc((n_terms + 1) * sizeof(double))
    cdef double* term_scores = <double*>calloc(terms_alloc, sizeof(double))
    cdef Hit* heap = <Hit*>malloc((capacity if capacity > 0 else 1) * sizeof(Hit))
    cdef double* scores = NULL
    cdef Lengths lengths
    cdef Py_ssize_t size = 0
    cdef uint32_t bad_ordinal = 0
    cdef uint16_t dl
    cdef bint pruned, bad, nonnegative = True
    cdef double magnitude = 0, margin
    try:
        if terms == NULL or by_bound == NULL or rest == NULL or term_scores == NULL or heap == NULL:
            raise MemoryError()
        for term in range(n_terms):
            view = views[term]
            terms[term].records = &view[0] if view.shape[0] > 0 else NULL
            terms[term].count = view.shape[0] // _POSTING_SIZE
            terms[term].idf = idfs[term]
            terms[term].position = term
            # A term scores at most idf * (k1 + 1), whatever tf and dl: tf / (tf + norm) <= 1.
            terms[term].bound = terms[term].idf * (k1 + 1)
            nonnegative &= terms[term].idf >= 0
            magnitude += fabs(terms[term].idf) * (k1 + 1)
            records += terms[term].count
        # Pruning compares sums added up in other orders than an entry's own (bounds, partials,
        # the top's cut): each may be off by a few units in the last place of the magnitude of
        # what it adds up. The margin is thousands of times that, with a floor for subnormal
        # scores; too wide a margin costs a little pruning, never an entry. Not finite (an
        # infinite or NaN idf or k1), or a negative idf (partials no longer below the scores):
        # every entry is scored.
        margin = (n_terms + 8) * (magnitude * ldexp(1, -40) + ldexp(1, -1000))
        pruned = nonnegative and isfinite(margin) and capacity > 0
        with nogil:
            lengths.k1, lengths.b, lengths.avgdl = k1, b, avgdl
            # The same expression as _norm's and the twin's, computed once per short length.
            for dl in range(_NORM_TABLE):
                lengths.table[dl] = k1 * (1 - b + b * dl / avgdl)
            if pruned:
                pruned = _rank_pruned(terms, by_bound, n_terms, n_ordinals, margin, &lengths, rest, term_scores,
                                      (records + n_ordinals) // _GATHER_SHARE, heap, &size, capacity)
        if not pruned:
            # Dense by ordinal: a random-access add per record, then one pass in ordinal order.
            scores = <double*>calloc(n_ordinals if n_ordinals > 0 else 1, sizeof(double))
            if scores == NULL:
                raise MemoryError()
            with nogil:
                bad = not _accumulate(terms, n_terms, &lengths, scores, n_ordinals, heap, &size, capacity,
                                      &bad_ordinal)
            if bad:
                raise ValueError(f"ordinal {bad_ordinal} out of range for n_ordinals={n_ordinals}")
        return _best_first(heap, size)
    finally:
        free(terms)
        free(by_bound)
        free(rest)
        free(term_scores)
        free(heap)
        free(scores)


# -- cosine -----------------------------------------------------------------------------------

cdef void _row_sums(const double* q, const unsigned char* row, Py_ssize_t dim, double* dot,
                    double* sum_sq) noexcept nogil:
    """dot = sum q[i] * v[i] and sum_sq = sum v[i] * v[i] over the float32 row v, each added up
    in _LANES lanes (component i into lane i % _LANES) that are then summed pairwise.

    One running sum would wait on every addition's latency; independent lanes keep the FPU
    busy and the compiler can put two in a vector register. The twin adds up the same way, so
    the doubles agree (a float32 product is exact in double: only the additions round).
    """
    cdef double dots[_LANES]
    cdef double squares[_LANES]
    cdef Py_ssize_t i, lane, width, body = dim - dim % _LANES
    cdef double x
    for lane in range(_LANES):
        dots[lane] = 0
        squares[lane] = 0
    i = 0
    while i < body:
        for lane in range(_LANES):
            x = _f32(row + 4 * (i + lane))
            dots[lane] += q[i + lane] * x
            squares[lane] += x * x
        i += _LANES
    for i in range(body, dim):
        x = _f32(row + 4 * i)
        dots[i - body] += q[i] * x
        squares[i - body] += x * x
    width = _LANES
    while width > 1:
        width //= 2
        for lane in range(width):
            dots[lane] = dots[2 * lane] + dots[2 * lane + 1]
            squares[lane] = squares[2 * lane] + squares[2 * lane + 1]
    dot[0] = dots[0]
    sum_sq[0] = squares[0]


def cosine_top(query, vectors, ordinals, Py_ssize_t dim, Py_ssize_t top):
    """The ``top`` rows by cosine similarity to ``query``, best first. See
    ``_search_reference.cosine_top``."""
    if dim <= 0:
        raise ValueError(f"dim must be > 0, not {dim}")
    cdef const unsigned char[::1] q_bytes = memoryview(query).cast("B")
    cdef const unsigned char[::1] v_bytes = memoryview(vectors).cast("B")
    cdef const unsigned char[::1] o_bytes = memoryview(ordinals).cast("B")
    if q_bytes.shape[0] != 4 * dim:
        raise ValueError(f"query is {q_bytes.shape[0]} bytes, not {dim} float32 values")
    if o_bytes.shape[0] % 4:
        raise ValueError(f"ordinals are {o_bytes.shape[0]} bytes, not a whole number of uint32 values")
    cdef Py_ssize_t n = o_bytes.shape[0] // 4
    if v_bytes.shape[0] != 4 * dim * n:
        raise ValueError(f"vectors are {v_bytes.shape[0]} bytes, not {n} rows of {dim} float32 values")
    if top <= 0:
        return []

    cdef const unsigned char* qp = &q_bytes[0]
    cdef const unsigned char* vp = &v_bytes[0] if n > 0 else NULL
    cdef const unsigned char* op = &o_bytes[0] if n > 0 else NULL
    cdef double* q = <double*>malloc(dim * sizeof(double))
    cdef Py_ssize_t capacity = top if top < n else n
    cdef Hit* heap = <Hit*>malloc((capacity if capacity > 0 else 1) * sizeof(Hit))
    cdef Py_ssize_t size = 0, i, j
    cdef double dot, q_norm, v_norm, sum_sq, score
    try:
        if q == NULL or heap == NULL:
            raise MemoryError()
        with nogil:
            for i in range(dim):
                q[i] = _f32(qp + 4 * i)
            _row_sums(q, qp, dim, &dot, &sum_sq)  # the query as a row: its sum_sq is |q|^2
            q_norm = sqrt(sum_sq)
            for j in range(n):
                _row_sums(q, vp + 4 * dim * j, dim, &dot, &sum_sq)
                v_norm = sqrt(sum_sq)
                if q_norm == 0 or v_norm == 0:
                    score = 0
                else:
                    score = dot / (q_norm * v_norm)
                if score == score:  # a NaN or infinite component makes NaN: left out
                    _offer(heap, &size, capacity, score, _u32(op + 4 * j))
        return _best_first(heap, size)
    finally:
        free(q)
        free(heap)
