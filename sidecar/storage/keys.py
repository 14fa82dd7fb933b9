"""Key building blocks shared by every area: tenant scoping, numeric order, ranges.

Every key starts with the tenant id and a NUL byte; ids never contain NUL (``validation``), so
no key range of one tenant can overlap another's and no read crosses tenants by construction.
Domain code names a transaction by ``Txn`` (imported from here), so only the storage layer and
the areas' schema modules import ``lmdb`` itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeAlias

import lmdb

if TYPE_CHECKING:
    # The store opens every transaction without buffers=True, so what it reads is bytes, never a
    # memoryview: the type says so, and no caller has to narrow each value it reads.
    Txn: TypeAlias = lmdb.Transaction[bytes]
else:
    Txn = lmdb.Transaction  # a read or write transaction, as Store.read / Store.write hand it out
Db: TypeAlias = lmdb._Database  # the handle of one named database (Store.handles)


def be32(value: int) -> bytes:
    """Big-endian, so LMDB's byte order is numeric order."""
    return value.to_bytes(4, "big")


def scope(tenant: str, *parts: bytes) -> bytes:
    """A key prefix: tenant, then each part, each followed by NUL."""
    return b"".join([tenant.encode("utf-8"), b"\0", *(part + b"\0" for part in parts)])


def records_under(txn: Txn, handle: Db, prefix: bytes,
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


def keys_under(txn: Txn, handle: Db, prefix: bytes) -> Iterator[bytes]:
    """The keys (after the prefix) of the records whose key starts with ``prefix``, in key order,
    their values left unread: counting or skipping records this way copies no value."""
    cursor = txn.cursor(db=handle)
    if not cursor.set_range(prefix):
        return
    for key in cursor.iternext(keys=True, values=False):
        if not key.startswith(prefix):
            return
        yield key[len(prefix):]


def sweep(txn: Txn, handles: dict[str, Db], prefix: bytes) -> None:
    """Delete every record whose key starts with ``prefix`` from these databases (and no others)."""
    for handle in handles.values():
        cursor = txn.cursor(db=handle)
        if cursor.set_range(prefix):
            while cursor.key().startswith(prefix):
                if not cursor.delete():  # False: the cursor ran off the end
                    break


def last_under(txn: Txn, handle: Db, prefix: bytes, width: int) -> tuple[bytes, bytes] | None:
    """The record with the greatest key under ``prefix``, when its keys are ``prefix`` and ``width``
    more bytes: it is just before the first key past them."""
    cursor = txn.cursor(db=handle)
    found = cursor.prev() if cursor.set_range(prefix + b"\xff" * width) else cursor.last()
    if not found or not cursor.key().startswith(prefix):
        return None
    return cursor.key()[len(prefix):], cursor.value()
