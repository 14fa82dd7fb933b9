# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The sidecar's tight loops, compiled. Plain values in and out: bytes, ints, tuples.

Every function here has a readable twin in ``fastcore/_fastcore_reference.py`` that documents it and
that the tests hold it to. This module knows nothing of LMDB or protobuf.
"""

from libc.stdint cimport uint32_t, uint64_t, int64_t
from libc.stdlib cimport malloc, free

# A count record, as sidecar/transcript/schema.py declares it (COUNT_RECORD, "<III"): three
# little-endian uint32 at these offsets (tests/test_architecture.py compares).
cdef enum:
    _RECORD_SIZE = 12
    _TOKENS_AT = 0
    _ITERATION_AT = 4
    _GROUP_FIRST_AT = 8

cdef uint32_t _NOT_A_UNIT = 0xFFFFFFFF

RECORD_SIZE = _RECORD_SIZE
NOT_A_UNIT = _NOT_A_UNIT


cdef inline uint32_t _u32(const unsigned char* p) noexcept nogil:
    # Records are little-endian on every platform; compilers turn this into one load on LE.
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


def count_code_points(const unsigned char[::1] data not None):
    """Unicode code points in ``data`` (valid UTF-8): every byte that is not a continuation byte."""
    cdef Py_ssize_t i, n = data.shape[0]
    cdef Py_ssize_t count = 0
    if n == 0:
        return 0
    cdef const unsigned char* p = &data[0]
    with nogil:
        for i in range(n):
            count += (p[i] & 0xC0) != 0x80
    return count


cdef int64_t _capped_sum(const unsigned char* p, Py_ssize_t lo, Py_ssize_t hi, uint32_t cap) noexcept nogil:
    cdef int64_t total = 0
    cdef uint32_t t
    cdef Py_ssize_t i
    for i in range(lo, hi):
        t = _u32(p + i * _RECORD_SIZE + _TOKENS_AT)
        total += t if t < cap else cap
    return total


cdef uint32_t _clip_cap(const unsigned char* p, Py_ssize_t lo, Py_ssize_t hi, int64_t budget) noexcept nogil:
    # Binary search for the largest cap whose capped sum still fits (water-filling).
    cdef uint32_t low = 0, high = 0, mid, t
    cdef Py_ssize_t i
    for i in range(lo, hi):
        t = _u32(p + i * _RECORD_SIZE + _TOKENS_AT)
        if t > high:
            high = t
    while low < high:
        mid = <uint32_t>((<uint64_t>low + high + 1) // 2)
        if _capped_sum(p, lo, hi, mid) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


cdef inline int64_t _group_first(const unsigned char* p, Py_ssize_t j, int64_t base_seq,
                                 int64_t floor_seq) noexcept nogil:
    # A non-unit stands alone; a group reaching below the floor counts as starting there.
    cdef uint32_t g = _u32(p + j * _RECORD_SIZE + _GROUP_FIRST_AT)
    if g == _NOT_A_UNIT:
        return base_seq + j
    return g if g > floor_seq else floor_seq


cdef int64_t* _suffix_min(const unsigned char* p, Py_ssize_t n, int64_t base_seq, int64_t floor_seq) noexcept nogil:
    """suffix_min[j]: the smallest group start among events at or after j (end for j == n).
    A cut at j keeps every group whole exactly when suffix_min[j] >= base_seq + j."""
    cdef int64_t* suffix_min = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    cdef Py_ssize_t j
    cdef int64_t g
    if suffix_min == NULL:
        return NULL
    suffix_min[n] = base_seq + n
    for j in range(n - 1, -1, -1):
        g = _group_first(p, j, base_seq, floor_seq)
        suffix_min[j] = g if g < suffix_min[j + 1] else suffix_min[j + 1]
    return suffix_min


def select_window(const unsigned char[::1] records not None, int64_t base_seq, int64_t active_iteration,
                  int64_t budget, int64_t max_events, int64_t floor_seq=0, prefix_tokens=()):
    """Choose the transcript window. See ``_fastcore_reference.select_window`` for the contract."""
    cdef Py_ssize_t n = records.shape[0] // _RECORD_SIZE
    cdef const unsigned char* p = &records[0] if records.shape[0] > 0 else NULL
    cdef int64_t end = base_seq + n
    cdef Py_ssize_t floor = floor_seq - base_seq if floor_seq > base_seq else 0
    cdef int64_t* suffix_min
    cdef Py_ssize_t j, active_start, mandatory, cut
    cdef int64_t total = 0, units = 0, capped = 0
    cdef uint32_t cap = 0, t
    cdef int need_more = 0, clipped = 0
    cdef Py_ssize_t prefix_in = 0, k
    cdef list prefix = list(prefix_tokens)

    suffix_min = _suffix_min(p, n, base_seq, floor_seq)
    if suffix_min == NULL:
        raise MemoryError()
    try:
        with nogil:
            active_start = n
            while active_start > floor and \
                    _u32(p + (active_start - 1) * _RECORD_SIZE + _ITERATION_AT) >= active_iteration:
                active_start -= 1
            if active_start == 0 and base_seq > floor_seq and n > 0:
                need_more = 1

            if not need_more:
                # The largest cut at or before the active turn that keeps every group whole.
                mandatory = active_start
                while mandatory > floor and suffix_min[mandatory] < base_seq + mandatory:
                    mandatory -= 1
                if mandatory == 0 and base_seq > floor_seq and suffix_min[0] < base_seq:
                    need_more = 1

            if not need_more:
                total = _capped_sum(p, mandatory, n, 0xFFFFFFFF)
                if total > budget:
                    clipped = 1
                    cap = _clip_cap(p, mandatory, n, budget)
                    capped = _capped_sum(p, mandatory, n, cap)
                else:
                    for j in range(mandatory, n):
                        units += _u32(p + j * _RECORD_SIZE + _GROUP_FIRST_AT) != _NOT_A_UNIT
                    cut = mandatory
                    while True:
                        if cut == floor:
                            if base_seq > floor_seq:
                                need_more = 1
                            break
                        if _u32(p + (cut - 1) * _RECORD_SIZE + _GROUP_FIRST_AT) != _NOT_A_UNIT:
                            if max_events > 0 and units >= max_events:
                                break
                            if total + _u32(p + (cut - 1) * _RECORD_SIZE + _TOKENS_AT) > budget:
                                break
                            units += 1
                        cut -= 1
                        total += _u32(p + cut * _RECORD_SIZE + _TOKENS_AT)
                    if not need_more:
                        # Never split a group: move the cut newer until groups stay whole.
                        while suffix_min[cut] < base_seq + cut:
                            cut += 1
                        total = _capped_sum(p, cut, n, 0xFFFFFFFF)
                        units = 0
                        for j in range(cut, n):
                            units += _u32(p + j * _RECORD_SIZE + _GROUP_FIRST_AT) != _NOT_A_UNIT
    finally:
        free(suffix_min)

    if need_more:
        return None
    if clipped:
        return (base_seq + mandatory, base_seq + mandatory, capped, cap, 0)
    if cut == floor:
        # All unsummarised events are in: the summaries before them come in, newest first.
        for k in range(len(prefix) - 1, -1, -1):
            if (max_events > 0 and units >= max_events) or total + prefix[k] > budget:
                break
            total += prefix[k]
            units += 1
            prefix_in += 1
    # The window starts at its oldest event that is transcript: log entries at its edge stay out.
    while cut < mandatory and _u32(p + cut * _RECORD_SIZE + _GROUP_FIRST_AT) == _NOT_A_UNIT:
        cut += 1
    return (base_seq + cut, base_seq + mandatory, total, -1, prefix_in)


def compaction_cut(const unsigned char[::1] records not None, int64_t base_seq, int64_t floor_seq,
                   int64_t protect_from, int64_t max_tokens, bint whole=False):
    """The oldest half (``whole``: all) of what may be summarised. See ``_fastcore_reference.compaction_cut``."""
    if base_seq > floor_seq:
        raise ValueError("records must start at or before floor_seq")
    cdef Py_ssize_t n = records.shape[0] // _RECORD_SIZE
    cdef const unsigned char* p = &records[0] if records.shape[0] > 0 else NULL
    cdef int64_t end = base_seq + n
    cdef Py_ssize_t floor = floor_seq - base_seq
    cdef Py_ssize_t protect
    cdef Py_ssize_t cut, best, first_whole = -1
    cdef int64_t total = 0, target
    cdef int64_t* suffix_min
    if protect_from < floor_seq:
        protect_from = floor_seq
    if protect_from > end:
        protect_from = end
    protect = protect_from - base_seq
    if floor > n:
        return (floor_seq, 0, 0)
    suffix_min = _suffix_min(p, n, base_seq, floor_seq)
    if suffix_min == NULL:
        raise MemoryError()
    with nogil:
        target = _capped_sum(p, floor, protect, 0xFFFFFFFF)
        if not whole:
            target //= 2
        if target > max_tokens:
            target = max_tokens
        best = floor
        for cut in range(floor + 1, protect + 1):
            total += _u32(p + (cut - 1) * _RECORD_SIZE + _TOKENS_AT)
            if suffix_min[cut] < base_seq + cut:
                continue  # this cut would split a group
            if first_whole < 0:
                first_whole = cut
            if total > target:
                break
            best = cut
        if best == floor and first_whole >= 0:
            best = first_whole
        total = _capped_sum(p, floor, best, 0xFFFFFFFF)
    free(suffix_min)
    return (base_seq + best, total, _capped_sum(p, floor, n, 0xFFFFFFFF))


def splits_group(const unsigned char[::1] records not None, int64_t base_seq, int64_t floor_seq, int64_t cut):
    """The first seq at or after ``cut`` in a group started before it. See ``_fastcore_reference.splits_group``."""
    cdef Py_ssize_t n = records.shape[0] // _RECORD_SIZE
    cdef const unsigned char* p = &records[0] if records.shape[0] > 0 else NULL
    cdef Py_ssize_t j
    cdef int64_t found = -1
    with nogil:
        for j in range(n):
            if base_seq + j >= cut and _u32(p + j * _RECORD_SIZE + _GROUP_FIRST_AT) != _NOT_A_UNIT \
                    and _group_first(p, j, base_seq, floor_seq) < cut:
                found = base_seq + j
                break
    return found


def own_entries(const unsigned char[::1] records not None, int64_t base_seq):
    """The seqs of the log entries that are not transcript. See ``_fastcore_reference.own_entries``."""
    cdef Py_ssize_t n = records.shape[0] // _RECORD_SIZE
    cdef const unsigned char* p = &records[0] if records.shape[0] > 0 else NULL
    cdef Py_ssize_t j
    found = []
    for j in range(n):
        if _u32(p + j * _RECORD_SIZE + _GROUP_FIRST_AT) == _NOT_A_UNIT:
            found.append(base_seq + j)
    return found


cdef inline bint _boundary(const unsigned char* p, Py_ssize_t j, Py_ssize_t n, Py_ssize_t floor,
                           int64_t base_seq, const int64_t* suffix_min) noexcept nogil:
    # A turn boundary that keeps every group whole (the caller never asks at 0 with records before).
    if not (j == floor or j == n
            or _u32(p + (j - 1) * _RECORD_SIZE + _ITERATION_AT) != _u32(p + j * _RECORD_SIZE + _ITERATION_AT)):
        return False
    return suffix_min[j] >= base_seq + j


def recent_start(const unsigned char[::1] records not None, int64_t base_seq, int64_t active_iteration,
                 int64_t keep_turns, int64_t max_tokens, int64_t floor_seq=0):
    """Where the recent turns start. See ``_fastcore_reference.recent_start`` for the contract."""
    cdef Py_ssize_t n = records.shape[0] // _RECORD_SIZE
    cdef const unsigned char* p = &records[0] if records.shape[0] > 0 else NULL
    cdef Py_ssize_t floor = floor_seq - base_seq if floor_seq > base_seq else 0
    cdef bint more_before = base_seq > floor_seq
    cdef Py_ssize_t start = n, position
    cdef int64_t total = 0
    cdef bint need_more = 0
    cdef int64_t* suffix_min = _suffix_min(p, n, base_seq, floor_seq)
    if suffix_min == NULL:
        raise MemoryError()
    with nogil:
        while start > floor and \
                <int64_t>_u32(p + (start - 1) * _RECORD_SIZE + _ITERATION_AT) > active_iteration - keep_turns:
            start -= 1
        while True:
            if start == 0 and more_before:
                need_more = 1  # the turn, or a group, may begin before these records
                break
            if _boundary(p, start, n, floor, base_seq, suffix_min):
                break
            start -= 1
        if not need_more:
            total = _capped_sum(p, start, n, 0xFFFFFFFF)
            position = start
            while position > floor:
                position -= 1
                total += _u32(p + position * _RECORD_SIZE + _TOKENS_AT)
                if total > max_tokens:
                    break  # every older boundary holds more still
                if position == 0 and more_before:
                    need_more = 1  # whether it is a boundary lies before these records
                    break
                if _boundary(p, position, n, floor, base_seq, suffix_min):
                    start = position
        free(suffix_min)
    if need_more:
        return None
    return base_seq + start


def select_stable_window(const unsigned char[::1] records not None, int64_t base_seq, int64_t active_iteration,
                         int64_t budget, int64_t max_events, int64_t floor_seq=0, prefix_tokens=(),
                         int64_t previous_start=-1, int64_t previous_prefix_in=0, double trim_fraction=0.6,
                         int64_t keep_turns=1):
    """The cache-stable window: the previous start kept while everything fits, else a summary
    recorded since fed, else one step forward to ``trim_fraction`` of the bounds, never past the
    recent turns. See ``_fastcore_reference.select_stable_window``."""
    chosen = select_window(records, base_seq, active_iteration, budget, max_events, floor_seq, prefix_tokens)
    if chosen is None:
        return None
    cdef int64_t mandatory_seq = chosen[1]
    if chosen[3] >= 0:
        return chosen  # the active turn alone is over the budget: clipped, nothing else in
    cdef Py_ssize_t n = records.shape[0] // _RECORD_SIZE
    cdef const unsigned char* p = &records[0] if records.shape[0] > 0 else NULL
    cdef Py_ssize_t floor = floor_seq - base_seq if floor_seq > base_seq else 0
    cdef Py_ssize_t mandatory = mandatory_seq - base_seq
    cdef Py_ssize_t start = previous_start - base_seq, j
    cdef list prefix = list(prefix_tokens)
    cdef Py_ssize_t m = len(prefix), summaries = 0, k
    cdef int64_t fed_tokens = 0, fed_units = 0, trim_tokens, trim_events, mandatory_tokens
    cdef int64_t* suffix_min

    if previous_start > floor_seq:
        if start < 1 and base_seq > floor_seq:
            return None  # whether log entries precede the start lies before these records
        while start > floor and _u32(p + (start - 1) * _RECORD_SIZE + _GROUP_FIRST_AT) == _NOT_A_UNIT:
            start -= 1  # log entries weigh nothing: the same window starts before them
        if start == 0 and base_seq > floor_seq:
            return None
    if previous_start <= floor_seq or start <= floor:
        if base_seq > floor_seq:
            return None
        start = floor
        if previous_start < floor_seq:
            summaries = m
        else:
            summaries = previous_prefix_in if previous_prefix_in < m else m
    if start > mandatory:
        start = mandatory
        summaries = 0
    suffix_min = _suffix_min(p, n, base_seq, floor_seq)
    if suffix_min == NULL:
        raise MemoryError()
    with nogil:
        # Never split a group: move the start newer (mandatory at the latest keeps groups whole).
        while suffix_min[start] < base_seq + start:
            start += 1
            summaries = 0
        free(suffix_min)
        if start > floor:
            summaries = 0
        fed_tokens = _capped_sum(p, start, n, 0xFFFFFFFF)
        for j in range(start, n):
            fed_units += _u32(p + j * _RECORD_SIZE + _GROUP_FIRST_AT) != _NOT_A_UNIT
    for k in range(m - summaries, m):
        fed_tokens += prefix[k]
    fed_units += summaries
    if fed_tokens <= budget and (max_events <= 0 or fed_units <= max_events):
        while start < mandatory and _u32(p + start * _RECORD_SIZE + _GROUP_FIRST_AT) == _NOT_A_UNIT:
            start += 1
        return (base_seq + start, mandatory_seq, fed_tokens, -1, summaries)

    if previous_start < floor_seq and chosen[4] > 0:
        return chosen  # a summary recorded since: fed, with all it leaves
    # Over a bound: one step forward, to the oldest position within the trimmed bounds, the
    # recent turns kept.
    trim_tokens = <int64_t>(trim_fraction * budget)
    trim_events = 0
    if max_events > 0:
        trim_events = <int64_t>(trim_fraction * max_events)
        if trim_events < 1:
            trim_events = 1
    recent = recent_start(records, base_seq, active_iteration, keep_turns, trim_tokens, floor_seq)
    if recent is None:
        return None
    mandatory_tokens = _capped_sum(p, mandatory, n, 0xFFFFFFFF)
    if mandatory_tokens <= trim_tokens:
        trimmed = select_window(records, base_seq, active_iteration, trim_tokens, trim_events, floor_seq,
                                prefix_tokens)
        if trimmed is None:
            return None
        if trimmed[0] <= recent:
            return trimmed
    if chosen[0] >= recent:
        return chosen  # the recent turns do not fit the budget: the newest events that do
    start = <Py_ssize_t>(<int64_t>recent - base_seq)
    while start < mandatory and _u32(p + start * _RECORD_SIZE + _GROUP_FIRST_AT) == _NOT_A_UNIT:
        start += 1
    return (base_seq + start, mandatory_seq, _capped_sum(p, start, n, 0xFFFFFFFF), -1, 0)
