# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Multi-pattern byte matching for secret redaction, compiled. Plain values in and out: bytes,
ints, lists, tuples.

``MultiMatcher`` has a readable twin in ``fastcore/_matcher_reference.py`` that documents the
contract (leftmost-longest, non-overlapping matches) and that the tests hold this class to.

How: an Aho-Corasick automaton over byte classes (every byte that occurs in a pattern is its own
class, all other bytes share class 0), so a scan costs one transition per input byte whatever
the number of patterns. States are numbered breadth-first, so shallow states come first: those
up to ``_DENSE_DEPTH`` bytes deep get a full row of transitions (a DFA: one load per byte), the
deeper ones keep only their trie children and a failure link. Text that is not a secret rarely
gets more than two or three bytes into the trie, and failure links cost O(1) per byte amortised,
so memory stays at (shallow states x classes) plus a few words per pattern byte.

Leftmost-longest without subtlety: the automaton is built from the *reversed* patterns and runs
from the end of the data to its start, so the state reached at position t names the longest
pattern that starts at t (a forward automaton knows the longest pattern that *ends* somewhere,
which is not what leftmost-longest needs). A forward pass over those (start, length) pairs then
takes the leftmost, skips what it covers, and so on: exactly the twin's definition, in O(n) with
no rescans, whatever the overlaps. The data goes in chunks (each read a longest pattern's length
past its end, so that every start in it sees all its patterns), which bounds the pairs held.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint16_t, uint32_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset

cdef enum:
    # States this shallow get a dense row: as deep as ordinary text gets into random secrets.
    _DENSE_DEPTH = 3
    # ... and at most this many dense cells (4 bytes each), whatever the patterns.
    _DENSE_CELLS = 1 << 20
    # A flag on a state's code: some pattern starts at the byte that led there (codes stay below).
    _HAS_OUTPUT = 1 << 30


ctypedef struct _Automaton:
    uint32_t n_states
    uint32_t n_dense          # states [0, n_dense) have a dense row
    uint32_t n_classes
    uint32_t dense_end        # n_dense x n_classes: where sparse states' codes begin
    size_t longest            # the longest pattern's length
    uint16_t classes[256]     # byte -> class; 0 is every byte that occurs in no pattern
    uint32_t* dense           # n_dense x n_classes: the next state's code (its id while building)
    uint32_t* fail            # the longest proper suffix of this state's string that is a state
    uint32_t* first_child     # n_states + 1: a state's children are the ids [first_child[s], first_child[s + 1])
    uint16_t* edge_class      # the class of the byte leading into each state (children sorted by it)
    uint32_t* out_len         # the longest pattern that is a suffix of this state's string, 0 if none
    uint32_t* out_index       # ... and its index (the lowest among equal patterns)


ctypedef struct _Match:
    Py_ssize_t start
    Py_ssize_t end
    uint32_t index


ctypedef struct _Matches:
    _Match* items
    Py_ssize_t count
    Py_ssize_t capacity


cdef void _free_automaton(_Automaton* a) noexcept nogil:
    free(a.dense)
    free(a.fail)
    free(a.first_child)
    free(a.edge_class)
    free(a.out_len)
    free(a.out_index)
    memset(a, 0, sizeof(_Automaton))


cdef inline uint32_t _child(const _Automaton* a, uint32_t s, uint32_t c) noexcept nogil:
    """The child of ``s`` on a byte of class ``c``, or 0 (the root, nobody's child)."""
    cdef uint32_t lo = a.first_child[s], end = a.first_child[s + 1], hi = end, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if a.edge_class[mid] < c:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < end and a.edge_class[lo] == c else 0


cdef inline uint32_t _step(const _Automaton* a, uint32_t s, uint32_t c) noexcept nogil:
    """While building (dense rows hold ids): the state after a byte of class ``c`` in ``s``."""
    cdef uint32_t child
    while s >= a.n_dense:
        # A sparse state: its child on c, else the same question one failure link shallower.
        child = _child(a, s, c)
        if child != 0:
            return child
        s = a.fail[s]
    return a.dense[<size_t>s * a.n_classes + c]


cdef inline uint32_t _code(const _Automaton* a, uint32_t s) noexcept nogil:
    """A state as the scan carries it: a dense state by its row's offset (no multiply per
    byte), a sparse one past the table's end; flagged when it completes a (reversed) pattern,
    which is when a pattern starts at the byte just read."""
    cdef uint32_t code = s * a.n_classes if s < a.n_dense else a.dense_end + (s - a.n_dense)
    return code | _HAS_OUTPUT if a.out_len[s] != 0 else code


cdef inline uint32_t _state(const _Automaton* a, uint32_t code) noexcept nogil:
    """The id of an (unflagged) code."""
    return code // a.n_classes if code < a.dense_end else code - a.dense_end + a.n_dense


