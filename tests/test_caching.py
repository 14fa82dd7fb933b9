"""The caches' home (sidecar/caching.py): bounds in bytes and entries, the least recently used
going first, counts, a server's caches apart from another's, and off meaning nothing kept."""

from __future__ import annotations

import json
import random
import re
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.caching import DECLARED, ENTRY_BYTES, Cache, Caches, CacheSpec, cache_of, deep_bytes, text_bytes
from tests.helpers import ROOT, Sidecar

SPEC = CacheSpec("test", key="a name", valid="the test says so", max_bytes=1000 + 2 * ENTRY_BYTES, max_entries=3)


def test_what_is_kept_stays_within_its_bounds_and_the_least_recently_used_goes_first() -> None:
    cache: Cache[str, str] = Cache(SPEC)

    def held() -> list[str]:
        return [name for name in "abcdef" if cache.get(name)]

    for name in "abcd":
        cache.put(name, name, 100)
    assert held() == ["b", "c", "d"]  # at most 3 entries: the oldest, a, went
    cache.put("e", "e", 900)  # 1,200 bytes (and four entries' own) with b, c and d: the oldest go
    assert held() == ["d", "e"]
    cache.put("f", "f", 1001 + ENTRY_BYTES)  # larger than the whole bound: not kept, nothing else dropped
    assert held() == ["d", "e"]
    figures = cache.figures()
    assert (figures.bytes, figures.entries, figures.max_bytes) == (1000 + 2 * ENTRY_BYTES, 2, SPEC.max_bytes)
    assert figures.evictions == 3  # a, b, c
    cache.drop(lambda name: name == "d")
    assert held() == ["e"]
    cache.clear()
    for name in "abc":
        cache.put(name, name, 10)
    assert cache.get("a")  # a is now the most recently used
    cache.put("d", "d", 10)
    assert held() == ["a", "c", "d"]  # b, the least recently used, went


def test_hits_and_misses_are_counted() -> None:
    cache: Cache[str, str] = Cache(SPEC)
    assert cache.get_or_make("a", lambda: "made", len) == "made"
    assert cache.get_or_make("a", lambda: "again", len) == "made"
    assert cache.get("b") is None
    figures = cache.figures()
    assert (figures.hits, figures.misses) == (1, 2)


def test_off_keeps_nothing_and_reports_no_room() -> None:
    caches = Caches(enabled=False)
    cache = caches.of(SPEC)
    cache.put("a", "a", 1)
    assert cache.get("a") is None
    assert cache.get_or_make("a", lambda: "made", len) == "made"
    [figures] = [figure for figure in caches.figures() if figure.name == SPEC.name]
    assert (figures.bytes, figures.entries, figures.max_bytes) == (0, 0, 0)


def test_a_bound_of_zero_turns_one_cache_off() -> None:
    caches = Caches(bounds={SPEC.name: 0})
    caches.of(SPEC).put("a", "a", 1)
    assert caches.of(SPEC).get("a") is None


def test_each_servers_caches_are_its_own_and_found_only_within_its_calls() -> None:
    first, second = Caches(), Caches()
    with first.bound():
        cache_of(SPEC).put("a", "first", 1)
        assert cache_of(SPEC).get("a") == "first"
    with second.bound():
        assert cache_of(SPEC).get("a") is None
    assert cache_of(SPEC).get("a") is None  # outside any call: nothing is cached
    cache_of(SPEC).put("a", "outside", 1)
    assert cache_of(SPEC).get("a") is None

    seen = []
    with first.bound():  # another thread does not see this thread's binding
        thread = threading.Thread(target=lambda: seen.append(cache_of(SPEC).get("a")))
        thread.start()
        thread.join()
    assert seen == [None]


def test_two_declarations_cannot_share_a_name() -> None:
    with pytest.raises(ValueError, match="test"):
        CacheSpec("test", key="", valid="", max_bytes=1)


def test_sizes_count_what_python_holds() -> None:
    assert text_bytes("abc", b"de") == sys.getsizeof("abc") + sys.getsizeof(b"de")
    text = "x" * 10_000
    # Each object once, however often it is held.
    assert 2 * 10_000 < deep_bytes({"a": text, "b": (text, "y" * 10_000)}) < 3 * 10_000


