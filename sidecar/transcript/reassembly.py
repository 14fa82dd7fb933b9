"""Re-assemblies' answers, kept to be answered again without being built again.

An AssembleContext without events answers from the window persisted for its iteration
(``turn.Turn.as_persisted``). An iteration before the run's last assembled one is settled: fed as
persisted, whatever came later. Its answer is then a function of: its window record; records that
never change once written under the run's incarnation (an event at its seq, its id, a fed form
under its (seq, made_at), a summary's artifact while it exists); the run's layout; and the
request's render and max_transcript_tokens. The newest iteration's window is chosen again, to see
that nothing changed, from the run's record (the log's end, its summaries, its settings), the log
and the window before it; the log changes only with the run's record. So an answer built once is
given again while the window record's bytes, the incarnation, the layout and the budget are the
same, and for the newest iteration the run's record and the window before it too; and only when
the answer's cache state is the one persisted with the window (a state computed for another render
form is measured against the previous window, which a later assembly may replace).

The one write that makes the same records feed otherwise is deleting a summary's artifact
(DeleteArtifact): it forgets the run's answers. With a shared store another sidecar may delete
one, which reaches this sidecar as a load of the run: an answer is then given again only while
the run's version held here is the one it was built at (any write, through any sidecar, moves it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from sidecar.caching import Cache, Caches, CacheSpec

Answer = TypeVar("Answer")

# The most answers kept (their bytes are bounded by [context] reassembly_cache, which replaces the
# bound declared here). Re-assemblies come soon after the assembly they repeat, so the newest few
# hundred cover them; the oldest go first.
MAX_ENTRIES = 256
REASSEMBLIES = CacheSpec(
    "reassemblies", key="run key, iteration, max_transcript_tokens, render",
    valid="given only while the window record's bytes, the run's incarnation, its layout and the budget "
    "are those it was built from (the newest iteration's: and the run's record and the window before it); "
    "DeleteArtifact forgets the run's answers; with a shared store, only at the run's version it was built at",
    max_bytes=64 << 20, max_entries=MAX_ENTRIES)


@dataclass(frozen=True, slots=True)
class Kept(Generic[Answer]):
    stored: bytes  # the window record's bytes
    incarnation: str
    layout: object
    budget: int
    answer: Answer
    size: int
    # The newest iteration's answer is valid only while its plan would not change: the run's
    # record and the window before it, as stored then (None for a settled iteration's).
    run: bytes | None = None
    before: bytes | None = None
    version: int = 0  # with a shared store, the run's version held then (any write moves it)


class Reassemblies(Generic[Answer]):
    """Answers by (run key, iteration, max_transcript_tokens, render), with what makes them valid."""

    def __init__(self, caches: Caches) -> None:
        self._kept: Cache[tuple, Kept[Answer]] = caches.of(REASSEMBLIES)

    @property
    def enabled(self) -> bool:
        return self._kept.enabled

    def get(self, key: tuple, stored: bytes, incarnation: str, layout: object) -> Kept[Answer] | None:
        """The answer kept for ``key`` if it was built from this record, incarnation and layout."""
        kept = self._kept.get(key)
        if kept is None or kept.stored != stored or kept.incarnation != incarnation or kept.layout != layout:
            return None
        return kept

    def keep(self, key: tuple, kept: Kept[Answer]) -> None:
        self._kept.put(key, kept, kept.size)

    def forget(self, run_key: bytes) -> None:
        """Drop every answer of the run under ``run_key`` (the first part of each key)."""
        self._kept.drop(lambda key: key[0] == run_key)