cdef inline uint32_t _sparse_next(const _Automaton* a, uint32_t s, uint32_t c) noexcept nogil:
    """While scanning: the code of the state after a byte of class ``c`` in sparse state ``s``."""
    cdef uint32_t child
    while s >= a.n_dense:
        child = _child(a, s, c)
        if child != 0:
            return _code(a, child)
        s = a.fail[s]
    return a.dense[<size_t>s * a.n_classes + c]


cdef int _build(_Automaton* a, const unsigned char* joined, const size_t* offsets,
                const uint32_t* indexes, Py_ssize_t m) noexcept nogil:
    """Build the automaton from ``m`` patterns (the reversed ones, for the scan) sorted
    bytewise, equal ones by index, stored back to back in ``joined``: pattern k is
    ``joined[offsets[k]:offsets[k + 1]]``, its index ``indexes[k]``. Returns 0, or -1 when out
    of memory (``a`` then holds what was allocated, for ``_free_automaton``)."""
    cdef uint32_t* lcp = <uint32_t*>malloc(m * sizeof(uint32_t))
    cdef uint32_t* node_at = <uint32_t*>calloc(m, sizeof(uint32_t))
    cdef Py_ssize_t* active = <Py_ssize_t*>malloc(m * sizeof(Py_ssize_t))
    cdef uint32_t* parent = NULL
    cdef unsigned char seen[256]
    cdef Py_ssize_t k
    cdef size_t length, other_length, x
    cdef uint32_t b, n_classes, n_states
    cdef int rc = -1

    memset(a, 0, sizeof(_Automaton))
    if lcp == NULL or node_at == NULL or active == NULL:
        free(lcp)
        free(node_at)
        free(active)
        return -1

    # Byte classes, in byte order so that children sorted by byte are sorted by class too.
    memset(seen, 0, sizeof(seen))
    for x in range(offsets[m]):
        seen[joined[x]] = 1
    n_classes = 1
    for b in range(256):
        if seen[b]:
            a.classes[b] = <uint16_t>n_classes
            n_classes += 1
    a.n_classes = n_classes

    # lcp[k]: the common prefix of patterns k - 1 and k; each pattern adds a state per byte past it.
    n_states = 1
    for k in range(m):
        length = offsets[k + 1] - offsets[k]
        x = 0
        if k > 0:
            other_length = offsets[k] - offsets[k - 1]
            while x < length and x < other_length and joined[offsets[k] + x] == joined[offsets[k - 1] + x]:
                x += 1
        lcp[k] = <uint32_t>x
        if length > a.longest:
            a.longest = length
        n_states += <uint32_t>(length - x)
        active[k] = k
    a.n_states = n_states

    a.fail = <uint32_t*>malloc(n_states * sizeof(uint32_t))
    a.first_child = <uint32_t*>calloc(n_states + 1, sizeof(uint32_t))
    a.edge_class = <uint16_t*>calloc(n_states, sizeof(uint16_t))
    a.out_len = <uint32_t*>calloc(n_states, sizeof(uint32_t))
    a.out_index = <uint32_t*>calloc(n_states, sizeof(uint32_t))
    parent = <uint32_t*>calloc(n_states, sizeof(uint32_t))
    if a.fail != NULL and a.first_child != NULL and a.edge_class != NULL \
            and a.out_len != NULL and a.out_index != NULL and parent != NULL:
        _make_trie(a, joined, offsets, indexes, m, lcp, node_at, active, parent)
        rc = _link(a, parent)
    free(lcp)
    free(node_at)
    free(active)
    free(parent)
    return rc


cdef void _make_trie(_Automaton* a, const unsigned char* joined, const size_t* offsets,
                     const uint32_t* indexes, Py_ssize_t m, const uint32_t* lcp, uint32_t* node_at,
                     Py_ssize_t* active, uint32_t* parent) noexcept nogil:
    """The trie, breadth-first, straight from the sorted patterns (no map): at depth d,
    pattern k shares pattern k - 1's node exactly when their common prefix is at least d long.
    Children of a state get consecutive ids, in byte order; sets ``n_dense``."""
    cdef Py_ssize_t j, k, w, n_active = m
    cdef uint32_t d = 1, v = 1, u, running, count
    cdef uint32_t n_dense = a.n_states
    while n_active > 0:
        w = 0
        for j in range(n_active):
            k = active[j]
            if lcp[k] >= d:
                node_at[k] = node_at[k - 1]  # the same d-byte prefix: made a moment ago
            else:
                parent[v] = node_at[k]
                a.first_child[node_at[k]] += 1  # a count for now, offsets below
                a.edge_class[v] = a.classes[joined[offsets[k] + d - 1]]
                node_at[k] = v
                v += 1
            if offsets[k + 1] - offsets[k] == d:
                if a.out_len[node_at[k]] == 0:  # equal patterns: the first (lowest index) wins
                    a.out_len[node_at[k]] = d
                    a.out_index[node_at[k]] = indexes[k]
            else:
                active[w] = k
                w += 1
        n_active = w
        if d == _DENSE_DEPTH:
            n_dense = v
        d += 1
    if n_dense > _DENSE_CELLS // a.n_classes:
        n_dense = _DENSE_CELLS // a.n_classes
    a.n_dense = n_dense if n_dense > 0 else 1

    running = 1
    for u in range(a.n_states):
        count = a.first_child[u]
        a.first_child[u] = running
        running += count
    a.first_child[a.n_states] = running


