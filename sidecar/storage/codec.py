"""Byte layouts of what the transcript keeps in LMDB.

- An event is a serialized ``contextsidecar.storage.v1.EventRecord`` (protobuf). Its fields
  are, number for number, those of the API's ``WindowEntry``, so the wire layer sends a stored
  event as it is, without decoding it on the turn's hot path (sidecar/storage/proto/contextsidecar/storage).
- Per-event count records, the packed arrays fastcore walks, are the transcript's own layout:
  ``sidecar/transcript/schema.py`` declares them, with the chunks that hold them.
- A memory entry is a serialized ``MemoryRecord``, likewise the API's ``MemoryEntry``.
- Event ids of a chunk are NUL-joined (ids never contain NUL), so a window's ids come from one
  read and one split instead of a decode per event.
- Run and window records are read once per call and stay JSON, readable with ``mdb_dump``.

Storage uses protobuf only as a serialization format, through its own storage proto; the API
types in ``context_sidecar_client.v1`` stay the wire layer's alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import orjson

from sidecar.pb.contextsidecar.storage.v1.memory_pb2 import MemoryRecord
from sidecar.pb.contextsidecar.storage.v1.records_pb2 import EventRecord

ID_SEPARATOR = "\0"


@dataclass(frozen=True, slots=True)
class StoredEvent:
    seq: int
    event_id: str
    iteration: int
    role: str
    type: str
    content: str
    call_id: str
    tokens: int
    tool_name: str = ""  # a tool call's tool (its content is then the arguments, a JSON object)


def encode_event(event: StoredEvent) -> bytes:
    return encode_record(event.event_id, event.seq, event.iteration, event.role, event.type, event.call_id,
                         event.content, event.tokens, event.tool_name)


def encode_record(event_id: str, seq: int, iteration: int, role: str, type: str, call_id: str, content: str,
                  tokens: int, tool_name: str) -> bytes:
    """A StoredEvent's record from its fields (an append's events are not made StoredEvents first)."""
    return EventRecord(event_id=event_id, seq=seq, iteration=iteration, role=role, type=type, call_id=call_id,
                       content=content, tokens=tokens, tool_name=tool_name).SerializeToString()


def decode_event(data: bytes) -> StoredEvent:
    record = EventRecord.FromString(data)
    return StoredEvent(record.seq, record.event_id, record.iteration, record.role, record.type,
                       record.content, record.call_id, record.tokens, record.tool_name)


def encode_memory(entry_id: str, content: str, tags: list[str] | tuple[str, ...], created_ms: int,
                  expires_ms: int, tokens: int) -> bytes:
    """A memory entry as stored: ``MemoryRecord``, a ``MemoryEntry`` on the wire."""
    record = MemoryRecord(id=entry_id, content=content, tags=tags, tokens=tokens)
    record.created_at.FromMilliseconds(created_ms)
    if expires_ms:
        record.expires_at.FromMilliseconds(expires_ms)
    return record.SerializeToString()


def memory_content(data: bytes) -> str:
    return MemoryRecord.FromString(data).content


@dataclass(frozen=True, slots=True)
class StoredMemory:
    """A memory entry's record, decoded (for readers; answers send the stored bytes as they are)."""

    entry_id: str
    content: str
    tags: tuple[str, ...]
    created_ms: int
    expires_ms: int  # 0: never
    tokens: int


def decode_memory(data: bytes) -> StoredMemory:
    record = MemoryRecord.FromString(data)
    return StoredMemory(record.id, record.content, tuple(record.tags), record.created_at.ToMilliseconds(),
                        record.expires_at.ToMilliseconds() if record.HasField("expires_at") else 0, record.tokens)


def encode_id_index(seq: int, host_token_count: int | None) -> bytes:
    """The event-id index value: the event's seq, and the host's count when it sent one (kept
    only so that a retried append can be recognised as identical)."""
    head = seq.to_bytes(4, "big")
    return head if host_token_count is None else head + host_token_count.to_bytes(4, "big")


def decode_id_index(data: bytes) -> tuple[bytes, int | None]:
    """(seq as its 4-byte key suffix, host count or None)."""
    return data[:4], (int.from_bytes(data[4:8], "big") if len(data) == 8 else None)


# Made once: json.dumps with options makes an encoder on every call, and records are dumped on every write.
_RECORD_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def dump_json(value: dict) -> bytes:
    return _RECORD_JSON.encode(value).encode("utf-8")


def load_json(data: bytes) -> dict:
    return json.loads(data)


# The records a turn reads and writes (runs, windows, fed forms, summaries, compaction records)
# hold strings, integers within 64 bits and fractions, and go through orjson, ~8x json's speed
# to write and 2-4x to read. orjson writes such a value exactly as json does while it is ASCII
# and holds no DEL; json escapes both, so such output goes through json and a record's bytes
# stay what they always were. (A float orjson writes with an exponent, "1e-7" for json's "1e-07", reads back the
# same; these records hold none.) Other records, and any JSON a host sent, stay with json: orjson
# reads an integer beyond 64 bits as a float.

_IN_ORDER_JSON = json.JSONEncoder(separators=(",", ":"))


def dump_plain_json(value: dict, sort_keys: bool = True) -> bytes:
    """``sort_keys`` False: the keys in the dict's order (a payload whose order is specified)."""
    try:
        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
        if data.isascii() and b"\x7f" not in data:
            return data
    except TypeError:  # an integer beyond 64 bits, a lone surrogate
        pass
    return (_RECORD_JSON if sort_keys else _IN_ORDER_JSON).encode(value).encode("utf-8")


def load_plain_json(data: bytes) -> dict:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # what json writes and orjson refuses: NaN, a lone surrogate's escape
        return json.loads(data)
