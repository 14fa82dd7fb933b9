"""The readable pure-Python twin of ``_entries``: a batch of new log entries checked and made into
what is written for them. The specification: the tests hold the compiled functions to these, the
check to the sidecar's own (``check_event``) and the records to protobuf's serialization; nothing
in the sidecar imports this module.

An entry's record is a ``contextsidecar.storage.v1.EventRecord`` (sidecar/storage/proto) in
protobuf's wire format, as protobuf serializes it: the fields in number order, each one that is
not empty or zero as its tag (field number << 3 | wire type) and then its value, a string as its
UTF-8 length (a varint) and bytes, an int32 as a varint (a negative one sign-extended to 64 bits).

    1 event_id  2 seq  3 iteration  4 role  5 type  6 call_id  7 content  8 tokens  10 tool_name

Keys are the run's ``key`` and then a number (4 bytes, big-endian) or a name (UTF-8), as
sidecar/transcript/schema.py makes them. A packed count record is (tokens, iteration,
group_first), three little-endian uint32, as that module declares it (``COUNT_RECORD``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

_STRING, _VARINT = 2, 0
_COUNT_RECORD = struct.Struct("<III")  # sidecar/transcript/schema.py's COUNT_RECORD
# An event as new_entries reads it: a tuple with these fields first (sidecar's NewEvent).
EVENT_FIELDS = ("event_id", "iteration", "role", "type", "content", "call_id", "host_token_count", "tool_name")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _int32(number: int, value: int) -> bytes:
    if not -2**31 <= value < 2**31:
        raise ValueError(f"{value} is out of an int32 field's range")
    return _varint(number << 3 | _VARINT) + _varint(value % 2**64) if value else b""


def _string(number: int, value: str) -> bytes:
    data = value.encode("utf-8")
    return _varint(number << 3 | _STRING) + _varint(len(data)) + data if data else b""


def event_record(event_id: str, seq: int, iteration: int, role: str, type: str, call_id: str, content: str,
                 tokens: int, tool_name: str) -> bytes:
    """One ``EventRecord``, byte for byte as protobuf serializes it."""
    return b"".join((_string(1, event_id), _int32(2, seq), _int32(3, iteration), _string(4, role), _string(5, type),
                     _string(6, call_id), _string(7, content), _int32(8, tokens), _string(10, tool_name)))


def new_entries(key: bytes, first_seq: int, events: Sequence[tuple], tokens: Sequence[int],
                group_firsts: Sequence[int], last_iteration: int
                ) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]], bytes, list[tuple[bytes, bytes]]]:
    """What is written for ``events`` (tuples of ``EVENT_FIELDS``) appended to the run under
    ``key`` as entries ``first_seq``, ``first_seq + 1``, ..., with their ``tokens`` and
    ``group_firsts``, the run being at ``last_iteration`` before them:

    - records: (key + seq, the entry's record) per entry;
    - index: (key + event id, seq and then the host's count when it sent one) per entry;
    - counts: the entries' packed count records, joined;
    - iteration_starts: (key + iteration, seq) per entry that starts a later iteration.
    """
    if not len(events) == len(tokens) == len(group_firsts):
        raise ValueError("events, tokens and group_firsts differ in length")
    records, index, counts, iteration_starts = [], [], [], []
    for seq, (event, count, group_first) in enumerate(zip(events, tokens, group_firsts), first_seq):
        event_id, iteration, role, type, content, call_id, host_count, tool_name = event[:len(EVENT_FIELDS)]
        record = event_record(event_id, seq, iteration, role, type, call_id, content, count, tool_name)
        seq_bytes = _be32(seq)
        records.append((key + seq_bytes, record))
        index.append((key + event_id.encode("utf-8"), seq_bytes + (b"" if host_count is None else _be32(host_count))))
        if iteration > last_iteration:
            iteration_starts.append((key + _be32(iteration), seq_bytes))
            last_iteration = iteration
        counts.append(_COUNT_RECORD.pack(_uint32(count), _uint32(iteration), _uint32(group_first)))
    return records, index, b"".join(counts), iteration_starts


def _uint32(value: int) -> int:
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"{value} does not fit in 4 unsigned bytes")
    return value


def _be32(value: int) -> bytes:
    return _uint32(value).to_bytes(4, "big")


def _plain_id(value: str, max_bytes: int, required: bool) -> bool:
    data = value.encode("utf-8")
    return len(data) <= max_bytes and not any(byte < 0x20 or byte == 0x7F for byte in data) if data else not required


# The rules an appended event must pass, in the order a refusal names them (the first one it
# breaks): bit k of an ``event_faults`` mask is rule k. "tool_call" is not broken but left to the
# caller: a tool call's arguments are JSON, which this module does not parse.
EVENT_RULES = ("event_id", "event_id_reserved", "iteration", "iteration_turn", "role", "type", "content", "call_id",
               "tool_call", "host_token_count")


def event_faults(events: Sequence[tuple], max_event_bytes: int, turn: int | None, roles: tuple[str, ...],
                 reserved_prefix: str, max_id_bytes: int, max_type_bytes: int, max_count: int) -> list[tuple[int, int]]:
    """(index, faults) of each of ``events`` (tuples of ``EVENT_FIELDS`` and then anything) that
    breaks a rule or is a tool call, in order; ``faults`` has bit k set when it breaks rule k of
    ``EVENT_RULES``:

    - event_id: required, at most ``max_id_bytes`` of UTF-8, no control character (U+0000-U+001F,
      U+007F); event_id_reserved: it does not start with ``reserved_prefix``;
    - iteration: at least 1; iteration_turn: at most ``turn`` when a turn is given;
    - role: one of ``roles``; type: as an id, at most ``max_type_bytes``;
    - content: at most ``max_event_bytes`` of UTF-8; call_id: as an id, but optional;
    - tool_call: set when the event names a tool (the caller checks the call);
    - host_token_count: None, or within 0 and ``max_count``.

    The caller words the refusal of the first rule broken, in Python: one Python check per
    event costs more than the rest of it."""
    faulted = []
    for i, event in enumerate(events):
        event_id, iteration, role, type, content, call_id, host_count, tool_name = event[:len(EVENT_FIELDS)]
        broken = (not _plain_id(event_id, max_id_bytes, True), event_id.startswith(reserved_prefix),
                  iteration < 1, turn is not None and iteration > turn, role not in roles,
                  not _plain_id(type, max_type_bytes, True), len(content.encode("utf-8")) > max_event_bytes,
                  not _plain_id(call_id, max_id_bytes, False), bool(tool_name),
                  not (host_count is None or 0 <= host_count <= max_count))
        faults = sum(1 << k for k, breaks in enumerate(broken) if breaks)
        if faults:
            faulted.append((i, faults))
    return faulted


def unchecked_events(events: Sequence[tuple], max_event_bytes: int, turn: int | None, roles: tuple[str, ...],
                     reserved_prefix: str, max_id_bytes: int, max_type_bytes: int, max_count: int) -> list[int]:
    """The indexes of the events :func:`event_faults` names: every invalid one, and every tool call."""
    return [i for i, _ in event_faults(events, max_event_bytes, turn, roles, reserved_prefix, max_id_bytes,
                                       max_type_bytes, max_count)]