# -- through a real sidecar process ---------------------------------------------------------------

MiB = 1 << 20


def rss_anon(pid: int) -> int:
    """A process's anonymous resident memory, in bytes (Linux)."""
    found = re.search(r"^RssAnon:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert found, "RssAnon is read from /proc/PID/status"
    return int(found[1]) * 1024


def cache_metrics(url: str) -> dict[str, dict[str, float]]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    figures: dict[str, dict[str, float]] = {}
    for name, cache, value in re.findall(r'^context_sidecar_cache_(\w+)\{cache="([^"]+)"\} (\S+)$', text, re.M):
        figures.setdefault(cache, {})[name] = float(value)
    return figures


def one_big_turn(stub, run_id: str, result: str) -> None:
    stub.OpenRun(pb.OpenRunRequest(run_id=run_id, token_counter="o200k_base", transcript_token_budget=32_000))
    answer = stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=1, render="anthropic_messages",
                                                            append_events=tool_turn_with(result)))
    assert json.dumps(result)[1:-1] in answer.rendered  # fed whole, not clipped


def tool_turn_with(result: str) -> list[pb.Event]:
    return [pb.Event(event_id="u", iteration=1, role="user", type="message", content="Read the report, please."),
            pb.Event(event_id="c", iteration=1, role="assistant", type="tool_call", call_id="c1",
                     tool_name="read_report", content='{"path": "report.md"}'),
            pb.Event(event_id="r", iteration=1, role="tool", type="tool_result", call_id="c1", content=result),
            pb.Event(event_id="a", iteration=1, role="assistant", type="message", content="It says little.")]


def test_memory_held_for_what_was_fed_stays_within_the_caches_bounds(tmp_path: Path) -> None:
    """Many runs of one turn with a ~100 KB tool result each: what the sidecar keeps grows up to
    its caches' bounds in bytes and no further (a cache bounded by entries kept ~2 MiB per MiB fed).
    Not a speed test: a bound on memory, with room for the allocator's own slack."""
    sidecar = Sidecar(tmp_path, "--metrics-listen", "127.0.0.1:0", "--log-level", "WARNING")
    words = "the quarterly report lists figures by region and the notes explain each change".split()
    rng = random.Random(3)

    def result(n: int) -> str:  # distinct texts, as tool results are
        return f"report {n}\n" + " ".join(rng.choice(words) for _ in range(18_000))

    try:
        for n in range(40):  # the warm-up: encodings, code paths, the allocator's arenas
            one_big_turn(sidecar.stub, f"warm-{n}", result(n))
        before = rss_anon(sidecar.process.pid)
        fed = 0
        for n in range(600):
            text = result(n)
            fed += len(text)
            one_big_turn(sidecar.stub, f"run-{n}", text)
        growth = rss_anon(sidecar.process.pid) - before
        figures = cache_metrics(sidecar.metrics_url)
    finally:
        sidecar.stop()
    assert fed > 55 * MiB
    # The caches' bounds this workload fills come to 72 MiB (docs/caches.md); most of it was
    # held already after the warm-up's 40 runs.
    assert growth < 100 * MiB, f"RssAnon grew {growth / MiB:.0f} MiB for {fed / MiB:.0f} MiB fed"
    assert {"history_items", "read_back"} <= set(figures)
    for name, figure in figures.items():
        assert figure["bytes"] <= figure["max_bytes"], name
    # The two that hold what was fed are full, and stayed so by evicting.
    for name in ("history_items", "read_back"):
        assert figures[name]["bytes"] > figures[name]["max_bytes"] / 2, name
        assert figures[name]["evictions_total"] > 0, name


def test_every_declared_cache_is_reported_and_listed_in_the_docs() -> None:
    import sidecar.wire.server  # noqa: F401  (declares every cache of the sidecar)

    assert {figure.name for figure in Caches().figures()} == set(DECLARED)
    page = (ROOT / "docs" / "caches.md").read_text(encoding="utf-8")
    assert [name for name in DECLARED if name != SPEC.name and f"| `{name}` (" not in page] == []
