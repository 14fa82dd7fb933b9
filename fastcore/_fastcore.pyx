# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The sidecar's tight loops, compiled. Plain values in and out: bytes, ints, tuples.

Every function here has a readable twin in ``fastcore/_reference.py`` that documents it and
that the tests hold it to. This module knows nothing of LMDB or protobuf.
"""

from libc.stdint cimport uint32_t, uint64_t, int64_t
from libc.stdlib cimport malloc, free

cdef enum:
    _RECORD_SIZE = 12

RECORD_SIZE = _RECORD_SIZE


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
        t = _u32(p + i * _RECORD_SIZE)
        total += t if t < cap else cap
    return total


cdef uint32_t _clip_cap(const unsigned char* p, Py_ssize_t lo, Py_ssize_t hi, int64_t budget) noexcept nogil:
    # Binary search for the largest cap whose capped sum still fits (water-filling).
    cdef uint32_t low = 0, high = 0, mid, t
    cdef Py_ssize_t i
    for i in range(lo, hi):
        t = _u32(p + i * _RECORD_SIZE)
        if t > high:
            high = t
    while low < high:
        mid = <uint32_t>((<uint64_t>low + high + 1) // 2)
        if _capped_sum(p, lo, hi, mid) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def select_window(const unsigned char[::1] records not None, int64_t base_seq,
                  int64_t active_iteration, int64_t budget, int64_t max_events):
    """Choose the transcript window. See ``_reference.select_window`` for the contract."""
    cdef Py_ssize_t n = records.shape[0] // _RECORD_SIZE
    cdef const unsigned char* p = &records[0] if records.shape[0] > 0 else NULL
    cdef int64_t end = base_seq + n
    cdef int64_t* suffix_min
    cdef Py_ssize_t j, active_start, mandatory, cut
    cdef int64_t total, mandatory_tokens, capped
    cdef uint32_t cap
    cdef int need_more = 0
    cdef int clipped = 0

    suffix_min = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    if suffix_min == NULL:
        raise MemoryError()
    try:
        with nogil:
            active_start = n
            while active_start > 0 and _u32(p + (active_start - 1) * _RECORD_SIZE + 4) >= active_iteration:
                active_start -= 1
            if active_start == 0 and base_seq > 0 and n > 0:
                need_more = 1

            if not need_more:
                suffix_min[n] = end
                for j in range(n - 1, -1, -1):
                    suffix_min[j] = suffix_min[j + 1]
                    if _u32(p + j * _RECORD_SIZE + 8) < suffix_min[j]:
                        suffix_min[j] = _u32(p + j * _RECORD_SIZE + 8)

                # The largest cut at or before the active turn that keeps every group whole.
                mandatory = active_start
                while mandatory > 0 and suffix_min[mandatory] < base_seq + mandatory:
                    mandatory -= 1
                if mandatory == 0 and base_seq > 0 and suffix_min[0] < base_seq:
                    need_more = 1

            if not need_more:
                mandatory_tokens = _capped_sum(p, mandatory, n, 0xFFFFFFFF)
                if mandatory_tokens > budget:
                    clipped = 1
                    cap = _clip_cap(p, mandatory, n, budget)
                    capped = _capped_sum(p, mandatory, n, cap)
                else:
                    total = mandatory_tokens
                    cut = mandatory
                    while True:
                        if max_events > 0 and n - cut >= max_events:
                            break
                        if cut == 0:
                            if base_seq > 0:
                                need_more = 1
                            break
                        if total + _u32(p + (cut - 1) * _RECORD_SIZE) > budget:
                            break
                        cut -= 1
                        total += _u32(p + cut * _RECORD_SIZE)
                    if not need_more:
                        while suffix_min[cut] < base_seq + cut:
                            cut += 1
                        total = _capped_sum(p, cut, n, 0xFFFFFFFF)
    finally:
        free(suffix_min)

    if need_more:
        return None
    if clipped:
        return (base_seq + mandatory, base_seq + mandatory, capped, cap)
    return (base_seq + cut, base_seq + mandatory, total, -1)