cdef int _link(_Automaton* a, const uint32_t* parent) noexcept nogil:
    """Failure links, outputs and dense rows, in id (breadth-first) order: all a state needs
    belongs to shallower states, which come first. Returns 0, or -1 when out of memory."""
    cdef uint32_t v, u, f, c, n_classes = a.n_classes
    cdef size_t x
    a.dense = <uint32_t*>calloc(<size_t>a.n_dense * n_classes, sizeof(uint32_t))
    if a.dense == NULL:
        return -1
    a.fail[0] = 0
    for v in range(a.n_states):
        if v > 0:
            u = parent[v]
            f = 0 if u == 0 else _step(a, a.fail[u], a.edge_class[v])
            a.fail[v] = f
            if a.out_len[v] == 0:
                a.out_len[v] = a.out_len[f]
                a.out_index[v] = a.out_index[f]
            if v < a.n_dense:
                memcpy(a.dense + <size_t>v * n_classes, a.dense + <size_t>f * n_classes,
                       n_classes * sizeof(uint32_t))
        if v < a.n_dense:
            for c in range(a.first_child[v], a.first_child[v + 1]):
                a.dense[<size_t>v * n_classes + a.edge_class[c]] = c
    # Ids to codes, now that building (which steps by ids) is over.
    a.dense_end = a.n_dense * n_classes
    for x in range(a.dense_end):
        a.dense[x] = _code(a, a.dense[x])
    return 0


cdef int _push(_Matches* out, Py_ssize_t start, Py_ssize_t end, uint32_t index) noexcept nogil:
    cdef Py_ssize_t capacity
    cdef _Match* items
    if out.count == out.capacity:
        capacity = out.capacity * 2 if out.capacity else 16
        items = <_Match*>realloc(out.items, capacity * sizeof(_Match))
        if items == NULL:
            return -1
        out.items = items
        out.capacity = capacity
    out.items[out.count].start = start
    out.items[out.count].end = end
    out.items[out.count].index = index
    out.count += 1
    return 0


cdef int _scan(const _Automaton* a, const unsigned char* p, Py_ssize_t n, _Matches* out,
               _Matches* starts) noexcept nogil:
    """Append the leftmost-longest non-overlapping matches in ``p[:n]`` to ``out`` (``starts``
    is scratch). Returns 0, or -1 when out of memory."""
    cdef Py_ssize_t chunk = 65536 if 65536 > 4 * a.longest else 4 * a.longest
    cdef Py_ssize_t begin = 0, end, read_to, i, j, pos = 0
    cdef uint32_t code, s, c
    cdef const uint16_t* classes = &a.classes[0]
    cdef const uint32_t* dense = a.dense
    cdef uint32_t dense_end = a.dense_end
    cdef _Match* m
    while begin < n:
        end = begin + chunk if n - begin > chunk else n
        read_to = end + <Py_ssize_t>a.longest - 1 if n - end > <Py_ssize_t>a.longest - 1 else n
        if pos > begin:
            begin = pos  # starts before pos are inside the last match taken: not needed
        # Backwards: at i, the state's output is the longest pattern starting at i.
        starts.count = 0
        code = 0
        i = read_to
        while i > begin:
            i -= 1
            c = classes[p[i]]
            if code < dense_end:
                code = dense[code + c]
            else:
                code = _sparse_next(a, code - dense_end + a.n_dense, c)
            if code & _HAS_OUTPUT:
                code ^= _HAS_OUTPUT
                if i < end:
                    s = _state(a, code)
                    if _push(starts, i, i + a.out_len[s], a.out_index[s]) < 0:
                        return -1
        # Forwards (``starts`` holds them last to first): take the leftmost, skip what it covers.
        for j in range(starts.count - 1, -1, -1):
            m = &starts.items[j]
            if m.start >= pos:
                if _push(out, m.start, m.end, m.index) < 0:
                    return -1
                pos = m.end
        begin = end
    return 0


