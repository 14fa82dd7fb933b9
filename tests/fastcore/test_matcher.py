"""fastcore._matcher, the compiled multi-pattern matcher, against its pure-Python twin.

The twin (``fastcore._matcher_reference``) is the readable specification: fixed cases pin both
to hand-written answers, random cases over tiny alphabets (where matches overlap all the time)
require the two to agree exactly, for ``find`` and for ``replace``.
"""

from __future__ import annotations

import importlib.machinery
import random
import threading

import pytest
from fastcore._matcher import MultiMatcher

from fastcore import _matcher
from fastcore._matcher_reference import MultiMatcher as Reference

MATCHERS = pytest.mark.parametrize("cls", [MultiMatcher, Reference], ids=["compiled", "twin"])


def both_find(patterns: list[bytes], data: bytes) -> list[tuple[int, int, int]]:
    """The compiled answer, after checking that the twin gives the same."""
    found = MultiMatcher(patterns).find(data)
    assert found == Reference(patterns).find(data)
    return found


def both_replace(patterns: list[bytes], data: bytes, replacements: list[bytes]) -> tuple[bytes, list[int]]:
    done = MultiMatcher(patterns).replace(data, replacements)
    assert done == Reference(patterns).replace(data, replacements)
    return done


def test_the_compiled_class_is_compiled() -> None:
    assert MultiMatcher.__module__ == "fastcore._matcher"
    assert _matcher.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert Reference.__name__ == MultiMatcher.__name__


# -- fixed cases ----------------------------------------------------------------------------

E = "é".encode()
NIHON = "日本".encode()
GRIN = "😀".encode()

FIXED = [
    # one pattern a prefix of another: the longest wins where both start
    ([b"secret", b"secret-key-123"], b"my secret-key-123 and secret-key-12", [(3, 17, 1), (22, 28, 0)]),
    ([b"secret-key-123", b"secret"], b"secret-key-123", [(0, 14, 0)]),
    # overlapping patterns: the leftmost wins and hides the others
    ([b"abcd", b"bcde", b"cdef"], b"abcdef", [(0, 4, 0)]),
    ([b"bcdef", b"abc"], b"abcdef", [(0, 3, 1)]),
    # a match ending later but starting earlier beats one found first
    ([b"bc", b"abcd"], b"abcd", [(0, 4, 1)]),
    ([b"bc", b"abcd"], b"abce", [(1, 3, 0)]),
    # after a match, a shorter pattern ending where a longer (overlapping) one ends
    ([b"ab", b"bcd", b"cd"], b"abcd", [(0, 2, 0), (2, 4, 2)]),
    # adjacent matches, at the start and at the end
    ([b"ab", b"cd"], b"abcdab", [(0, 2, 0), (2, 4, 1), (4, 6, 0)]),
    ([b"xy"], b"xy---xy", [(0, 2, 0), (5, 7, 0)]),
    ([b"key"], b"key", [(0, 3, 0)]),
    # no match, empty data
    ([b"secret"], b"nothing to see here", []),
    ([b"secret"], b"secre", []),
    ([b"a"], b"", []),
    # multi-byte UTF-8 in patterns and data; a shared lead byte is not a match
    ([E, NIHON, GRIN], "café 日本語 😀!".encode(), [(3, 5, 0), (6, 12, 1), (16, 20, 2)]),
    ([E], "è ê é".encode(), [(6, 8, 0)]),
    (["tóken-日本".encode()], "a tóken-日本 b tóken-日".encode(), [(2, 15, 0)]),
    ([GRIN + GRIN, GRIN], (GRIN * 3), [(0, 8, 0), (8, 12, 1)]),
    # duplicates: the lowest index
    ([b"dup", b"x", b"dup"], b"a dup", [(2, 5, 0)]),
    ([b"x", b"dup", b"dup"], b"dupdup", [(0, 3, 1), (3, 6, 1)]),
    # a run of one byte: greedy, longest first
    ([b"a", b"aa", b"aaa"], b"a" * 10, [(0, 3, 2), (3, 6, 2), (6, 9, 2), (9, 10, 0)]),
    # every byte value is fair game
    ([b"\x00\xff", b"\xff"], b"\xff\x00\xff\xff", [(0, 1, 1), (1, 3, 0), (3, 4, 1)]),
]


@pytest.mark.parametrize("patterns, data, expected", FIXED, ids=range(len(FIXED)))
def test_find_fixed(patterns: list[bytes], data: bytes, expected: list[tuple[int, int, int]]) -> None:
    assert both_find(patterns, data) == expected


