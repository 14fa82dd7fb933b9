"""LMDB: one environment per process, its named databases (``databases``), a map that grows.

Writes go through :meth:`Store.write`, which runs a function inside one write transaction, so a
call's writes land together or not at all. When the map is nearly full it is grown before the
next write; if a write still hits MDB_MAP_FULL, the map is grown and the function re-run. Growing
needs every transaction of this process closed, which ``_Gate`` arranges.

With a shared store (``shared``), LMDB is the local index of it: each write is committed there
first, and :meth:`Store.current` loads what another sidecar changed before a call reads it.
"""

from __future__ import annotations

import contextvars
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar, cast, overload

import lmdb

from sidecar.errors import SharedStoreUnavailable, StoreFull, WriteConflict
from sidecar.storage.databases import AREAS, DATABASES, STORAGE_DATABASES
from sidecar.storage.keys import Db, Txn, sweep
from sidecar.storage.recording import RecordingTxn, apply
from sidecar.storage.shared import (
    DATABASES_OF_KIND,
    Changes,
    Holding,
    SharedStore,
    VersionConflict,
    describe,
    prefix_of,
    unit_of,
)
from sidecar.telemetry import metrics
from sidecar.telemetry.tracing import phase

log = logging.getLogger(__name__)
T = TypeVar("T")
U = TypeVar("U")

# What LMDB raises when it cannot open or use the store (a bad path, a lock, a corrupt file): the
# command line reports it without importing lmdb.
StoreError = lmdb.Error

_GROW_AT = 0.8  # grow once this fraction of the map is in use
# The share of [storage] max_map_size that only deletes may use. Freeing N pages costs the
# freelist about 8N bytes (0.2% of what is freed) plus a few copied branch pages, so 1/32 lets
# one delete free the whole store.
DELETE_HEADROOM = 1 / 32
# With a shared store: how many times a write runs again on a unit another sidecar moved on
# before the call is answered ABORTED. Each run reloads the unit first, so only a unit written
# elsewhere on every attempt exhausts them.
CONFLICT_ATTEMPTS = 8
_STORE_ID = b"\0store_id"  # in shared_versions: which shared store this local index holds
_TIMELINE = b"\0timeline"  # in shared_versions: the highest PostgreSQL timeline it was written on


# What the write transaction running in this context puts aside for once it commits (see
# :func:`after_commit`): one list per attempt at a transaction, run after its commit, dropped if
# it aborts or its commit fails. None: no write transaction is running here.
_on_commit: ContextVar[list[tuple[Callable[..., object], tuple]] | None] = ContextVar(
    "sidecar_on_commit", default=None)


def after_commit(action: Callable[..., object], *args: object) -> None:
    """``action(*args)`` once the write transaction running in this context commits, never if it
    is aborted (or its commit fails and it is run again); at once outside a write transaction,
    whose reads see committed records only. Every in-process cache fills through here what it
    learned inside a write: a turn refused after it appended its events or read its window writes
    nothing, and what it read must not be kept as if it had been written (its seqs and ids are
    the next turn's to take)."""
    pending = _on_commit.get()
    if pending is None:
        action(*args)
    else:
        pending.append((action, args))


