"""LMDB: one environment per process, its named databases (``databases``), a map that grows.

Writes go through :meth:`Store.write`, which runs a function inside one write transaction, so a
call's writes land together or not at all. When the map is nearly full it is grown before the
next write; if a write still hits MDB_MAP_FULL, the map is grown and the function re-run. Growing
needs every transaction of this process closed, which ``_Gate`` arranges.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import lmdb

from sidecar.errors import StoreFull
from sidecar.storage.databases import AREAS, DATABASES
from sidecar.storage.keys import Db, Txn
from sidecar.telemetry import metrics
from sidecar.telemetry.tracing import phase

log = logging.getLogger(__name__)
T = TypeVar("T")

# What LMDB raises when it cannot open or use the store (a bad path, a lock, a corrupt file): the
# command line reports it without importing lmdb.
StoreError = lmdb.Error

_GROW_AT = 0.8  # grow once this fraction of the map is in use
# The share of [storage] max_map_size that only deletes may use. Freeing N pages costs the
# freelist about 8N bytes (0.2% of what is freed) plus a few copied branch pages, so 1/32 lets
# one delete free the whole store.
DELETE_HEADROOM = 1 / 32


class _Gate:
    """Many transactions at once, or one map resize with none open."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = 0
        self._resizing = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._open += 1
        try:
            yield
        finally:
            with self._cond:
                self._open -= 1
                if self._open == 0:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._open:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


class Store:
    def __init__(self, path: str, map_size: int, max_map_size: int = 0, sync: bool = True) -> None:
        os.makedirs(path, exist_ok=True)
        self.env = lmdb.open(path, map_size=map_size, max_dbs=len(DATABASES) + 8, sync=sync,
                             metasync=sync, max_readers=512)
        # Clear reader slots left by processes that died holding them (after kill -9).
        self.env.reader_check()
        self.max_map_size = max_map_size
        self._gate = _Gate()
        self._write_lock = threading.Lock()
        self._page_size = self.env.stat()["psize"]
        self._refuse_unassigned_databases()
        # Every handle, for whole-store tools (tests, dumps); each area's code gets only its own
        # through ``handles``.
        self.db = {name.decode(): self.env.open_db(name) for name in DATABASES}

    def _refuse_unassigned_databases(self) -> None:
        """A store holding a database that no area owns was written by another layout: serving it
        would leave that data outside every delete and fork, so say so instead."""
        with self.env.begin() as txn:
            stray = sorted(key.decode("utf-8", "replace") for key, _ in txn.cursor() if key not in DATABASES)
        if stray:
            path = self.env.path()
            self.env.close()
            raise ValueError(f"the store at {path!r} holds databases no area owns: {', '.join(stray)}")

    def handles(self, *areas: str) -> dict[str, Db]:
        """The database handles of these areas, by name: all that an area's code may touch."""
        return {name.decode(): self.db[name.decode()] for area in areas for name in AREAS[area]}

    def close(self) -> None:
        self.env.close()

    @contextmanager
    def read(self) -> Iterator[Txn]:
        """A short read-only snapshot."""
        with self._gate.shared(), self.env.begin() as txn:
            yield txn

    def write(self, work: Callable[[Txn], T], frees_space: bool = False) -> T:
        """Run ``work(txn)`` in one write transaction and commit; it may run twice if the map grows.

        ``frees_space``: the write deletes (DeleteRun, DeleteArtifact, DeleteMemory). Only such
        writes may use the last ``DELETE_HEADROOM`` of ``max_map_size``: a delete needs a few free
        pages to free many (copy-on-write, the freelist), so a store that other writes filled can
        always be emptied through the API."""
        ceiling = self._ceiling(frees_space)
        # One writer at a time: LMDB serialises writers anyway, and holding our own lock while
        # waiting keeps the gate free for a resize.
        with self._write_lock:
            self._keep_headroom(ceiling)
            while True:
                held, committed = metrics.transaction_begins(), False  # what work records counts once committed
                try:
                    with self._gate.shared():
                        txn = self.env.begin(write=True)
                        try:
                            result = work(txn)
                        except BaseException:
                            txn.abort()
                            raise
                        with phase("commit"):  # the pages written, and synced unless [storage] sync is off
                            txn.commit()
                    committed = True
                except lmdb.MapFullError:
                    self._grow(ceiling, required=True)  # raises StoreFull when it cannot
                    continue
                except lmdb.DiskError as exc:  # ENOSPC: the disk, not the map, is full
                    raise StoreFull(f"the store cannot write: {exc}") from None
                finally:
                    metrics.transaction_ends(held, committed)
                self._grow(ceiling, required=False)
                return result

    def _ceiling(self, frees_space: bool) -> int:
        """The largest map a write may grow to (0: no limit)."""
        if not self.max_map_size or frees_space:
            return self.max_map_size
        return self.max_map_size - max(int(self.max_map_size * DELETE_HEADROOM), self._page_size * 16)

    def _keep_headroom(self, ceiling: int) -> None:
        """After a delete grew the map into the headroom, bring it back (LMDB keeps it at least as
        large as the data), so that other writes do not take the headroom for themselves."""
        used, size = self.map_usage()
        if ceiling and size > ceiling and size > used:
            self._resize(max(ceiling, used))

    def map_usage(self) -> tuple[int, int]:
        """(bytes in use, map size)."""
        info = self.env.info()
        return (info["last_pgno"] + 1) * self._page_size, info["map_size"]

    def _grow(self, ceiling: int, required: bool) -> None:
        used, size = self.map_usage()
        if not required and used < size * _GROW_AT:
            return
        new_size = min(size * 2, ceiling) if ceiling else size * 2
        if new_size <= size:
            if required:
                raise StoreFull(f"the store is full: {used} bytes in use of the configured [storage] max_map_size "
                                f"({self.max_map_size}), less what deletes keep in reserve")
            return
        self._resize(new_size)
        log.info("LMDB map grown from %d to %d bytes (%d in use)", size, new_size, used)

    def _resize(self, new_size: int) -> None:
        with self._gate.exclusive():
            self.env.set_mapsize(new_size)
