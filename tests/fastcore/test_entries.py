"""fastcore._entries, which makes the writes of an append's new entries, against its twin and
against protobuf's own serialization: a stored record must stay byte for byte what protobuf
writes, so that every store written before reads the same."""

from __future__ import annotations

import random
import struct

import pytest

import fastcore
from fastcore import _entries_reference as _reference
from sidecar.errors import ValidationError
from sidecar.pb.contextsidecar.storage.v1.records_pb2 import EventRecord
from sidecar.settings import ROLES
from sidecar.transcript.log import MAX_TYPE_BYTES, NewEvent, check_event
from sidecar.transcript.runs import SIDECAR_ID_PREFIX
from sidecar.validation import MAX_COUNT, MAX_ID_BYTES

ALPHABET = [chr(c) for c in (*range(32, 127), *range(0xA0, 0x2FF), *range(0x4E00, 0x4E40), *range(0x1F600, 0x1F640))]
# An int32 field's edges, and the edges of a varint's lengths.
NUMBERS = [0, 1, 127, 128, 16_383, 16_384, 2**21, 2**28, 2**31 - 1, -1, -128, -2**31]


def _text(rng: random.Random, longest: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.choice([0, 1, rng.randrange(longest + 1)])))


def _event(rng: random.Random, iteration: int) -> NewEvent:
    return NewEvent(_text(rng, 40) or "id", iteration, rng.choice(["user", "assistant", "tool", ""]), _text(rng, 12),
                    _text(rng, 3000), _text(rng, 20), rng.choice([None, 0, 7, 2**31 - 1]), _text(rng, 10))


def _protobuf(event: NewEvent, seq: int, tokens: int) -> bytes:
    return EventRecord(event_id=event.event_id, seq=seq, iteration=event.iteration, role=event.role, type=event.type,
                       call_id=event.call_id, content=event.content, tokens=tokens,
                       tool_name=event.tool_name).SerializeToString()


def test_the_compiled_module_is_what_fastcore_exports() -> None:
    assert fastcore.new_entries.__module__ == fastcore.event_record.__module__ == "fastcore._entries"


def test_an_event_tuple_is_a_new_event() -> None:
    assert NewEvent._fields[:len(_reference.EVENT_FIELDS)] == _reference.EVENT_FIELDS


def test_a_record_is_what_protobuf_writes() -> None:
    rng = random.Random(11)
    for n in range(600):
        event = _event(rng, rng.choice(NUMBERS))
        seq, tokens = rng.choice(NUMBERS), rng.choice(NUMBERS)
        fields = (event.event_id, seq, event.iteration, event.role, event.type, event.call_id, event.content, tokens,
                  event.tool_name)
        expected = _protobuf(event, seq, tokens)
        assert fastcore.event_record(*fields) == _reference.event_record(*fields) == expected, n


@pytest.mark.parametrize("number", [2**31, -2**31 - 1, 2**40])
def test_a_number_beyond_int32_is_refused_as_protobuf_refuses_it(number: int) -> None:
    fields = ("e", number, 1, "user", "message", "", "text", 5, "")
    for encode in (fastcore.event_record, _reference.event_record,
                   lambda *f: EventRecord(event_id=f[0], seq=f[1]).SerializeToString()):
        with pytest.raises(ValueError):
            encode(*fields)


def test_new_entries_against_the_twin_and_protobuf() -> None:
    rng = random.Random(5)
    key = b"tenant\0run\0"
    for n in range(200):
        last = rng.randrange(0, 4)
        iteration, events = last, []
        for _ in range(rng.randrange(0, 12)):
            iteration += rng.choice([0, 0, 1, 3])
            events.append(_event(rng, iteration))
        first = rng.choice([0, 1, 127, 1000, 2**31 - 20])
        tokens = [rng.choice([0, 1, 190, 70_000, 2**31 - 1]) for _ in events]
        group_firsts = [rng.choice([seq, first, 0xFFFFFFFF]) for seq in range(first, first + len(events))]
        made = fastcore.new_entries(key, first, events, tokens, group_firsts, last)
        assert made == _reference.new_entries(key, first, events, tokens, group_firsts, last), n
        records, index, counts, iteration_starts = made
        seqs = range(first, first + len(events))
        assert records == [(key + seq.to_bytes(4, "big"), _protobuf(event, seq, count))
                           for seq, event, count in zip(seqs, events, tokens)]
        assert index == [(key + event.event_id.encode(), seq.to_bytes(4, "big") + (
            b"" if event.host_token_count is None else event.host_token_count.to_bytes(4, "big")))
            for seq, event in zip(seqs, events)]
        assert counts == b"".join(struct.pack("<III", count, event.iteration, group)
                                  for event, count, group in zip(events, tokens, group_firsts))
        starts = [(event.iteration, seq) for seq, event in zip(seqs, events)]
        starts = [(it, seq) for k, (it, seq) in enumerate(starts) if it > max([last, *(i for i, _ in starts[:k])])]
        assert iteration_starts == [(key + it.to_bytes(4, "big"), seq.to_bytes(4, "big")) for it, seq in starts]