@pytest.mark.parametrize("patterns, data, expected", FIXED, ids=range(len(FIXED)))
def test_replace_fixed(patterns: list[bytes], data: bytes, expected: list[tuple[int, int, int]]) -> None:
    replacements = [b"<%d>" % k for k in range(len(patterns))]
    redacted, matched = both_replace(patterns, data, replacements)
    assert matched == [index for _, _, index in expected]
    pieces, position = [], 0
    for start, end, index in expected:
        pieces += [data[position:start], replacements[index]]
        position = end
    assert redacted == b"".join(pieces) + data[position:]


def test_pattern_equal_to_whole_input() -> None:
    data = "the whole input, 日本 😀".encode()
    assert both_find([b"whole", data, b"input"], data) == [(0, len(data), 1)]
    assert both_replace([b"whole", data], data, [b"1", b""]) == (b"", [1])


def test_replace_lengths_and_types() -> None:
    patterns = [b"secret", b"secret-key-123", "日本".encode()]
    data = "my secret-key-123, a secret and 日本.".encode()
    replacements = [b"[S]", bytearray(b""), memoryview("[秘密]".encode())]
    assert both_replace(patterns, data, replacements) == ("my , a [S] and [秘密].".encode(), [1, 0, 2])
    assert both_replace(patterns, b"nothing", replacements) == (b"nothing", [])
    assert both_replace(patterns, b"", replacements) == (b"", [])
    assert type(MultiMatcher(patterns).replace(bytearray(data), replacements)[0]) is bytes


@MATCHERS
def test_patterns_count(cls) -> None:
    assert cls([b"a"]).patterns_count == 1
    assert cls([b"a", b"b", b"a"]).patterns_count == 3


@MATCHERS
def test_patterns_are_copied(cls) -> None:
    pattern = bytearray(b"secret")
    matcher = cls([pattern, memoryview(b"other")])
    pattern[:] = b"public"
    assert matcher.find(b"a secret, not public") == [(2, 8, 0)]


# -- random cases ---------------------------------------------------------------------------

def random_case(rng: random.Random) -> tuple[list[bytes], bytes]:
    """1-40 patterns of 1-8 bytes and 0-200 bytes of data over a tiny alphabet (sometimes of
    multi-byte characters, cut anywhere), some patterns cut from the data itself."""
    kind = rng.random()
    if kind < 0.4:
        alphabet = [b"a", b"b"]
    elif kind < 0.7:
        alphabet = [b"a", b"b", b"c"]
    elif kind < 0.85:
        alphabet = [c.encode() for c in ("a", "é", "日", "😀")]
    else:
        alphabet = [bytes([b]) for b in rng.sample(range(256), rng.randint(1, 4))]
    data = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))[: rng.randint(0, 200)]
    patterns = []
    for _ in range(rng.randint(1, 40)):
        length = rng.randint(1, 8)
        if data and rng.random() < 0.3:
            start = rng.randrange(len(data))
            pattern = data[start:start + length]
        else:
            pattern = b"".join(rng.choice(alphabet) for _ in range(length))[:length]
        patterns.append(pattern)
    return patterns, data


def test_random_find_and_replace() -> None:
    rng = random.Random(20240611)
    for _ in range(3000):
        patterns, data = random_case(rng)
        compiled, twin = MultiMatcher(patterns), Reference(patterns)
        assert compiled.find(data) == twin.find(data), (patterns, data)
        replacements = [b"#" * rng.randint(0, 3) for _ in patterns]
        assert compiled.replace(data, replacements) == twin.replace(data, replacements), (patterns, data)


def test_random_many_patterns() -> None:
    """Hundreds of overlapping patterns (deep sparse states, long failure chains)."""
    rng = random.Random(5)
    for _ in range(30):
        patterns = [bytes(rng.choice(b"ab") for _ in range(rng.randint(1, 12))) for _ in range(300)]
        data = bytes(rng.choice(b"ab") for _ in range(500))
        assert MultiMatcher(patterns).find(data) == Reference(patterns).find(data)
    for count in (1000, 1000, 6000):  # 6000 over all 256 byte values: not every shallow state is dense
        patterns = [bytes(rng.randrange(256) for _ in range(rng.randint(1, 6))) for _ in range(count)]
        data = b"".join(rng.choice(patterns) + bytes([rng.randrange(256)]) for _ in range(100))
        assert MultiMatcher(patterns).find(data) == Reference(patterns).find(data)


def test_large_data_across_chunks() -> None:
    """The scan goes through the data in chunks of 64 KiB or more: matches straddling their
    edges, and long patterns (which widen the chunks), come out as in one piece."""
    rng = random.Random(11)
    data = bytes(rng.choice(b"ab") for _ in range(300_000))
    patterns = [b"ab" * 5, b"b" * 4, b"aab", b"ba" * 9 + b"a"]
    assert both_find(patterns, data)
    long_pattern = bytes(rng.choice(b"ab") for _ in range(20_000))
    data = bytearray(data)
    for at in (0, 65_530, 80_000 - 3, 160_001, len(data) - len(long_pattern)):
        data[at:at + len(long_pattern)] = long_pattern
    found = both_find([long_pattern, b"ab" * 3], bytes(data))
    assert sum(1 for _, _, index in found if index == 0) >= 3