cdef class MultiMatcher:
    """Finds every registered pattern in one pass. See ``_matcher_reference.MultiMatcher``."""

    cdef _Automaton _a
    cdef Py_ssize_t _count

    def __init__(self, patterns):
        cdef list pats = [p if type(p) is bytes else bytes(memoryview(p)) for p in patterns]
        cdef list reversed_pats
        cdef Py_ssize_t m = len(pats), k
        cdef bytes joined
        cdef size_t* offsets
        cdef uint32_t* indexes
        cdef _Automaton built
        cdef const unsigned char* joined_p
        cdef int rc
        if self._a.n_states != 0:
            # Scans run without the GIL: swapping the automaton under one would free it mid-scan.
            raise RuntimeError("a MultiMatcher cannot be re-initialised; make a new one")
        if m == 0:
            raise ValueError("at least one pattern is required")
        for k in range(m):
            if len(<bytes>pats[k]) == 0:
                raise ValueError(f"pattern {k} is empty")
        if m > 0xFFFFFFFE:
            raise ValueError("too many patterns")
        reversed_pats = [(<bytes>p)[::-1] for p in pats]
        order = sorted(range(m), key=reversed_pats.__getitem__)  # stable: equal ones stay in index order
        joined = b"".join([reversed_pats[k] for k in order])
        offsets = <size_t*>malloc((m + 1) * sizeof(size_t))
        indexes = <uint32_t*>malloc(m * sizeof(uint32_t))
        try:
            if offsets == NULL or indexes == NULL:
                raise MemoryError()
            offsets[0] = 0
            for k in range(m):
                offsets[k + 1] = offsets[k] + len(<bytes>pats[order[k]])
                indexes[k] = order[k]
            if offsets[m] >= _HAS_OUTPUT - _DENSE_CELLS:  # every code must stay below the flag
                raise ValueError("patterns too long in total")
            joined_p = <const unsigned char*>PyBytes_AS_STRING(joined)
            with nogil:
                rc = _build(&built, joined_p, offsets, indexes, m)
            if rc < 0:
                _free_automaton(&built)
                raise MemoryError()
        finally:
            free(offsets)
            free(indexes)
        self._a = built
        self._count = m

    def __dealloc__(self):
        _free_automaton(&self._a)

    @property
    def patterns_count(self):
        return self._count

    cdef int _find(self, const unsigned char[::1] data, _Matches* out) except -1:
        cdef Py_ssize_t n = data.shape[0]
        cdef _Matches starts
        cdef int rc = 0
        if self._a.n_states == 0:
            raise ValueError("MultiMatcher.__init__ was not called")
        if n == 0:
            return 0
        starts.items = NULL
        starts.count = starts.capacity = 0
        with nogil:
            rc = _scan(&self._a, &data[0], n, out, &starts)
            free(starts.items)
        if rc < 0:
            raise MemoryError()
        return 0

    def find(self, const unsigned char[::1] data not None):
        """``(start, end, pattern_index)`` of every leftmost-longest non-overlapping match."""
        cdef _Matches out
        cdef Py_ssize_t j
        out.items = NULL
        out.count = out.capacity = 0
        try:
            self._find(data, &out)
            return [(out.items[j].start, out.items[j].end, out.items[j].index) for j in range(out.count)]
        finally:
            free(out.items)

    def replace(self, const unsigned char[::1] data not None, replacements):
        """``data`` with every match replaced by ``replacements[pattern_index]``, and the
        indexes matched, in order. Only the replacements of matched patterns are read."""
        cdef _Matches out
        cdef Py_ssize_t j, total, pos
        cdef list chosen, matched
        cdef bytes r, result
        cdef char* w
        if len(replacements) != self._count:
            raise ValueError(f"{len(replacements)} replacements for {self._count} patterns")
        out.items = NULL
        out.count = out.capacity = 0
        try:
            self._find(data, &out)
            chosen = []
            matched = []
            total = data.shape[0]
            for j in range(out.count):
                value = replacements[out.items[j].index]
                r = value if type(value) is bytes else bytes(memoryview(value))
                chosen.append(r)
                matched.append(out.items[j].index)
                total += len(r) - (out.items[j].end - out.items[j].start)
            result = PyBytes_FromStringAndSize(NULL, total)
            w = PyBytes_AS_STRING(result)
            pos = 0
            for j in range(out.count):
                if out.items[j].start > pos:
                    memcpy(w, &data[pos], out.items[j].start - pos)
                    w += out.items[j].start - pos
                r = <bytes>chosen[j]
                if len(r):
                    memcpy(w, PyBytes_AS_STRING(r), len(r))
                    w += len(r)
                pos = out.items[j].end
            if data.shape[0] > pos:
                memcpy(w, &data[pos], data.shape[0] - pos)
            return result, matched
        finally:
            free(out.items)
