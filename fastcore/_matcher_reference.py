"""The readable pure-Python twin of ``fastcore._matcher``: multi-pattern matching for redaction.

This is the specification: tests run the compiled ``MultiMatcher`` and this one side by side on
fixed and random inputs and require identical answers. It is deliberately naive (every pattern
tried at every position, O(len(data) x patterns)); the compiled class reaches the same answers
in one pass whose cost per byte does not grow with the number of patterns.

Matches are leftmost-longest and non-overlapping: scanning from the start, at the leftmost
position where any pattern matches, the longest pattern matching there wins (among equal
patterns, the lowest index); the scan goes on after its end, so a match never overlaps an
earlier one, even where a different choice would have found more matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    from typing_extensions import Buffer


def _bytes(value: Buffer) -> bytes:
    """A copy of any bytes-like value (bytes, bytearray, memoryview, ...); TypeError otherwise."""
    return bytes(memoryview(value))


def _data(value: Buffer) -> bytes:
    """Scanned data must be a one-dimensional C-contiguous buffer of unsigned bytes (bytes,
    bytearray, a memoryview of either), as the compiled class reads it in place: TypeError for
    no buffer, BufferError for a strided one, ValueError for other shapes or item types."""
    view = memoryview(value)
    if not view.c_contiguous:
        raise BufferError("data must be C-contiguous")
    if view.ndim != 1 or view.format not in ("B", "c"):
        raise ValueError("data must be a one-dimensional buffer of unsigned bytes")
    return view.tobytes()


class MultiMatcher:
    """Finds every occurrence of any of ``patterns`` (at least one; none empty; duplicates
    allowed). A pattern's index is its position in ``patterns``."""

    def __init__(self, patterns: Sequence[bytes]) -> None:
        if hasattr(self, "_patterns"):
            raise RuntimeError("a MultiMatcher cannot be re-initialised; make a new one")
        patterns = [_bytes(pattern) for pattern in patterns]
        if not patterns:
            raise ValueError("at least one pattern is required")
        for index, pattern in enumerate(patterns):
            if not pattern:
                raise ValueError(f"pattern {index} is empty")
        self._patterns = patterns

    @property
    def patterns_count(self) -> int:
        return len(self._patterns)

    def find(self, data: bytes) -> list[tuple[int, int, int]]:
        """``(start, end, pattern_index)`` of each match, in increasing ``start`` order."""
        data = _data(data)
        matches: list[tuple[int, int, int]] = []
        position = 0
        while position < len(data):
            best = None  # the index of the longest pattern matching at this position
            for index, pattern in enumerate(self._patterns):
                if data.startswith(pattern, position):
                    if best is None or len(pattern) > len(self._patterns[best]):
                        best = index  # strictly longer: among equal patterns the first stays
            if best is None:
                position += 1
                continue
            end = position + len(self._patterns[best])
            matches.append((position, end, best))
            position = end
        return matches

    def replace(self, data: bytes, replacements: Sequence[bytes]) -> tuple[bytes, list[int]]:
        """``data`` with each match of :meth:`find` replaced by ``replacements[pattern_index]``,
        and the indexes matched, in order. ``replacements`` must have one entry per pattern;
        only the entries of matched patterns are read (any bytes-like value; TypeError if not)."""
        data = _data(data)
        if len(replacements) != len(self._patterns):
            raise ValueError(f"{len(replacements)} replacements for {len(self._patterns)} patterns")
        pieces: list[bytes] = []
        matched: list[int] = []
        position = 0
        for start, end, index in self.find(data):
            pieces.append(data[position:start])
            pieces.append(_bytes(replacements[index]))
            matched.append(index)
            position = end
        pieces.append(data[position:])
        return b"".join(pieces), matched
