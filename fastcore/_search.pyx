# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -ffp-contract=off
"""Relevance ranking for memory search, compiled: BM25 over postings, cosine over embeddings.

Every function here has a readable twin in ``fastcore/_search_reference.py`` that documents it
and that the tests hold it to, ordinal for ordinal. Plain values in and out: bytes-like
postings and vectors, floats, ints; this module knows nothing of LMDB or protobuf.

Both rank with a bounded heap of the ``top`` best hits: the caller walks the ranking under a
token budget and needs its head, never the full sort. Scores are computed with the twin's
operations in the twin's order, and the compile flag above keeps the C compiler from fusing a
multiply and an add (one rounding instead of two) where the target has FMA, so both produce
the same doubles and break ties the same way: equal scores, larger (newer) ordinal first.
"""

from libc.math cimport sqrt
from libc.stdint cimport uint16_t, uint32_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

cdef enum:
    _POSTING_SIZE = 8
    _NORM_TABLE = 1024  # entry lengths below this get their length normalisation from a table
    _LANES = 8  # cosine sums run in this many interleaved lanes (a power of two)

POSTING_SIZE = _POSTING_SIZE
LANES = _LANES


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

def bm25_top(postings, idfs, double avgdl, double k1, double b, Py_ssize_t n_ordinals, Py_ssize_t top):
    """The ``top`` entries by BM25 score, best first. See ``_search_reference.bm25_top``."""
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
    cdef const unsigned char[::1] view
    cdef const unsigned char** records = <const unsigned char**>malloc(terms_alloc * sizeof(void*))
    cdef Py_ssize_t* counts = <Py_ssize_t*>malloc(terms_alloc * sizeof(Py_ssize_t))
    cdef double* term_idfs = <double*>malloc(terms_alloc * sizeof(double))
    # Dense by ordinal: a random-access add per posting, then one pass in ordinal order.
    cdef double* scores = <double*>calloc(n_ordinals if n_ordinals > 0 else 1, sizeof(double))
    cdef Hit* heap = <Hit*>malloc((capacity if capacity > 0 else 1) * sizeof(Hit))
    cdef Py_ssize_t size = 0, r, o
    cdef const unsigned char* p
    cdef uint32_t ordinal, bad_ordinal = 0
    cdef uint16_t tf, dl
    cdef double idf, score, norm
    cdef double norms[_NORM_TABLE]
    cdef bint bad = False
    try:
        if records == NULL or counts == NULL or term_idfs == NULL or scores == NULL or heap == NULL:
            raise MemoryError()
        for term in range(n_terms):
            view = views[term]
            records[term] = &view[0] if view.shape[0] > 0 else NULL
            counts[term] = view.shape[0] // _POSTING_SIZE
            term_idfs[term] = idfs[term]
        with nogil:
            # k1 * (1 - b + b * dl / avgdl), the same expression and so the same double as the
            # twin's, computed once per length: a division per posting saved.
            for dl in range(_NORM_TABLE):
                norms[dl] = k1 * (1 - b + b * dl / avgdl)
            # Term by term, each term's records in the order given: every entry's sum is added
            # up in term order, as the twin adds it, whatever order the records come in.
            for term in range(n_terms):
                idf = term_idfs[term]
                for r in range(counts[term]):
                    p = records[term] + r * _POSTING_SIZE
                    ordinal = _u32(p)
                    if ordinal >= n_ordinals:
                        bad = True
                        bad_ordinal = ordinal
                        break
                    tf = _u16(p + 4)
                    if tf == 0:
                        continue  # not an occurrence; 0 / 0 when k1 == 0
                    dl = _u16(p + 6)
                    norm = norms[dl] if dl < _NORM_TABLE else k1 * (1 - b + b * dl / avgdl)
                    scores[ordinal] += idf * tf * (k1 + 1) / (tf + norm)
                if bad:
                    break
            if not bad:
                # Newest first: a later candidate that only ties the worst kept hit is older
                # and cannot evict it, so runs of equal scores cost no heap work.
                for o in range(n_ordinals - 1, -1, -1):
                    score = scores[o]
                    # > 0 also leaves out NaN (from a NaN idf); most candidates fall at the
                    # second test once the heap is full.
                    if score > 0 and (size < capacity or score > heap[0].score):
                        _offer(heap, &size, capacity, score, <uint32_t>o)
        if bad:
            raise ValueError(f"ordinal {bad_ordinal} out of range for n_ordinals={n_ordinals}")
        return _best_first(heap, size)
    finally:
        free(records)
        free(counts)
        free(term_idfs)
        free(scores)
        free(heap)


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
