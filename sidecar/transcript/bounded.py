"""What the turns keep in memory between calls (the answers of re-assemblies, the entries a window
was last read back with): a cache bounded by its entries and their bytes, the least recently
used going first. Thread-safe; each entry's size is the caller's measure of its bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


class BoundedCache(Generic[Key, Value]):
    def __init__(self, max_bytes: int, max_entries: int = 0) -> None:
        """``max_entries`` 0: bounded by bytes alone."""
        self._entries: OrderedDict[Key, tuple[Value, int]] = OrderedDict()
        self._bytes = 0
        self._max_bytes, self._max_entries = max_bytes, max_entries
        self._lock = threading.Lock()

    def get(self, key: Key) -> Value | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: Key, value: Value, size: int) -> None:
        """Keep ``value`` under ``key`` (replacing what was there); one larger than the whole
        bound is not kept."""
        if size > self._max_bytes:
            return
        with self._lock:
            replaced = self._entries.pop(key, None)
            self._bytes += size - (replaced[1] if replaced else 0)
            self._entries[key] = (value, size)
            while self._bytes > self._max_bytes or 0 < self._max_entries < len(self._entries):
                self._bytes -= self._entries.popitem(last=False)[1][1]

    def drop(self, which: Callable[[Key], bool]) -> None:
        """Drop every entry whose key is ``which``."""
        with self._lock:
            for key in [key for key in self._entries if which(key)]:
                self._bytes -= self._entries.pop(key)[1]
