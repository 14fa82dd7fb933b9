"""LMDB: one environment per process, named databases, tenant-scoped keys, a map that grows.

Every key starts with the tenant id and a NUL byte; ids never contain NUL (``validation``), so
no key range of one tenant can overlap another's and no read crosses tenants by construction.

Writes go through :meth:`Store.write`, which runs a function inside one write transaction, so a
call's writes land together or not at all. When the map is nearly full it is grown before the
next write; if a write still hits MDB_MAP_FULL, the map is grown and the function re-run. Growing
needs every transaction of this process closed, which ``_Gate`` arranges.
"""

from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import lmdb

from sidecar.errors import StoreFull

log = logging.getLogger(__name__)
T = TypeVar("T")

DATABASES = (b"runs", b"events", b"event_ids", b"call_ids", b"iterations", b"counts", b"id_chunks", b"windows",
             b"log_entries", b"summaries", b"artifacts", b"replay",
             b"mem_entries", b"mem_docs", b"mem_df", b"mem_postings", b"mem_vectors", b"mem_meta", b"mem_expiry",
             b"mem_compactions", b"tenant_events",
             b"profiles", b"tasks", b"state_data", b"usage", b"compaction_records")
_GROW_AT = 0.8  # grow once this fraction of the map is in use


def be32(value: int) -> bytes:
    """Big-endian, so LMDB's byte order is numeric order."""
    return value.to_bytes(4, "big")


def scope(tenant: str, *parts: bytes) -> bytes:
    """A key prefix: tenant, then each part, each followed by NUL."""
    return b"".join([tenant.encode("utf-8"), b"\0", *(part + b"\0" for part in parts)])


def records_under(txn: lmdb.Transaction, handle: object, prefix: bytes,
                  start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
    """The records whose key starts with ``prefix``, from ``prefix + start`` on, in key order, as
    (the key after the prefix, the value)."""
    cursor = txn.cursor(db=handle)
    if not cursor.set_range(prefix + start):
        return
    for key, value in cursor:
        if not key.startswith(prefix):
            return
        yield key[len(prefix):], value


def last_under(txn: lmdb.Transaction, handle: object, prefix: bytes, width: int) -> tuple[bytes, bytes] | None:
    """The record with the greatest key under ``prefix``, when its keys are ``prefix`` and ``width``
    more bytes: it is just before the first key past them."""
    cursor = txn.cursor(db=handle)
    found = cursor.prev() if cursor.set_range(prefix + b"\xff" * width) else cursor.last()
    if not found or not cursor.key().startswith(prefix):
        return None
    return cursor.key()[len(prefix):], cursor.value()


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
        self.db = {name.decode(): self.env.open_db(name) for name in DATABASES}

    def close(self) -> None:
        self.env.close()

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A short read-only snapshot."""
        with self._gate.shared(), self.env.begin() as txn:
            yield txn

    def write(self, work: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``work(txn)`` in one write transaction and commit; it may run twice if the map grows."""
        # One writer at a time: LMDB serialises writers anyway, and holding our own lock while
        # waiting keeps the gate free for a resize.
        with self._write_lock:
            while True:
                try:
                    with self._gate.shared(), self.env.begin(write=True) as txn:
                        result = work(txn)
                except lmdb.MapFullError:
                    self._grow(required=True)  # raises StoreFull when it cannot
                    continue
                except lmdb.DiskError as exc:  # ENOSPC: the disk, not the map, is full
                    raise StoreFull(f"the store cannot write: {exc}") from None
                self._grow(required=False)
                return result

    def map_usage(self) -> tuple[int, int]:
        """(bytes in use, map size)."""
        info = self.env.info()
        return (info["last_pgno"] + 1) * self._page_size, info["map_size"]

    def _grow(self, required: bool) -> None:
        used, size = self.map_usage()
        if not required and used < size * _GROW_AT:
            return
        new_size = size * 2
        if self.max_map_size:
            new_size = min(new_size, self.max_map_size)
        if new_size <= size:
            if required:
                raise StoreFull(f"the store is full: {size} bytes, the configured [storage] max_map_size")
            return
        with self._gate.exclusive():
            self.env.set_mapsize(new_size)
        log.info("LMDB map grown from %d to %d bytes (%d in use)", size, new_size, used)
