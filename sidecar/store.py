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

# Which area owns which databases. A delete, fork or sweep of one area touches only its own
# databases: a run and a memory ref of the same name have keys of the same shape (tenant NUL name
# NUL), so only the database tells them apart. Every database is declared here, in one area.
AREAS: dict[str, tuple[bytes, ...]] = {
    # A run's log and what is derived from it, all under the run's key.
    "runs": (b"runs", b"events", b"event_ids", b"call_ids", b"iterations", b"counts", b"id_chunks", b"windows",
             b"log_entries", b"summaries", b"artifacts", b"replay", b"compaction_records",
             b"fed_forms"),
    # What a run feeds besides its log (profile, task, agent-state data, usage), under the run's key:
    # deleted and forked with its run.
    "run_context": (b"profiles", b"tasks", b"state_data", b"usage"),
    # Agent memory, under each memory ref's key.
    "memory": (b"mem_entries", b"mem_docs", b"mem_df", b"mem_postings", b"mem_vectors", b"mem_meta", b"mem_expiry",
               b"mem_compactions"),
    # The tenant's kept events (memory.compacted), under the tenant's key.
    "tenant_events": (b"tenant_events",),
}
DATABASES = tuple(name for names in AREAS.values() for name in names)
_GROW_AT = 0.8  # grow once this fraction of the map is in use
# The share of [storage] max_map_size that only deletes may use. Freeing N pages costs the
# freelist about 8N bytes (0.2% of what is freed) plus a few copied branch pages, so 1/32 lets
# one delete free the whole store.
DELETE_HEADROOM = 1 / 32


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


def sweep(txn: lmdb.Transaction, handles: dict[str, object], prefix: bytes) -> None:
    """Delete every record whose key starts with ``prefix`` from these databases (and no others)."""
    for handle in handles.values():
        cursor = txn.cursor(db=handle)
        if cursor.set_range(prefix):
            while cursor.key().startswith(prefix):
                if not cursor.delete():  # False: the cursor ran off the end
                    break


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

    def handles(self, *areas: str) -> dict[str, object]:
        """The database handles of these areas, by name: all that an area's code may touch."""
        return {name.decode(): self.db[name.decode()] for area in areas for name in AREAS[area]}

    def close(self) -> None:
        self.env.close()

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A short read-only snapshot."""
        with self._gate.shared(), self.env.begin() as txn:
            yield txn

    def write(self, work: Callable[[lmdb.Transaction], T], frees_space: bool = False) -> T:
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
                try:
                    with self._gate.shared(), self.env.begin(write=True) as txn:
                        result = work(txn)
                except lmdb.MapFullError:
                    self._grow(ceiling, required=True)  # raises StoreFull when it cannot
                    continue
                except lmdb.DiskError as exc:  # ENOSPC: the disk, not the map, is full
                    raise StoreFull(f"the store cannot write: {exc}") from None
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
