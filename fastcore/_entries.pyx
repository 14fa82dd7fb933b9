# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A batch of new log entries checked and made into what is written for them, compiled: which
events are plainly valid, and each entry's record (an ``EventRecord`` in protobuf's wire format,
written by hand), its keys and its packed count record. Plain values in and out; the twin
``fastcore/_entries_reference.py`` is the specification.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef int64_t _INT32_MIN = -(2 ** 31)
cdef int64_t _INT32_MAX = 2 ** 31 - 1

# A count record, as sidecar/transcript/schema.py declares it (COUNT_RECORD, "<III"): three
# little-endian uint32 at these offsets (tests/test_architecture.py compares).
cdef enum:
    _RECORD_SIZE = 12
    _TOKENS_AT = 0
    _ITERATION_AT = 4
    _GROUP_FIRST_AT = 8


cdef inline Py_ssize_t _varint_size(uint64_t value) noexcept nogil:
    cdef Py_ssize_t size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


cdef inline char* _varint(char* out, uint64_t value) noexcept nogil:
    while value >= 0x80:
        out[0] = <char>((value & 0x7F) | 0x80)
        value >>= 7
        out += 1
    out[0] = <char>value
    return out + 1


cdef inline uint64_t _int32_wire(int64_t value) except? 0:
    # An int32 field as protobuf writes it: a negative value sign-extended to 64 bits.
    if value < _INT32_MIN or value > _INT32_MAX:
        raise ValueError(f"{value} is out of an int32 field's range")
    return <uint64_t>value


cdef inline uint32_t _uint32(int64_t value) except? 0:
    # A number packed into 4 bytes (a key's, a count record's): what struct and int.to_bytes take.
    if value < 0 or value > 0xFFFFFFFF:
        raise ValueError(f"{value} does not fit in 4 unsigned bytes")
    return <uint32_t>value


cdef inline Py_ssize_t _string_size(Py_ssize_t length) noexcept nogil:
    return 0 if length == 0 else 1 + _varint_size(<uint64_t>length) + length


cdef inline char* _string(char* out, unsigned char tag, const char* data, Py_ssize_t length) noexcept nogil:
    if length == 0:
        return out
    out[0] = <char>tag
    out = _varint(out + 1, <uint64_t>length)
    memcpy(out, data, length)
    return out + length


cdef inline Py_ssize_t _number_size(uint64_t wire) noexcept nogil:
    return 0 if wire == 0 else 1 + _varint_size(wire)


cdef inline char* _number(char* out, unsigned char tag, uint64_t wire) noexcept nogil:
    if wire == 0:
        return out
    out[0] = <char>tag
    return _varint(out + 1, wire)


cdef inline void _be32(char* out, uint32_t value) noexcept nogil:
    out[0] = <char>(value >> 24)
    out[1] = <char>(value >> 16)
    out[2] = <char>(value >> 8)
    out[3] = <char>value


cdef inline void _le32(char* out, uint32_t value) noexcept nogil:
    out[0] = <char>value
    out[1] = <char>(value >> 8)
    out[2] = <char>(value >> 16)
    out[3] = <char>(value >> 24)


cdef bytes _suffixed(bytes key, const char* suffix, Py_ssize_t length):
    cdef Py_ssize_t head = PyBytes_GET_SIZE(key)
    cdef bytes joined = PyBytes_FromStringAndSize(NULL, head + length)
    cdef char* out = PyBytes_AS_STRING(joined)
    memcpy(out, PyBytes_AS_STRING(key), head)
    memcpy(out + head, suffix, length)
    return joined


cdef bytes _numbered(bytes key, uint32_t number):
    cdef char suffix[4]
    _be32(suffix, number)
    return _suffixed(key, suffix, 4)


