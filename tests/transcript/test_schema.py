"""The transcript area's typed records keep the stored JSON as it was, byte for byte, and read
records of every earlier layout."""

from __future__ import annotations

import json

import fastcore
from sidecar.storage.codec import dump_json, encode_id_index
from sidecar.storage.environment import Store
from sidecar.storage.keys import records_under
from sidecar.transcript.log import NewEvent
from sidecar.transcript.schema import (
    Compaction,
    CompactionRecord,
    WindowRecord,
    count_at,
    form_key,
    name_key,
    numbered_key,
    pack_count,
    run_key,
    window_count,
    windows_from,
)


def _window_as_persisted() -> dict:
    """A window record as ``window.persist`` wrote it before it was typed: a dict dumped whole."""
    return {
        "plan": ["o200k_base", 800, 3, 12, 40, 1, 1], "start": 3, "end": 12, "counter": "o200k_base", "budget": 800,
        "tokens": 640, "skip": [7], "clipped": [[11, "head … tail", 40]], "summaries": [[1, "sidecar:summary:1:ab"]],
        "summarized": 3, "omitted": 0, "fed": [[4, 9], [5, 9]],
        "compaction": [False, [], 0, "nothing_summarisable: …", 1],
        "context": {"digests": ["", "d"], "prefix": "p", "changed": [], "fixed_tokens": 52, "limit": 128000,
                    "task_id": "t", "cache": {"form": "", "report": [0, 0, "first_turn"]}},
        "window_tokens": 692}


def test_a_window_record_encodes_as_it_was_stored() -> None:
    stored = dump_json(_window_as_persisted())
    record = WindowRecord.parse(stored)
    assert record.encode() == stored
    assert record.plan == ("o200k_base", 800, 3, 12, 40, 1, 1)
    assert record.clipped == ((11, "head … tail", 40),)
    assert record.compaction == Compaction(False, (), 0, "nothing_summarisable: …", 1)
    assert record.fed_tokens == 692 and record.cache == {"form": "", "report": [0, 0, "first_turn"]}


def test_a_window_record_of_an_earlier_layout_still_reads() -> None:
    # Before sections, the reason and the summarised count: no context, window_tokens,
    # summarized or fed, and a compaction decision of three fields.
    value = _window_as_persisted()
    for name in ("context", "window_tokens", "summarized", "fed"):
        del value[name]
    value["compaction"] = [True, ["e1", "e2"], 120]
    record = WindowRecord.parse(dump_json(value))
    assert record.compaction == Compaction(True, ("e1", "e2"), 120)
    assert (record.summarized, record.fed, record.context) == (None, None, None)
    assert record.fed_tokens == 640 and record.cache is None
    without_decision = dict(value)
    del without_decision["compaction"]
    assert WindowRecord.parse(dump_json(without_decision)).encode() == dump_json(without_decision)


def test_a_compaction_record_encodes_as_it_was_stored() -> None:
    stored = dump_json({"index": 2, "task_id": "t", "iteration": 5, "recorded_ms": 1700000000000, "seq": 40,
                        "kind": "cleared", "removed": ["r1", "r2"], "summary_ref": "", "tokens_before": 900,
                        "tokens_after": 60, "by": "built-in"})
    record = CompactionRecord.parse(stored)
    assert record.encode() == stored
    assert (record.removed_event_ids, record.summarised_by) == (("r1", "r2"), "built-in")


def test_a_compaction_record_made_before_clearings_is_a_summary() -> None:
    value = {"index": 0, "task_id": "t", "iteration": 3, "recorded_ms": 1, "seq": 9, "removed": ["e1"],
             "summary_ref": "sidecar:summary:0:ab", "tokens_before": 300, "tokens_after": 40, "by": "host"}
    assert CompactionRecord.from_json(json.loads(dump_json(value))).kind == "summary"


def test_keys_are_the_run_key_then_a_big_endian_number_or_a_name() -> None:
    key = b"tenant\0run\0"
    assert numbered_key(key, 258) == key + b"\0\0\x01\x02"
    assert name_key(key, "é") == key + "é".encode()
    assert form_key(key, 1, 2) == key + b"\0\0\0\x01\0\0\0\x02"


def test_fastcore_writes_an_append_in_the_keys_and_records_this_module_reads() -> None:
    """fastcore's new_entries makes an append's keys and count records itself, in C: they are the
    ones this module makes and reads."""
    key = run_key("tenant", "run")
    events = [NewEvent("e1", 1, "user", "message", "hi"), NewEvent("é2", 3, "tool", "tool_result", "ok", "c", 7)]
    records, index, counts, starts = fastcore.new_entries(key, 127, events, [5, 9], [127, 127], 0)
    assert [stored_key for stored_key, _ in records] == [numbered_key(key, 127), numbered_key(key, 128)]
    assert index == [(name_key(key, "e1"), encode_id_index(127, None)), (name_key(key, "é2"), encode_id_index(128, 7))]
    assert starts == [(numbered_key(key, iteration), seq.to_bytes(4, "big")) for iteration, seq in ((1, 127), (3, 128))]
    assert counts == pack_count(5, 1, 127) + pack_count(9, 3, 127)
    assert [count_at(counts, 127, seq) for seq in (127, 128)] == [(5, 1, 127), (9, 3, 127)]


def test_a_runs_windows_are_counted_and_paged_by_key_as_a_full_read_finds_them(tmp_path) -> None:
    """window_count and windows_from skip records by their keys alone: each page equals the same
    slice of every window read whole, for every skip and limit, beside runs whose keys sort next
    to this one's (a run id that extends it, another tenant's run of the same id)."""
    store = Store(str(tmp_path / "store"), 1 << 24, sync=False)
    db = store.handles("runs")
    key = run_key("acme", "run")
    neighbours = (run_key("acme", "run-2"), run_key("acme", "ru"), run_key("globex", "run"))
    iterations = (1, 2, 3, 5, 8, 13, 21)  # a host may leave iterations out: pages go by position

    def write(txn) -> None:
        for iteration in iterations:
            record = dict(_window_as_persisted(), tokens=iteration, window_tokens=iteration + 52)
            txn.put(numbered_key(key, iteration), dump_json(record), db=db["windows"])
        for other in neighbours:
            txn.put(numbered_key(other, 4), dump_json(_window_as_persisted()), db=db["windows"])

    store.write(write)
    with store.read() as txn:
        whole = [(int.from_bytes(suffix, "big"), WindowRecord.parse(value).tokens)
                 for suffix, value in records_under(txn, db["windows"], key)]
        assert [iteration for iteration, _ in whole] == list(iterations)
        assert window_count(txn, db, key) == len(iterations)
        for skip in range(len(iterations) + 2):
            for limit in range(len(iterations) + 2):
                page = [(iteration, record.tokens) for iteration, record in windows_from(txn, db, key, skip, limit)]
                assert page == whole[skip:skip + limit], (skip, limit)
        assert window_count(txn, db, run_key("acme", "none")) == 0
        assert windows_from(txn, db, run_key("acme", "none"), 0, 10) == []
    store.close()
