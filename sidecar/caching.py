"""Every in-process cache of the sidecar, in one home (docs/caches.md lists them and why each is valid).

A cache is declared once, as a :class:`CacheSpec`: its name, what its key is, the rule that keeps
a value under that key valid, and its bound in bytes. Declarations are constants of the module that
uses them; what a cache holds belongs to a server: its :class:`Caches` (built from ``[cache]``
settings by the server's services) holds one :class:`Cache` per declaration, so two servers in one
process never share a value, and ``[cache] enabled = false`` turns every one of them off (a lookup
then always misses and nothing is kept; answers are the same, only slower).

Code that holds the server's services asks them (``caches.of(SPEC)``); code deep in a pure
function (a parse, a rendering step) asks :func:`cache_of`, which finds the caches of the server
whose call is running (:meth:`Caches.bound`, around each RPC; a context variable, so it follows
the call's thread and nothing else). Outside any call nothing is cached.

Each cache counts its hits, misses and evictions and the bytes it holds: the server's metrics read
them at scrape time. A value's bytes are the caller's measure (:func:`text_bytes` for texts), plus
:data:`ENTRY_BYTES` for the entry itself, so a cache of many small values is bounded too.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")

ENTRY_BYTES = 200  # an entry's own cost besides its value: its key, the dict's slot, the tuple kept


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """A cache's declaration: ``name`` (its metrics label), ``key`` (what it is looked up by),
    ``valid`` (why a value kept under a key is still the right one), ``max_bytes`` (its bound)
    and ``max_entries`` (0: bytes alone)."""

    name: str
    key: str
    valid: str
    max_bytes: int
    max_entries: int = 0

    def __post_init__(self) -> None:
        if DECLARED.setdefault(self.name, self) is not self:
            raise ValueError(f"two caches are declared as {self.name!r}")


# Every cache declared, by name (declarations only, never a value): the metrics' label values,
# the caches docs/caches.md must list.
DECLARED: dict[str, CacheSpec] = {}


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """What a cache reports: its bytes and entries now, its bound, and its counts since start."""

    name: str
    bytes: int
    max_bytes: int
    entries: int
    hits: int
    misses: int
    evictions: int


class Cache(Generic[Key, Value]):
    """One cache, bounded by its bytes (and optionally its entries), the least recently used going
    first. Thread-safe. Disabled: every lookup misses, nothing is kept."""

    def __init__(self, spec: CacheSpec, enabled: bool = True, max_bytes: int | None = None) -> None:
        """``max_bytes``: a bound other than the declared one (a setting's)."""
        self.spec = spec
        self.enabled = enabled and (spec.max_bytes if max_bytes is None else max_bytes) > 0
        self._max_bytes = spec.max_bytes if max_bytes is None else max_bytes
        self._entries: OrderedDict[Key, tuple[Value, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def get(self, key: Key) -> Value | None:
        if not self.enabled:
            return None
        # No lock: each OrderedDict call is atomic under the GIL, and an entry another thread
        # dropped meanwhile is simply not moved (the counts may then be off by one: they are figures).
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        try:
            self._entries.move_to_end(key)
        except KeyError:
            pass
        return found[0]

    def put(self, key: Key, value: Value, size: int) -> None:
        """Keep ``value`` under ``key``, replacing what was there; ``size``: its bytes (the entry's
        own are added). A value larger than the whole bound is not kept (and drops the old one)."""
        if not self.enabled:
            return
        size += ENTRY_BYTES
        with self._lock:
            replaced = self._entries.pop(key, None)
            if replaced is not None:
                self._bytes -= replaced[1]
            if size > self._max_bytes:
                return
            self._bytes += size
            self._entries[key] = (value, size)
            max_entries = self.spec.max_entries
            while self._bytes > self._max_bytes or 0 < max_entries < len(self._entries):
                self._bytes -= self._entries.popitem(last=False)[1][1]
                self.evictions += 1

    def get_or_make(self, key: Key, make: Callable[[], Value], size: Callable[[Value], int]) -> Value:
        """The value under ``key``, made and kept when missing (``size``: its bytes)."""
        found = self.get(key)
        if found is None:
            found = make()
            self.put(key, found, size(found))
        return found

    def drop(self, which: Callable[[Key], bool]) -> None:
        """Drop every entry whose key is ``which``."""
        with self._lock:
            for key in [key for key in self._entries if which(key)]:
                self._bytes -= self._entries.pop(key)[1]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def figures(self) -> CacheFigures:
        with self._lock:
            return CacheFigures(self.spec.name, self._bytes, self._max_bytes if self.enabled else 0,
                                len(self._entries), self.hits, self.misses, self.evictions)


class Caches:
    """A server's caches: one :class:`Cache` per declaration, made on first use."""

    def __init__(self, enabled: bool = True, bounds: dict[str, int] | None = None) -> None:
        """``bounds``: by a cache's name, a bound in bytes other than its declared one (0: off)."""
        self.enabled = enabled
        self._bounds = bounds or {}
        self._caches: dict[str, Cache] = {}
        self._lock = threading.Lock()

    def of(self, spec: CacheSpec) -> Cache:
        cache = self._caches.get(spec.name)
        if cache is None:
            with self._lock:
                cache = self._caches.get(spec.name)
                if cache is None:
                    cache = self._caches[spec.name] = Cache(spec, self.enabled, self._bounds.get(spec.name))
        if cache.spec is not spec:
            raise ValueError(f"two caches are declared as {spec.name!r}")
        return cache

    def figures(self) -> list[CacheFigures]:
        """Every declared cache's figures, by name, those not used yet too (the server's metrics
        read them at scrape time)."""
        for spec in list(DECLARED.values()):
            self.of(spec)
        with self._lock:
            caches = sorted(self._caches.values(), key=lambda cache: cache.spec.name)
        return [cache.figures() for cache in caches]

    def clear(self) -> None:
        with self._lock:
            caches = list(self._caches.values())
        for cache in caches:
            cache.clear()

    @contextmanager
    def bound(self) -> Iterator[None]:
        """These caches are the ones :func:`cache_of` finds while the block runs (in this thread)."""
        token = _current.set(self)
        try:
            yield
        finally:
            try:
                _current.reset(token)
            except ValueError:  # a stream closed from another thread than the one that began it
                pass

    def binding(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        """``behavior`` with these caches bound while it runs (a generator's: while it yields)."""
        if inspect.isgeneratorfunction(behavior):
            @functools.wraps(behavior)
            def streamed(*args: Any, **kwargs: Any) -> Iterator[Any]:
                with self.bound():
                    yield from behavior(*args, **kwargs)
            return streamed

        @functools.wraps(behavior)
        def called(*args: Any, **kwargs: Any) -> Any:
            with self.bound():
                return behavior(*args, **kwargs)
        return called


_current: ContextVar[Caches | None] = ContextVar("context_sidecar_caches", default=None)
_NONE = Caches(enabled=False)  # outside any server's call: every lookup misses


def cache_of(spec: CacheSpec) -> Cache:
    """The cache declared by ``spec`` of the server whose call is running (a disabled one outside
    any call)."""
    return (_current.get() or _NONE).of(spec)


def text_bytes(*values: str | bytes) -> int:
    """The memory ``values`` take (a str of non-ASCII text takes up to four bytes a character)."""
    return sum(map(sys.getsizeof, values))


def deep_bytes(value: object) -> int:
    """The memory ``value`` takes with everything it holds (its containers' and dataclasses' members,
    each object counted once): for values made rarely (a profile parsed, a layout), not per turn."""
    seen: set[int] = set()
    total = 0
    pending = [value]
    while pending:
        item = pending.pop()
        if id(item) in seen or item is None or isinstance(item, bool | int | float):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, str | bytes):
            continue
        if isinstance(item, dict):
            pending += item.keys()
            pending += item.values()
        elif isinstance(item, tuple | list | set | frozenset):
            pending += item
        else:
            slots = [name for cls in type(item).__mro__ for name in getattr(cls, "__slots__", ())]
            pending += [getattr(item, name) for name in slots if hasattr(item, name)]
            pending += getattr(item, "__dict__", {}).values()
    return total