cdef bytes _record(const char** text, Py_ssize_t* length, uint64_t seq, uint64_t iteration, uint64_t tokens):
    # text/length: event_id, role, type, call_id, content, tool_name (fields 1, 4, 5, 6, 7, 10).
    cdef Py_ssize_t size = (_string_size(length[0]) + _number_size(seq) + _number_size(iteration)
                            + _string_size(length[1]) + _string_size(length[2]) + _string_size(length[3])
                            + _string_size(length[4]) + _number_size(tokens) + _string_size(length[5]))
    cdef bytes record = PyBytes_FromStringAndSize(NULL, size)
    cdef char* out = PyBytes_AS_STRING(record)
    out = _string(out, 0x0A, text[0], length[0])
    out = _number(out, 0x10, seq)
    out = _number(out, 0x18, iteration)
    out = _string(out, 0x22, text[1], length[1])
    out = _string(out, 0x2A, text[2], length[2])
    out = _string(out, 0x32, text[3], length[3])
    out = _string(out, 0x3A, text[4], length[4])
    out = _number(out, 0x40, tokens)
    _string(out, 0x52, text[5], length[5])
    return record


def event_record(str event_id, int64_t seq, int64_t iteration, str role, str type, str call_id, str content,
                 int64_t tokens, str tool_name):
    """One ``EventRecord``, byte for byte as protobuf serializes it. See the twin."""
    cdef const char* text[6]
    cdef Py_ssize_t length[6]
    cdef Py_ssize_t k
    for k, value in enumerate((event_id, role, type, call_id, content, tool_name)):
        text[k] = PyUnicode_AsUTF8AndSize(value, &length[k])
    return _record(text, length, _int32_wire(seq), _int32_wire(iteration), _int32_wire(tokens))


# The fields of an event tuple, as ``new_entries`` reads them: sidecar's NewEvent, whose fields
# come first in this order (tests/test_architecture.py compares).
cdef enum:
    _EVENT_ID = 0
    _ITERATION = 1
    _ROLE = 2
    _TYPE = 3
    _CONTENT = 4
    _CALL_ID = 5
    _HOST_TOKEN_COUNT = 6
    _TOOL_NAME = 7


def new_entries(bytes key not None, int64_t first_seq, events, tokens, group_firsts, int64_t last_iteration):
    """What is written for ``events`` appended as entries ``first_seq``, ``first_seq + 1``, ...:
    (records, index, counts, iteration_starts). See the twin."""
    cdef Py_ssize_t n = len(events), i
    cdef list records = [], index = [], iteration_starts = []
    cdef bytes counts = PyBytes_FromStringAndSize(NULL, n * _RECORD_SIZE)
    cdef char* packed = PyBytes_AS_STRING(counts)
    cdef const char* text[6]
    cdef Py_ssize_t length[6]
    cdef int64_t seq, iteration, count
    cdef uint32_t seq_u32, iteration_u32
    cdef char value[8]
    if len(tokens) != n or len(group_firsts) != n:
        raise ValueError("events, tokens and group_firsts differ in length")
    for i in range(n):
        event = events[i]
        seq = first_seq + i
        iteration = event[_ITERATION]
        count = tokens[i]
        text[0] = PyUnicode_AsUTF8AndSize(event[_EVENT_ID], &length[0])
        text[1] = PyUnicode_AsUTF8AndSize(event[_ROLE], &length[1])
        text[2] = PyUnicode_AsUTF8AndSize(event[_TYPE], &length[2])
        text[3] = PyUnicode_AsUTF8AndSize(event[_CALL_ID], &length[3])
        text[4] = PyUnicode_AsUTF8AndSize(event[_CONTENT], &length[4])
        text[5] = PyUnicode_AsUTF8AndSize(event[_TOOL_NAME], &length[5])
        record = _record(text, length, _int32_wire(seq), _int32_wire(iteration), _int32_wire(count))
        seq_u32, iteration_u32 = _uint32(seq), _uint32(iteration)
        records.append((_numbered(key, seq_u32), record))
        _be32(value, seq_u32)
        host_count = event[_HOST_TOKEN_COUNT]
        if host_count is None:
            index.append((_suffixed(key, text[0], length[0]), PyBytes_FromStringAndSize(value, 4)))
        else:
            _be32(value + 4, _uint32(host_count))
            index.append((_suffixed(key, text[0], length[0]), PyBytes_FromStringAndSize(value, 8)))
        if iteration > last_iteration:
            iteration_starts.append((_numbered(key, iteration_u32), PyBytes_FromStringAndSize(value, 4)))
            last_iteration = iteration
        _le32(packed + _RECORD_SIZE * i + _TOKENS_AT, _uint32(count))
        _le32(packed + _RECORD_SIZE * i + _ITERATION_AT, iteration_u32)
        _le32(packed + _RECORD_SIZE * i + _GROUP_FIRST_AT, _uint32(group_firsts[i]))
    return records, index, counts, iteration_starts


