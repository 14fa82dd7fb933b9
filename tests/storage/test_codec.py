"""The JSON of the records a turn reads and writes: orjson writes json's own bytes for every value
such a record holds, and reads back all json wrote (a store written before orjson included)."""

from __future__ import annotations

import json
import math

import pytest

from sidecar.storage.codec import dump_json, dump_plain_json, load_plain_json

RECORDS = [
    {"plan": ("o200k_base", 32000, 0, 119, -1, -1, 0), "skip": [3, 9], "fed": [[12, 40]], "context": None},
    {"trim_to_fraction": 0.6, "compaction_fraction": 0.75, "small": 0.0001, "large": 1234567890123456.0},
    {"text": "naïve café, 東京, emoji 🙂", "ascii": "plain"},  # json escapes non-ASCII: the record keeps it so
    {"controls": "tab\t, newline\n, bell\x07, DEL\x7f, quote\", backslash\\"},  # and DEL, which is ASCII
    {"big": 2**70, "negative": -(2**63) - 1},  # beyond orjson's 64-bit integers
    {"lone": "\ud800 half a pair"},  # a lone surrogate, which orjson refuses
    {"nested": {"b": 1, "a": [True, False, None, ""]}, "z": {}, "limits": [2**63 - 1, -(2**63)]},
]


@pytest.mark.parametrize("value", RECORDS)
def test_the_fast_writer_gives_jsons_bytes(value: dict) -> None:
    assert dump_plain_json(value) == json.dumps(value, separators=(",", ":"), sort_keys=True).encode() \
        == dump_json(value)


# These records never hold an integer beyond 64 bits (counts, seqs and iterations are 32-bit),
# which orjson would read as a float.
@pytest.mark.parametrize("value", [record for record in RECORDS if "big" not in record])
def test_every_record_reads_back_as_json_reads_it(value: dict) -> None:
    stored = dump_json(value)
    assert load_plain_json(stored) == json.loads(stored)


def test_what_only_json_writes_still_reads() -> None:
    """json writes NaN and Infinity (not JSON, which orjson refuses to read)."""
    stored = json.dumps({"nan": math.nan, "inf": math.inf}).encode()
    read = load_plain_json(stored)
    assert math.isnan(read["nan"]) and read["inf"] == math.inf


@pytest.mark.parametrize("value", [{"summaryRef": "s:1", "iteration": 3, "replacedTurns": ("u1", "a1")},
                                   {"tokenCounter": "o200k_base", "note": "café", "after": 1}])  # json writes this one
def test_a_payload_in_its_own_key_order_is_jsons_too(value: dict) -> None:
    assert dump_plain_json(value, sort_keys=False) == json.dumps(value, separators=(",", ":")).encode()
