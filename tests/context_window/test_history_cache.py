"""The history cache (sections.HistoryCache): a window's entries as items, kept across turns per
run, within its size."""

from __future__ import annotations

from sidecar.caching import Caches
from sidecar.context_window.sections import HISTORY_ITEMS, FedTranscript, HistoryCache
from sidecar.storage.codec import StoredEvent, encode_event
from sidecar.transcript.window import Clip, TranscriptWindow


def window(run_id: str, contents: list[str], clips: dict[int, Clip] | None = None) -> TranscriptWindow:
    events = [StoredEvent(seq, f"e{seq}", 1, "user", "message", text, "", len(text.split()))
              for seq, text in enumerate(contents)]
    return TranscriptWindow(run_id, 1, "o200k_base", 1000, sum(e.tokens for e in events), 0,
                            [e.event_id for e in events], [encode_event(e) for e in events], clips or {})


def as_fed(window: TranscriptWindow) -> FedTranscript:
    """The window as the turn gives it to the sections."""
    return FedTranscript(window.event_ids, window.records, window.clips, window.summaries_fed, window.token_count)


def fed(history) -> list[tuple[str, str, int]]:
    return [(item.event_id, item.text, item.tokens) for item in history]


def expected(of: TranscriptWindow) -> list[tuple[str, str, int]]:
    return [(entry.event.event_id, entry.text, entry.tokens) for entry in of.entries()]


def test_each_run_gets_its_own_entries_and_the_cache_keeps_within_its_size() -> None:
    caches = Caches(bounds={HISTORY_ITEMS.name: 2500})  # room for about one run's window
    cache = HistoryCache(caches)

    def held() -> int:
        [figures] = [figure for figure in caches.figures() if figure.name == HISTORY_ITEMS.name]
        assert figures.max_bytes == 2500
        return figures.bytes

    # Two runs whose events share ids but not contents; one entry of the second is fed clipped.
    first = window("a", ["alpha one", "alpha two", "alpha three"])
    second = window("b", ["beta one", "beta two two", "beta three"], {1: Clip("beta [...]", 2, 3)})
    for _ in range(3):
        for run, of in (("a", first), ("b", second)):
            assert fed(cache.items(as_fed(of), (run.encode(), "incarnation"))) == expected(of)
            assert 0 < held() <= 2500
    # The same run made again (another incarnation) is another run.
    again = window("a", ["gamma one", "gamma two", "gamma three"])
    assert fed(cache.items(as_fed(again), (b"a", "another incarnation"))) == expected(again)
    assert 0 < held() <= 2500