cdef inline bint _clean(const char* text, Py_ssize_t length) noexcept nogil:
    # No control character (U+0000-U+001F, U+007F): in UTF-8 these bytes stand only for themselves.
    cdef Py_ssize_t k
    cdef unsigned char byte
    for k in range(length):
        byte = <unsigned char>text[k]
        if byte < 0x20 or byte == 0x7F:
            return False
    return True


cdef inline bint _plain_id(str value, Py_ssize_t max_bytes, bint required) except -1:
    cdef Py_ssize_t length
    cdef const char* text = PyUnicode_AsUTF8AndSize(value, &length)
    if length == 0:
        return not required
    return length <= max_bytes and _clean(text, length)


# The rules an appended event must pass, in the order a refusal names them (the first one it
# breaks): ``_RULE_<NAME>`` is rule NAME's bit in ``event_faults``' masks, its place here (the
# twin's EVENT_RULES; tests/test_architecture.py compares). The sidecar words each refusal
# (sidecar/transcript/log.py) and checks a tool call's arguments, JSON, itself.
EVENT_RULES = ("event_id", "event_id_reserved", "iteration", "iteration_turn", "role", "type", "content", "call_id",
               "tool_call", "host_token_count")
cdef enum:
    _RULE_EVENT_ID = 1 << 0
    _RULE_EVENT_ID_RESERVED = 1 << 1
    _RULE_ITERATION = 1 << 2
    _RULE_ITERATION_TURN = 1 << 3
    _RULE_ROLE = 1 << 4
    _RULE_TYPE = 1 << 5
    _RULE_CONTENT = 1 << 6
    _RULE_CALL_ID = 1 << 7
    _RULE_TOOL_CALL = 1 << 8
    _RULE_HOST_TOKEN_COUNT = 1 << 9


def event_faults(events, int64_t max_event_bytes, turn, tuple roles not None, str reserved_prefix not None,
                 int64_t max_id_bytes, int64_t max_type_bytes, int64_t max_count):
    """(index, mask of the ``EVENT_RULES`` it breaks) of each event that breaks one, or is a tool
    call. See the twin."""
    cdef list faulted = []
    cdef Py_ssize_t i, length
    cdef int faults
    for i in range(len(events)):
        event = events[i]
        event_id, iteration, host_count = event[_EVENT_ID], event[_ITERATION], event[_HOST_TOKEN_COUNT]
        PyUnicode_AsUTF8AndSize(event[_CONTENT], &length)
        faults = 0
        if not _plain_id(event_id, max_id_bytes, True):
            faults |= _RULE_EVENT_ID
        if event_id.startswith(reserved_prefix):
            faults |= _RULE_EVENT_ID_RESERVED
        if iteration < 1:
            faults |= _RULE_ITERATION
        if turn is not None and iteration > turn:
            faults |= _RULE_ITERATION_TURN
        if event[_ROLE] not in roles:
            faults |= _RULE_ROLE
        if not _plain_id(event[_TYPE], max_type_bytes, True):
            faults |= _RULE_TYPE
        if length > max_event_bytes:
            faults |= _RULE_CONTENT
        if not _plain_id(event[_CALL_ID], max_id_bytes, False):
            faults |= _RULE_CALL_ID
        if event[_TOOL_NAME]:
            faults |= _RULE_TOOL_CALL
        if not (host_count is None or 0 <= host_count <= max_count):
            faults |= _RULE_HOST_TOKEN_COUNT
        if faults:
            faulted.append((i, faults))
    return faulted


def unchecked_events(events, int64_t max_event_bytes, turn, tuple roles not None, str reserved_prefix not None,
                     int64_t max_id_bytes, int64_t max_type_bytes, int64_t max_count):
    """The indexes of the events this check does not pass: the invalid ones, and tool calls. See the twin."""
    return [i for i, _ in event_faults(events, max_event_bytes, turn, roles, reserved_prefix, max_id_bytes,
                                       max_type_bytes, max_count)]
