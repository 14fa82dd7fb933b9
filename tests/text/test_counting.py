"""Token counters and clipping, recounted by an independent implementation.

tiktoken-based counts are checked against puretiktoken, a separate pure-Python BPE
implementation; `chars` against Python's own code-point length.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import puretiktoken
import pytest

from sidecar.errors import TokenBudgetExceeded, ValidationError
from sidecar.text.counting import Counters, elision_marker
from sidecar.text.encodings import EncodingIntegrityError, bundled_dir, load_encoding

SAMPLES = [
    "",
    "hello world",
    "The quick brown fox jumps over the lazy dog. " * 20,
    '{"tool": "search", "args": {"q": "refund policy", "limit": 10}, "ok": true}',
    "def f(x):\n    return [i * x for i in range(10)]  # code\n",
    "naïve café — 日本語のテキスト, emoji 😀👍🏽, Ελληνικά, עברית",
    "text that looks special: <|endoftext|> and <|endofprompt|>",
    "   leading and trailing whitespace\n\n\t  ",
]


@pytest.fixture(scope="module")
def independent():
    return {name: puretiktoken.get_encoding(name) for name in ("o200k_base", "cl100k_base")}


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_tiktoken_counts_match_an_independent_tokenizer(counters: Counters, independent, name: str) -> None:
    counter = counters.get(name)
    for text in SAMPLES:
        assert counter.count(text) == len(independent[name].encode_ordinary(text)), text


def test_chars_counts_code_points(counters: Counters) -> None:
    for text in SAMPLES:
        assert counters.get("chars").count(text) == len(text)


def test_unknown_counter_names_the_field(counters: Counters) -> None:
    with pytest.raises(ValidationError) as raised:
        counters.get("p50k_base", field="token_counter")
    assert raised.value.violations[0].field == "token_counter"


def test_host_defined_cannot_count_or_clip(counters: Counters) -> None:
    with pytest.raises(ValidationError):
        counters.get("host-defined").count("text")
    with pytest.raises(TokenBudgetExceeded):
        counters.get("host-defined").clip("text", 1)


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base", "chars"])
def test_clip_fits_its_target_and_keeps_head_and_tail(counters: Counters, independent, name: str) -> None:
    counter = counters.get(name)
    rng = random.Random(name)
    words = ["alpha", "beta", "gamma", "日本", "😀", "{", "}", "\n", "résumé", "0123456789"]
    text = " ".join(rng.choice(words) for _ in range(3000))
    total = counter.count(text)
    for target in (0, 5, 12, 40, 100, 1000, total - 1, total, total + 10):
        clipped = counter.clip(text, target)
        used = counter.count(clipped)
        if name != "chars":  # recount independently
            assert used == len(independent[name].encode_ordinary(clipped))
        assert used <= max(target, 0)
        if target >= total:
            assert clipped == text
            continue
        assert clipped == counter.clip(text, target), "clipping must be deterministic"
        if clipped:
            unit = "chars" if name == "chars" else "tokens"
            head, _, rest = clipped.partition("\n[... ")
            elided, _, tail = rest.partition(f" {unit} elided ...]\n")
            assert text.startswith(head) and text.endswith(tail)
            assert elided.isdigit() and int(elided) > 0
            if target >= 100:  # room for real content besides the marker
                assert len(head) > 0 and len(tail) > 0
                assert used >= target - counter.count(elision_marker(total, unit)) // 2 - 4


@pytest.mark.parametrize("name", ["o200k_base", "chars"])
def test_a_quoted_clip_is_one_json_string_between_its_frame(counters: Counters, independent, name: str) -> None:
    # A tool call's arguments clipped: the kept head, the marker and the tail as one JSON string.
    counter = counters.get(name)
    arguments = json.dumps({"path": "a.py", "content": 'print("x")\n\tif a < b: return "\\"\n' * 400})
    opening, closing = '{"clipped_arguments":', "}"
    floor = counter.marked_minimum(counter.count(arguments), opening, closing, quote=True)
    for target in (floor, floor + 7, 60, 300, counter.count(arguments) - 1):
        clipped = counter.clip(arguments, target, opening, closing, quote=True)
        used = counter.count(clipped)
        if name != "chars":
            assert used == len(independent[name].encode_ordinary(clipped))
        assert used <= target
        kept = json.loads(clipped)["clipped_arguments"]
        head, _, rest = kept.partition("\n[... ")
        assert arguments.startswith(head) and arguments.endswith(rest.partition(" elided ...]\n")[2])
    assert counter.clip(arguments, floor - 1, opening, closing, quote=True) == ""


def test_encodings_load_offline_from_the_bundled_files() -> None:
    assert (bundled_dir() / "o200k_base.tiktoken.gz").is_file()
    encoding = load_encoding("cl100k_base")
    assert encoding.encode_ordinary("hello world") == [15339, 1917]


def test_a_corrupted_encoding_file_is_refused_with_both_hashes(tmp_path: Path) -> None:
    original = gzip.decompress((bundled_dir() / "cl100k_base.tiktoken.gz").read_bytes())
    tampered = original.replace(b" 100\n", b" 101\n", 1)
    assert tampered != original
    (tmp_path / "cl100k_base.tiktoken.gz").write_bytes(gzip.compress(tampered))
    with pytest.raises(EncodingIntegrityError) as raised:
        load_encoding("cl100k_base", tmp_path)
    message = str(raised.value)
    assert "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7" in message  # tiktoken's
    assert "cl100k_base" in message and str(tmp_path) in message


def test_a_missing_encoding_file_is_a_clear_error(tmp_path: Path) -> None:
    shutil.copy(bundled_dir() / "o200k_base.tiktoken.gz", tmp_path)
    with pytest.raises(EncodingIntegrityError, match="cl100k_base"):
        Counters(tmp_path)
