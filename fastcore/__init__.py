"""Compiled hot paths of the sidecar (Cython), each module ``_<name>.pyx`` with a readable
pure-Python twin ``_<name>_reference.py`` beside it:

- ``_fastcore`` (twin ``_fastcore_reference``): transcript window selection (max-fill and
  cache-stable), the recent turns, compaction cut, the log's own entries, code points;
- ``_search`` (twin ``_search_reference``): BM25 and cosine top-k for memory search;
- ``_matcher`` (twin ``_matcher_reference``): the multi-pattern matcher behind secret redaction;
- ``_entries`` (twin ``_entries_reference``): an append's new log entries, checked (the event
  rules) and made into their writes (records, keys, count records).

Importing this package imports the compiled modules or fails: there is no silent fallback to
Python, because the sidecar's latency figures are only true of the compiled code.
"""

try:
    from fastcore._entries import EVENT_RULES, event_faults, event_record, new_entries, unchecked_events
    from fastcore._fastcore import (
        NOT_A_UNIT,
        RECORD_SIZE,
        compaction_cut,
        count_code_points,
        own_entries,
        recent_start,
        select_stable_window,
        select_window,
        splits_group,
    )
    from fastcore._matcher import MultiMatcher
    from fastcore._search import bm25_top, cosine_top
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        f"fastcore's compiled extension is not built ({exc}). "
        "Install the package so it compiles: pip install -e . (needs gcc and the Python headers)."
    ) from exc

__all__ = ["EVENT_RULES", "NOT_A_UNIT", "RECORD_SIZE", "MultiMatcher", "bm25_top", "compaction_cut", "cosine_top",
           "count_code_points", "event_faults", "event_record", "new_entries", "own_entries", "recent_start",
           "select_stable_window", "select_window", "splits_group", "unchecked_events"]