class _Gate:
    """Many transactions at once, or one map resize with none open. A write transaction takes
    ``enter``/``leave`` as plain calls: every write passes them, and ``shared``'s generator costs
    about a microsecond more."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = 0
        self._resizing = False

    def enter(self) -> None:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._open += 1

    def leave(self) -> None:
        with self._cond:
            self._open -= 1
            if self._open == 0:
                self._cond.notify_all()

    @contextmanager
    def shared(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

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
    def __init__(self, path: str, map_size: int, max_map_size: int = 0, sync: bool = True,
                 shared: SharedStore | None = None) -> None:
        os.makedirs(path, exist_ok=True)
        self.env = lmdb.open(path, map_size=map_size, max_dbs=len(DATABASES) + len(STORAGE_DATABASES) + 8,
                             sync=sync, metasync=sync, max_readers=512)
        # Clear reader slots left by processes that died holding them (after kill -9).
        self.env.reader_check()
        self.max_map_size = max_map_size
        self._gate = _Gate()
        self._write_lock = threading.Lock()
        self._page_size = self.env.stat()["psize"]
        # The map's size as last read or set here: only this process resizes its map, so a write
        # needs LMDB's figures once, after it commits (``_grow``), not before it too.
        self._map_size = self.env.info()["map_size"]
        self._refuse_unassigned_databases()
        # Every handle, for whole-store tools (tests, dumps); each area's code gets only its own
        # through ``handles``.
        self.db = {name.decode(): self.env.open_db(name) for name in DATABASES}
        self.shared = shared
        self._names = {handle: name for name, handle in self.db.items()}
        # Where a write's ``then`` runs while its commit waits on the disk: one thread, as writes
        # are one at a time. Without sync a commit is too short to hide anything behind.
        self._while_syncing = ThreadPoolExecutor(1, "sidecar-while-syncing") if sync else None
        self._versions = self.env.open_db(b"shared_versions")
        self._timeline_kept = 0
        if shared:
            self._hold_store(shared.store_id)
            with self.env.begin() as txn:
                self._timeline_kept = int.from_bytes(txn.get(_TIMELINE, b"", db=self._versions), "big")
            shared.hold_timeline(self._timeline_kept)

    def _refuse_unassigned_databases(self) -> None:
        """A store holding a database that no area owns was written by another layout: serving it
        would leave that data outside every delete and fork, so say so instead."""
        with self.env.begin() as txn:
            stray = sorted(key.decode("utf-8", "replace") for key, _ in txn.cursor()
                           if key not in DATABASES and key not in STORAGE_DATABASES)
        if stray:
            path = self.env.path()
            self.env.close()
            raise ValueError(f"the store at {path!r} holds databases no area owns: {', '.join(stray)}")

    def handles(self, *areas: str) -> dict[str, Db]:
        """The database handles of these areas, by name: all that an area's code may touch."""
        return {name.decode(): self.db[name.decode()] for area in areas for name in AREAS[area]}

    def _hold_store(self, store_id: str) -> None:
        """Bind this local index to one shared store: it refuses a folder that holds another
        store's copy, or data of its own from before a shared store was configured."""
        with self.env.begin() as txn:
            held = txn.get(_STORE_ID, db=self._versions)
            empty = all(txn.stat(self.db[name.decode()])["entries"] == 0 for name in DATABASES)
        if held is not None and held.decode() != store_id:
            raise ValueError(f"the store at {self.env.path()!r} is the local index of another shared store "
                             f"({held.decode()}, not {store_id}): give this sidecar an empty [storage] path")
        if held is None and not empty:
            raise ValueError(f"the store at {self.env.path()!r} holds data of its own, not loaded from the shared "
                             "store: give this sidecar an empty [storage] path (the shared store is the record)")
        if held is None:
            with self.env.begin(write=True) as txn:
                txn.put(_STORE_ID, store_id.encode(), db=self._versions)

    def close(self) -> None:
        if self._while_syncing is not None:
            self._while_syncing.shutdown()
        if self.shared:
            # First: a write still waiting on the database (its commit unconfirmed past the drain)
            # is refused now and its LMDB transaction aborted, rather than closed under it.
            self.shared.close()
        with self._write_lock:
            self.env.close()

    @contextmanager
    def read(self) -> Iterator[Txn]:
        """A short read-only snapshot."""
        with self._gate.shared(), self.env.begin() as txn:
            yield txn

    @overload
    def write(self, work: Callable[[Txn], T], frees_space: bool = False) -> T: ...

    @overload
    def write(self, work: Callable[[Txn], T], frees_space: bool = False, *, then: Callable[[T], U]) -> U: ...

    def write(self, work: Callable[[Txn], T], frees_space: bool = False, *,
              then: Callable[[T], U] | None = None) -> T | U:
        """Run ``work(txn)`` in one write transaction and commit; it may run twice if the map grows.

        ``frees_space``: the write deletes (DeleteRun, DeleteArtifact, DeleteMemory). Only such
        writes may use the last ``DELETE_HEADROOM`` of ``max_map_size``: a delete needs a few free
        pages to free many (copy-on-write, the freelist), so a store that other writes filled can
        always be emptied through the API.

        ``then``: what the caller makes of ``work``'s result (its answer), returned in its place.
        With sync on it is made while the commit waits on the disk, on another thread (the commit
        lets go of the GIL), and returned once the commit is durable: so it must not touch the
        store, only the values ``work`` returned. If the commit fails it is thrown away with what
        it recorded (metrics, :func:`after_commit`), and made again from the work run again: the
        caller gets the answer of the transaction that committed, counted once."""
        ceiling = self._ceiling(frees_space)
        if self.shared:
            return self._write_shared(work, ceiling, then)
        # One writer at a time: LMDB serialises writers anyway, and holding our own lock while
        # waiting keeps the gate free for a resize.
        with self._write_lock:
            return self._write_local(work, ceiling, then)

    def _write_local(self, work: Callable[[Txn], T], ceiling: int, then: Callable[[T], U] | None = None) -> T | U:
        """Run ``work`` in one LMDB write transaction and commit it, growing the map as needed,
        and ``then`` on its result (while the commit syncs, when it does)."""
        self._keep_headroom(ceiling)
        while True:
            held, committed = metrics.transaction_begins(), False  # what work records counts once committed
            pending: list[tuple[Callable[..., object], tuple]] = []  # what it puts aside for after the commit
            this_attempt = _on_commit.set(pending)
            answer: Future[U] | None = None
            try:
                self._gate.enter()
                try:
                    txn = self.env.begin(write=True)
                    try:
                        result = work(txn)
                    except BaseException:
                        txn.abort()
                        raise
                    if then is not None and self._while_syncing is not None:
                        # In the caller's context (a copy: ``then`` records into this attempt's
                        # metrics and after-commit list), so that its trace's spans take what it records.
                        answer = self._while_syncing.submit(contextvars.copy_context().run, then, result)
                    with phase("commit"):  # the pages written, and synced unless [storage] sync is off
                        txn.commit()
                finally:
                    self._gate.leave()
                committed = True
            except lmdb.MapFullError:
                self._grow(ceiling, required=True)  # raises StoreFull when it cannot
                continue
            except lmdb.DiskError as exc:  # ENOSPC: the disk, not the map, is full
                raise StoreFull(f"the store cannot write: {exc}") from None
            finally:
                if answer is not None:
                    # ``then`` runs while the commit syncs: what it records belongs to this attempt,
                    # so it must be done before the attempt is counted (committed) or dropped (not).
                    answer.exception()  # waits for it to be done; what it raised is the caller's below
                _on_commit.reset(this_attempt)
                metrics.transaction_ends(held, committed)
                if committed:
                    for action, args in pending:
                        action(*args)
            self._grow(ceiling, required=False)
            if answer is not None:
                return answer.result()
            return then(result) if then is not None else result

    # The shared store. A unit's version held here is in shared_versions under the unit's id.

    def _write_shared(self, work: Callable[[Txn], T], ceiling: int, then: Callable[[T], U] | None) -> T | U:
        """``work`` on LMDB through a recording transaction; what it wrote committed to the shared
        store, moving each written unit on from the version held here; then LMDB. A unit another
        sidecar moved on meanwhile is loaded afresh and the work run again, from then on holding
        the units it lost (``SharedStore.holding``): another sidecar's commit to them waits, so
        one that writes them without pause cannot keep this one from landing."""
        assert self.shared is not None
        lost: tuple[bytes, ...] = ()
        for attempt in range(CONFLICT_ATTEMPTS):
            if attempt:  # two sidecars retrying in step would collide again: wait a random while
                time.sleep(random.uniform(0, 0.0005 * 2 ** attempt))
            with self._write_lock:
                try:
                    if not lost:
                        return self._write_local(self._recorded(work), ceiling, then)
                    with self.shared.holding(lost) as holding:
                        for unit in lost:
                            self._load(unit, ceiling, holding)
                        return self._write_local(self._recorded(work, holding), ceiling, then)
                except VersionConflict as conflict:  # nothing was written; the next attempt loads them
                    lost = tuple(sorted(set(lost) | set(conflict.units)))
        raise WriteConflict("other sidecars kept writing the same run or memory ref; nothing was written, "
                            "call again")

    def _recorded(self, work: Callable[[Txn], T], holding: Holding | None = None) -> Callable[[Txn], T]:
        """``work`` through a recording transaction, its records committed to the shared store
        before LMDB commits (``holding``: in the transaction holding their units)."""
        assert self.shared is not None
        shared = self.shared
        # Set once the shared store has committed: if LMDB's commit then fails and _write_local
        # runs this again (the map grown), the same records are written again, not the work re-run
        # (which could apply a call twice); so what the work put aside for after the commit
        # (``after_commit``) is put aside again, for the commit that lands those records.
        committed: tuple[Changes, dict[bytes, int], T, list] | None = None

        def recorded(txn: Txn) -> T:
            nonlocal committed
            pending = _on_commit.get()
            if committed is not None:
                changes, versions, result, put_aside = committed
                apply(txn, self.db, changes)
                if pending is not None:
                    pending.extend(put_aside)
            else:
                recording = RecordingTxn(txn, self._names)
                result = work(cast(Txn, recording))
                changes = recording.changes()
                if not changes:
                    return result
                held = {unit: self._held(txn, unit) for unit in changes}
                with phase("shared commit"):
                    versions = shared.commit(held, changes, holding)
                committed = changes, versions, result, list(pending or ())
            for unit, version in versions.items():
                self._hold(txn, unit, version)
            self._keep_timeline(txn)
            return result
        return recorded

    def version_held(self, txn: Txn, db: str, key: bytes) -> int:
        """The version held here of the unit a record of database ``db`` under ``key`` belongs to:
        it moves on with every write to the unit, through any sidecar (0 without a shared store)."""
        return self._held(txn, unit_of(db, key)) if self.shared else 0

    def _held(self, txn: Txn, unit: bytes) -> int:
        version = txn.get(unit, db=self._versions)
        return int.from_bytes(version, "big") if version else 0

    def _hold(self, txn: Txn, unit: bytes, version: int) -> None:
        """Record the version of ``unit`` held here (0: none, the unit does not exist)."""
        if version:
            txn.put(unit, version.to_bytes(8, "big"), db=self._versions)
        else:
            txn.delete(unit, db=self._versions)

    def _keep_timeline(self, txn: Txn) -> None:
        """Keep the highest PostgreSQL timeline reached with what is written here, so that a
        restarted sidecar refuses an old primary too (``SharedStore.hold_timeline``)."""
        timeline = self.shared.timeline if self.shared else None
        if timeline and timeline > self._timeline_kept:
            txn.put(_TIMELINE, timeline.to_bytes(8, "big"), db=self._versions)
            after_commit(setattr, self, "_timeline_kept", timeline)

    def current(self, units: list[bytes]) -> None:
        """Make the local copies of these units current: one query for their versions, and a load
        of each whose version differs from the one held here. Without a shared store, nothing."""
        if not self.shared or not units:
            return
        with phase("shared versions"):
            latest = self.shared.versions(units)
        with self.read() as txn:
            stale = [unit for unit in units if self._held(txn, unit) != latest.get(unit, 0)]
        if stale:
            ceiling = self._ceiling(False)
            with self._write_lock:
                for unit in stale:
                    self._load(unit, ceiling)

    def _load(self, unit: bytes, ceiling: int, holding: Holding | None = None) -> None:
        """Bring the local copy of ``unit`` to the shared store's version (the write lock held):
        the records written since the version held here, or all of them when none is held.
        ``holding``: read in the transaction holding the unit.

        A unit's version only moves on, so a store behind the version held here has lost what
        this sidecar saw (an old primary back after a failover, a restore from a backup): it is
        refused, neither served as current nor written to, and the copy here is kept."""
        assert self.shared is not None
        with self.read() as txn:
            held = self._held(txn, unit)
        with phase("shared load"):
            version, rows = self.shared.load(unit, held, holding)
        if version == held and not rows:
            return  # another call brought it up to date meanwhile: no write, no commit to sync
        if version < held:
            raise SharedStoreUnavailable(
                f"the shared store holds version {version} of {describe(unit)}, behind version {held} that this "
                "sidecar saw: it lost writes (an old primary back after a failover, or a restore from a backup?). "
                "Refused, neither read nor written: point [storage] shared at the current primary (after a "
                "restore, give each sidecar an empty [storage] path)")
        handles = {name: self.db[name] for name in DATABASES_OF_KIND[unit[:1]]}

        def bring_up_to_date(txn: Txn) -> None:
            if not held:
                sweep(txn, handles, prefix_of(unit))
            apply(txn, self.db, {unit: rows})
            self._hold(txn, unit, version)
            self._keep_timeline(txn)
        self._write_local(bring_up_to_date, ceiling)

    def _ceiling(self, frees_space: bool) -> int:
        """The largest map a write may grow to (0: no limit)."""
        if not self.max_map_size or frees_space:
            return self.max_map_size
        return self.max_map_size - max(int(self.max_map_size * DELETE_HEADROOM), self._page_size * 16)

    def _keep_headroom(self, ceiling: int) -> None:
        """After a delete grew the map into the headroom, bring it back (LMDB keeps it at least as
        large as the data), so that other writes do not take the headroom for themselves."""
        if not ceiling or self._map_size <= ceiling:
            return
        used, size = self.map_usage()
        if size > ceiling and size > used:
            self._resize(max(ceiling, used))

    def map_usage(self) -> tuple[int, int]:
        """(bytes in use, map size)."""
        info = self.env.info()
        return (info["last_pgno"] + 1) * self._page_size, info["map_size"]

    def _grow(self, ceiling: int, required: bool) -> None:
        used, size = self.map_usage()
        self._map_size = size
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
            self._map_size = self.env.info()["map_size"]
