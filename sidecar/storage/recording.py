"""A write transaction that remembers what it wrote, for the shared store to send on.

With [storage] shared set, ``Store.write`` hands the call's work this wrapper instead of the LMDB
transaction: it does everything the transaction does, and keeps the last value put (or the
delete) of every key it touched, by database. The areas' code writes with ``txn.put``,
``txn.delete``, ``cursor.putmulti`` and ``cursor.delete`` only; the other LMDB writes are refused
here, so that no write can reach LMDB without reaching the shared store too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, cast

import lmdb

from sidecar.storage.keys import Db, Txn
from sidecar.storage.shared import Changes, unit_of

_UNRECORDED = frozenset({"replace", "pop", "putmulti", "drop"})


class RecordingTxn:
    __slots__ = ("_txn", "_names", "_written")

    def __init__(self, txn: Txn, names: dict[Db, str]) -> None:
        self._txn = txn
        self._names = names  # handle -> database name
        self._written: dict[tuple[str, bytes], bytes | None] = {}

    def put(self, key: bytes, value: bytes, dupdata: bool = True, overwrite: bool = True, append: bool = False, *,
            db: Db) -> bool:
        stored = self._txn.put(key, value, dupdata=dupdata, overwrite=overwrite, append=append, db=db)
        if stored:  # False: overwrite=False and the key was there
            self._written[(self._names[db], bytes(key))] = bytes(value)
        return stored

    def delete(self, key: bytes, value: bytes = b"", *, db: Db) -> bool:
        if value:
            raise NotImplementedError("deleting one duplicate is not recorded")
        deleted = self._txn.delete(key, db=db)
        if deleted:
            self._written[(self._names[db], bytes(key))] = None
        return deleted

    def cursor(self, db: Db) -> RecordingCursor:
        return RecordingCursor(self._txn.cursor(db=db), self, self._names[db])

    def __getattr__(self, name: str) -> Any:  # reads: the transaction's own
        if name in _UNRECORDED:
            raise AttributeError(f"{name} is not recorded for the shared store: write with put or delete")
        return getattr(self._txn, name)

    def changes(self) -> Changes:
        """What was written, by unit."""
        by_unit: Changes = {}
        for (db, key), value in self._written.items():
            by_unit.setdefault(unit_of(db, key), []).append((db, key, value))
        return by_unit


class RecordingCursor:
    __slots__ = ("_cursor", "_txn", "_db")

    def __init__(self, cursor: lmdb.Cursor, txn: RecordingTxn, db: str) -> None:
        self._cursor = cursor
        self._txn = txn
        self._db = db

    def delete(self, dupdata: bool = False) -> bool:
        if dupdata:
            raise NotImplementedError("deleting duplicates is not recorded")
        key = self._cursor.key()
        deleted = self._cursor.delete()
        if key:  # the cursor was on a record
            self._txn._written[(self._db, bytes(key))] = None
        return deleted

    def putmulti(self, items: Iterable[tuple[bytes, bytes]], dupdata: bool = True, overwrite: bool = True,
                 append: bool = False) -> tuple[int, int]:
        """Every item put (a batch of new records), each recorded."""
        if not overwrite:
            raise NotImplementedError("putmulti without overwrite is not recorded")
        items = list(items)
        done = self._cursor.putmulti(items, dupdata=dupdata, overwrite=overwrite, append=append)
        written = self._txn._written
        for key, value in items:
            written[(self._db, bytes(key))] = bytes(value)
        return done

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(cast(Iterator[tuple[bytes, bytes]], self._cursor))

    def __getattr__(self, name: str) -> Any:
        if name in _UNRECORDED or name == "put":
            raise AttributeError(f"cursor.{name} is not recorded for the shared store: write with txn.put")
        return getattr(self._cursor, name)


def apply(txn: Txn, handles: dict[str, Db], changes: Changes) -> None:
    """Write recorded changes into ``txn`` again, as they were recorded."""
    for records in changes.values():
        for db, key, value in records:
            if value is None:
                txn.delete(key, db=handles[db])  # False when it was not there: deleted either way
            else:
                txn.put(key, value, db=handles[db])