@pytest.mark.parametrize("made", [fastcore.new_entries, _reference.new_entries])
def test_new_entries_refuse_what_does_not_fit(made) -> None:  # type: ignore[no-untyped-def]
    event = NewEvent("e", 1, "user", "message", "text")
    with pytest.raises(ValueError):
        made(b"k\0", 0, [event], [5], [0, 1], 0)  # a group for an event that is not there
    with pytest.raises(ValueError):
        made(b"k\0", 0, [event], [2**31], [0], 0)  # tokens travel as int32
    with pytest.raises(ValueError):
        made(b"k\0", 0, [event._replace(host_token_count=-1)], [5], [0], 0)
    with pytest.raises(ValueError):
        made(b"k\0", 0, [event], [5], [-1], 0)


# -- the plain events' check ------------------------------------------------------------------

IDS = ["", "a", "x" * 256, "x" * 257, "é" * 128, "é" * 129, "a\nb", "a\x7fb", "a\x1f", "sidecar:x", "side", "ok"]
TYPES = ["", "message", "t" * 64, "t" * 65, "a\tb", "日本"]
CONTENTS = ["", "x" * 100, "é" * 50, "é" * 51, "😀" * 25, "😀" * 26, "\x00 nul is fine in content"]


def _checked_by_python(event: NewEvent, turn: int | None) -> bool:
    try:
        check_event(event, 100, turn)
    except ValidationError:
        return False
    return True


def test_unchecked_events_are_exactly_those_check_event_refuses_and_tool_calls() -> None:
    rng = random.Random(3)
    for n in range(1500):
        turn = rng.choice([None, 3])
        events = [NewEvent(rng.choice(IDS), rng.choice([-1, 0, 1, 3, 4]), rng.choice([*ROLES, "robot", ""]),
                           rng.choice(TYPES), rng.choice(CONTENTS), rng.choice(["", "", *IDS]),
                           rng.choice([None, None, -1, 0, MAX_COUNT, MAX_COUNT + 1]),
                           rng.choice(["", "", "", "search"])) for _ in range(rng.randrange(0, 8))]
        arguments = (events, 100, turn, ROLES, SIDECAR_ID_PREFIX, MAX_ID_BYTES, MAX_TYPE_BYTES, MAX_COUNT)
        unchecked = fastcore.unchecked_events(*arguments)
        assert unchecked == _reference.unchecked_events(*arguments), n
        assert unchecked == [i for i, event in enumerate(events)
                             if event.tool_name or not _checked_by_python(event, turn)], n


# Each event rule, broken alone: its bit, in the compiled check and its twin, and the refusal the
# sidecar words for it, naming the field (stated here by hand, not read from either).
GOOD = NewEvent("e1", 2, "user", "message", "hello", "call-1", 5)
BROKEN_ALONE = {
    "event_id": (GOOD._replace(event_id="a\nb"), "event_id"),
    "event_id_reserved": (GOOD._replace(event_id=SIDECAR_ID_PREFIX + "x"), "event_id"),
    "iteration": (GOOD._replace(iteration=0), "iteration"),
    "iteration_turn": (GOOD._replace(iteration=4), "iteration"),
    "role": (GOOD._replace(role="robot"), "role"),
    "type": (GOOD._replace(type="t" * 65), "type"),
    "content": (GOOD._replace(content="x" * 101), "content"),
    "call_id": (GOOD._replace(call_id="x" * 257), "call_id"),
    "tool_call": (GOOD._replace(role="assistant", tool_name="search", content="[1]"), "content"),
    "host_token_count": (GOOD._replace(host_token_count=MAX_COUNT + 1), "host_token_count"),
}


def test_every_event_rule_has_its_bit_and_its_refusal() -> None:
    assert tuple(BROKEN_ALONE) == fastcore.EVENT_RULES == _reference.EVENT_RULES
    limits = (100, 3, ROLES, SIDECAR_ID_PREFIX, MAX_ID_BYTES, MAX_TYPE_BYTES, MAX_COUNT)
    assert fastcore.event_faults([GOOD], *limits) == _reference.event_faults([GOOD], *limits) == []
    check_event(GOOD, 100, 3)
    for bit, (rule, (event, field)) in enumerate(BROKEN_ALONE.items()):
        assert fastcore.event_faults([GOOD, event], *limits) == _reference.event_faults([GOOD, event], *limits) == [
            (1, 1 << bit)], rule
        with pytest.raises(ValidationError) as refused:
            check_event(event, 100, 3)
        assert refused.value.violations[0].field == field, rule
    # A tool call whose arguments are a JSON object passes, though fastcore names it.
    call = BROKEN_ALONE["tool_call"][0]._replace(content='{"q": 1}')
    check_event(call, 100, 3)


def test_event_faults_of_events_breaking_several_rules_against_the_twin() -> None:
    rng = random.Random(4)
    limits = (100, 3, ROLES, SIDECAR_ID_PREFIX, MAX_ID_BYTES, MAX_TYPE_BYTES, MAX_COUNT)
    for n in range(500):
        events = []
        for _ in range(rng.randrange(0, 6)):
            event = GOOD
            for broken, _ in rng.sample(list(BROKEN_ALONE.values()), rng.randrange(0, 4)):
                event = event._replace(**{name: value for name, value in broken._asdict().items()
                                          if value != getattr(GOOD, name)})
            events.append(event)
        assert fastcore.event_faults(events, *limits) == _reference.event_faults(events, *limits), n