def test_runs_of_one_byte_stay_linear() -> None:
    found = MultiMatcher([b"a", b"aa", b"aaa"]).find(b"a" * 1_000_000)
    assert len(found) == 333_334
    assert found[0] == (0, 3, 2) and found[-2] == (999_996, 999_999, 2) and found[-1] == (999_999, 1_000_000, 0)
    found = MultiMatcher([b"a", b"a" * 200]).find((b"a" * 199 + b"b") * 1000)
    assert len(found) == 199_000 and all(end - start == 1 for start, end, _ in found)


# -- errors ---------------------------------------------------------------------------------

@MATCHERS
def test_errors(cls) -> None:
    with pytest.raises(ValueError):
        cls([])
    with pytest.raises(ValueError, match="pattern 1 is empty"):
        cls([b"a", b"", b"b"])
    with pytest.raises(TypeError):
        cls(["not bytes"])
    with pytest.raises(TypeError):
        cls(b"abc")  # a bytes object is not a list of patterns
    matcher = cls([b"a", b"b"])
    for wrong in ([], [b"x"], [b"x", b"y", b"z"]):
        with pytest.raises(ValueError):
            matcher.replace(b"ab", wrong)
    with pytest.raises(TypeError):
        matcher.find("text, not bytes")
    with pytest.raises(TypeError):
        matcher.find(None)
    with pytest.raises(TypeError):
        matcher.replace(b"a", ["str", b"y"])  # a matched pattern's replacement must be bytes-like
    assert matcher.replace(b"b", ["unused", b"y"]) == (b"y", [1])  # an unmatched one is not read
    with pytest.raises(RuntimeError):
        matcher.__init__([b"c"])  # a matcher never changes: scans run without the GIL
    assert matcher.find(b"abc") == [(0, 1, 0), (1, 2, 1)]


@MATCHERS
def test_unusual_buffers(cls) -> None:
    matcher = cls([b"ab"])
    with pytest.raises(BufferError):
        matcher.find(memoryview(b"aabb")[::2])  # strided
    with pytest.raises(ValueError):
        matcher.find(memoryview(b"abab").cast("B", (2, 2)))
    import array
    with pytest.raises(ValueError):
        matcher.find(array.array("i", [1, 2]))
    assert matcher.find(array.array("B", b"xab")) == [(1, 3, 0)]


# -- buffers and the GIL --------------------------------------------------------------------

def test_bytearray_and_memoryview_inputs() -> None:
    patterns = [b"secret", "日本".encode()]
    text = "a secret, 日本, secret".encode()
    expected = MultiMatcher(patterns).find(text)
    assert expected == [(2, 8, 0), (10, 16, 1), (18, 24, 0)]
    for cls in (MultiMatcher, Reference):
        matcher = cls(patterns)
        buffer = bytearray(text)
        assert matcher.find(buffer) == expected
        assert matcher.replace(buffer, [b"*", b"+"]) == (b"a *, +, *", [0, 1, 0])
        view = memoryview(buffer)
        assert matcher.find(view) == expected
        assert matcher.find(view[2:16]) == [(0, 6, 0), (8, 14, 1)]  # offsets are the view's
        assert matcher.find(memoryview(text)) == expected
        view.release()
        # Nothing is left holding the buffer, after a success or an error: it can still resize.
        with pytest.raises(ValueError):
            matcher.replace(buffer, [b"too few"])
        buffer.extend(b" secret")
        del buffer[:2]
        assert matcher.find(buffer) == [(0, 6, 0), (8, 14, 1), (16, 22, 0), (23, 29, 0)]


def test_concurrent_scans() -> None:
    """Scans release the GIL: threads sharing one matcher get the answers of a lone scan."""
    rng = random.Random(3)
    secrets = [bytes(rng.randrange(33, 127) for _ in range(rng.randint(8, 40))) for _ in range(200)]
    chunks = []
    for _ in range(20_000):
        chunks.append(b"plain words, nothing to hide " if rng.random() < 0.95 else rng.choice(secrets))
    data = bytearray(b"".join(chunks))
    matcher = MultiMatcher(secrets)
    expected = matcher.find(data)
    assert expected
    replaced = matcher.replace(data, [b"x"] * len(secrets))
    results: list[object] = []

    def work() -> None:
        for _ in range(5):
            results.append(matcher.find(data) == expected and matcher.replace(data, [b"x"] * len(secrets)) == replaced)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 20
    data.extend(b"!")  # and no buffer is left exported
