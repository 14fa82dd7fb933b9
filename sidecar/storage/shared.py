"""The shared store: a PostgreSQL-compatible database as the system of record that many sidecars
share ([storage] shared), each sidecar's LMDB its local index. Off by default.

What is shared are the LMDB records themselves, each row one (database, key, value), grouped by
*unit*: a run with its context, a memory ref, or a tenant's event log (``databases.UNIT_SHAPES``).
A unit is what a call reads and writes, so it is what is kept current and what is locked:

- a write (``environment.Store.write``) runs on LMDB through a recording transaction; what it put
  and deleted goes to PostgreSQL in one SQL transaction that also moves each written unit's
  version from the one this sidecar holds to the next. If another sidecar moved it meanwhile, the
  SQL transaction writes nothing (:class:`VersionConflict`) and the store loads the unit afresh and
  runs the call's work again. Only after PostgreSQL has committed is LMDB committed, with the new
  versions; the call is acknowledged after both.
- before a call, the sidecar asks for the versions of the units the call names (one query) and
  loads those whose version differs from the one it holds, so a run opened on another sidecar is
  found and a memory entry put there is listed here on the very next call.

SQL is kept to what the distributed PostgreSQL-protocol engines (CockroachDB, YugabyteDB, Citus)
also run: CREATE TABLE IF NOT EXISTS with composite primary keys; bytea, bigint and text columns;
INSERT ... ON CONFLICT ... DO UPDATE / DO NOTHING with RETURNING; UPDATE ... WHERE version = ...;
``= ANY(array)`` and ``unnest`` of arrays; read-committed writes and a repeatable-read read-only
transaction per load. Nothing else: no LISTEN/NOTIFY, sequences, triggers, advisory locks or
stored procedures. Every table's primary key starts with ``unit``, the distribution column on Citus.

One check goes beyond that SQL, on PostgreSQL alone: after a failover, an old primary started
again as a primary (on the timeline it had) lacks what was written since the promotion, and a
URL listing both hosts may reach it first. So each new connection reads its server's timeline
(``pg_walfile_name(pg_current_wal_lsn())``, the current WAL file's name) and a server on a lower
timeline than one this sidecar has reached is refused. An engine without these functions has no
timelines to compare: the check is off there. What covers the rest is engine-neutral: a unit's
version never goes back, so a copy held here at a higher version than the store's is refused
(``Store._load``), not replaced.
"""

from __future__ import annotations

import logging
import threading
import uuid
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sidecar.errors import SharedStoreUnavailable
from sidecar.storage.databases import AREAS, UNIT_SHAPES

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# Each step takes the schema from its index + 1 to the next version; step 0 creates version 1.
_MIGRATIONS: tuple[tuple[str, ...], ...] = ((
    """CREATE TABLE IF NOT EXISTS context_sidecar_units (
           unit bytea PRIMARY KEY,
           version bigint NOT NULL)""",
    # value NULL: the record was deleted at that version (kept, so that a sidecar holding an
    # older version learns of the delete from the records written since).
    """CREATE TABLE IF NOT EXISTS context_sidecar_records (
           unit bytea NOT NULL,
           db text NOT NULL,
           key bytea NOT NULL,
           value bytea,
           version bigint NOT NULL,
           PRIMARY KEY (unit, db, key))""",
    "CREATE INDEX IF NOT EXISTS context_sidecar_records_since ON context_sidecar_records (unit, version)",
),)
_META = """CREATE TABLE IF NOT EXISTS context_sidecar_meta (
               name text PRIMARY KEY,
               value text NOT NULL)"""

# A unit's id: a letter for its kind, then its key prefix (tenant NUL [name NUL]).
_KIND_LETTERS = {"run": b"r", "memory ref": b"m", "tenant": b"t"}
# Each database: (its units' kind letter, how many names follow the tenant in a unit's prefix).
_SHAPE_OF_DB = {name.decode(): (_KIND_LETTERS[kind], names)
                for area, (kind, names) in UNIT_SHAPES.items() for name in AREAS[area]}
# Each kind letter: the databases that hold its units' records (what a load replaces).
DATABASES_OF_KIND = {letter: tuple(db for db, (of, _) in _SHAPE_OF_DB.items() if of == letter)
                     for letter in _KIND_LETTERS.values()}


def unit_id(kind: str, tenant: str, name: str = "") -> bytes:
    """The unit of a run, memory ref (``name``) or tenant's event log, as the store names it."""
    names = 0 if kind == "tenant" else 1
    parts = [tenant.encode("utf-8"), b"\0"] + ([name.encode("utf-8"), b"\0"] if names else [])
    return _KIND_LETTERS[kind] + b"".join(parts)


def unit_of(db: str, key: bytes) -> bytes:
    """The unit a record of database ``db`` belongs to."""
    letter, names = _SHAPE_OF_DB[db]
    end = -1
    for _ in range(names + 1):
        end = key.index(b"\0", end + 1)
    return letter + key[:end + 1]


def describe(unit: bytes) -> str:
    """A unit as an error message names it: "run 'r1' of tenant 'acme'", ..."""
    kind = next(kind for kind, letter in _KIND_LETTERS.items() if letter == unit[:1])
    tenant, *name = [part.decode("utf-8", "replace") for part in unit[1:-1].split(b"\0")]
    of_tenant = f" of tenant {tenant!r}" if tenant else ""
    return f"the event log{of_tenant}" if kind == "tenant" else f"{kind} {name[0]!r}{of_tenant}"


def prefix_of(unit: bytes) -> bytes:
    """The key prefix every record of ``unit`` starts with."""
    return unit[1:]


class VersionConflict(Exception):
    """Another sidecar wrote these units since this one loaded them; nothing was written."""

    def __init__(self, units: Sequence[bytes]) -> None:
        super().__init__(f"{len(units)} unit(s) moved on")
        self.units = tuple(units)


# What a write sends: per unit, its records as (database, key, value), value None for a delete.
Changes = dict[bytes, list[tuple[str, bytes, bytes | None]]]


class SharedStore:
    """The PostgreSQL side: a connection pool, the schema, versions, loads and commits.
    Every failure to reach the database is raised as ``SharedStoreUnavailable``."""

    def __init__(self, url: str, pool_size: int, timeout: float) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise SharedStoreUnavailable("[storage] shared needs psycopg: pip install 'context-sidecar[shared]'") \
                from None
        self._psycopg = psycopg
        self._timeout = timeout
        self.reachable = True
        # The highest PostgreSQL timeline a connection of this sidecar has reached (a promotion
        # moves it on), and the connections whose server's timeline has been checked (each once).
        # None: the engine has no timelines.
        self.timeline: int | None = 0
        self._checked: weakref.WeakSet[Any] = weakref.WeakSet()
        self._timeline_lock = threading.Lock()
        # Every wait is bounded by [storage] shared_timeout, so a database that does not answer
        # holds no call longer: connect_timeout a connection attempt, the pool's timeout the wait
        # for a connection, statement_timeout a statement the server is slow to run, and
        # tcp_user_timeout an answer that never comes back over a connection that went dead.
        milliseconds = int(timeout * 1000)
        self._pool = ConnectionPool(
            url, min_size=1, max_size=pool_size, timeout=timeout, open=False, name="context-sidecar-shared",
            kwargs={"autocommit": True, "connect_timeout": max(1, round(timeout)),
                    "options": f"-c statement_timeout={milliseconds}", "tcp_user_timeout": milliseconds},
            # A failed connection is not retried in the background: the next call asks for a new
            # one, so service resumes as soon as the database answers again.
            reconnect_timeout=0)
        self._pool.open(wait=False)
        self.store_id = self._prepare()

    def close(self) -> None:
        self._pool.close()

    @contextmanager
    def _connection(self, read_only: bool = False) -> Iterator[Any]:
        """A connection from the pool, in autocommit mode: one statement is one round trip, and a
        block that needs a transaction opens one (``conn.transaction()``). ``read_only``:
        repeatable read, so that what a block reads is one snapshot."""
        psycopg = self._psycopg
        try:
            with self._pool.connection() as conn:
                with self._timeline_lock:
                    checked = conn in self._checked
                if not checked:
                    self._check_timeline(conn)
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ if read_only else None
                conn.read_only = read_only
                yield conn
            self.reachable = True
        except psycopg.errors.TransactionRollback:  # a serialization failure or deadlock: commit's to answer
            raise
        except (psycopg.OperationalError, psycopg.InterfaceError, _pool_timeout()) as error:
            self.reachable = False
            raise SharedStoreUnavailable(f"the shared store did not answer: {type(error).__name__}") from None

    def _check_timeline(self, conn: Any) -> None:
        """Refuse a new connection to a server on a lower timeline than this sidecar has reached:
        an old primary started again after a failover, which lacks what the new one has."""
        errors = self._psycopg.errors
        if self.timeline is not None:
            try:
                wal_file = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()[0]
            except (errors.UndefinedFunction, errors.FeatureNotSupported):  # an engine without timelines
                log.info("the shared store's engine has no timelines: the check after a failover is off")
                self.timeline = None
            except errors.ObjectNotInPrerequisiteState:  # "recovery is in progress"
                conn.close()  # the pool drops it
                raise SharedStoreUnavailable(
                    "the shared store's server is a standby, which takes no writes: list the primary in [storage] "
                    "shared, or every host with target_session_attrs=read-write") from None
            else:
                timeline = int(wal_file[:8], 16)  # a WAL file's name starts with its timeline, in hex
                with self._timeline_lock:
                    reached = self.timeline or 0
                    if timeline < reached:
                        conn.close()
                        raise _behind(timeline, reached)
                    if timeline > reached:
                        if reached:
                            log.warning("the shared store moved from timeline %d to %d: a failover", reached, timeline)
                        self.timeline = timeline
        with self._timeline_lock:
            self._checked.add(conn)

    def hold_timeline(self, reached: int) -> None:
        """Take timeline ``reached`` as reached (the local index keeps the highest one across
        restarts); refused if the server this sidecar has connected to is behind it."""
        with self._timeline_lock:
            if self.timeline is None or reached <= self.timeline:
                return
            if self.timeline:
                raise _behind(self.timeline, reached)
            self.timeline = reached

    @contextmanager
    def _transaction(self, holding: Holding | None, read_only: bool = False) -> Iterator[Any]:
        """A connection in a transaction: the one holding units (it ends there), or a new one."""
        if holding is not None:
            yield holding.conn
            return
        with self._connection(read_only) as conn, conn.transaction():
            yield conn

    def _prepare(self) -> str:
        """Create or migrate the tables; refuse a schema newer than this sidecar knows. Returns the
        store's id, which the local index keeps so that it never serves another store's copy."""
        with self._connection() as conn:
            conn.execute(_META)
        with self._connection() as conn, conn.transaction(), conn.cursor() as cursor:
            cursor.execute("SELECT name, value FROM context_sidecar_meta WHERE name = ANY(%s)",
                           (["schema_version", "store_id"],))
            meta = dict(cursor.fetchall())
            version = int(meta.get("schema_version", 0))
            if version > SCHEMA_VERSION:
                raise SharedStoreUnavailable(
                    f"the shared store's schema is version {version}; this sidecar knows versions up to "
                    f"{SCHEMA_VERSION}: upgrade the sidecar")
            for step in _MIGRATIONS[version:]:
                for statement in step:
                    cursor.execute(statement)
            if version < SCHEMA_VERSION:
                cursor.execute("INSERT INTO context_sidecar_meta (name, value) VALUES (%s, %s) "
                               "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                               ("schema_version", str(SCHEMA_VERSION)))
                log.info("shared store schema migrated from version %d to %d", version, SCHEMA_VERSION)
            # Two sidecars starting at once: the first id written stands.
            cursor.execute("INSERT INTO context_sidecar_meta (name, value) VALUES (%s, %s) "
                           "ON CONFLICT (name) DO NOTHING", ("store_id", str(uuid.uuid4())))
        with self._connection() as conn:
            return str(conn.execute("SELECT value FROM context_sidecar_meta WHERE name = 'store_id'").fetchone()[0])

    def ping(self) -> bool:
        try:
            with self._connection() as conn:
                conn.execute("SELECT 1")
            return True
        except SharedStoreUnavailable:
            return False

    def versions(self, units: Sequence[bytes]) -> dict[bytes, int]:
        """The current version of each unit that exists (one query)."""
        with self._connection() as conn, conn.cursor(binary=True) as cursor:
            if len(units) == 1:  # most calls name one unit; = is cheaper to send than ANY(array)
                cursor.execute("SELECT unit, version FROM context_sidecar_units WHERE unit = %s", (units[0],))
            else:
                cursor.execute("SELECT unit, version FROM context_sidecar_units WHERE unit = ANY(%s)", (list(units),))
            return {bytes(unit): version for unit, version in cursor.fetchall()}

    def load(self, unit: bytes, since: int = 0,
             holding: Holding | None = None) -> tuple[int, list[tuple[str, bytes, bytes | None]]]:
        """A unit's version and its records written after version ``since`` (value None: deleted),
        from one snapshot; ``since`` 0: every record there is. (0 and none: no such unit.)
        ``holding``: read in the transaction holding the unit (nothing else can write it)."""
        with self._transaction(holding, read_only=True) as conn:
            return self._load(conn, unit, since)

    @staticmethod
    def _load(conn: Any, unit: bytes, since: int) -> tuple[int, list[tuple[str, bytes, bytes | None]]]:
        with conn.cursor(binary=True) as cursor:
            cursor.execute("SELECT version FROM context_sidecar_units WHERE unit = %s", (unit,))
            found = cursor.fetchone()
            if since:
                cursor.execute("SELECT db, key, value FROM context_sidecar_records WHERE unit = %s AND version > %s",
                               (unit, since))
            else:
                cursor.execute("SELECT db, key, value FROM context_sidecar_records "
                               "WHERE unit = %s AND value IS NOT NULL", (unit,))
            rows = [(db, bytes(key), None if value is None else bytes(value)) for db, key, value in cursor.fetchall()]
        return (found[0] if found else 0), rows

    @contextmanager
    def holding(self, units: Sequence[bytes]) -> Iterator[Holding]:
        """The units' rows locked (SELECT ... FOR UPDATE) in a transaction that ends with the
        ``commit`` given the holding, or rolls back: while it is open, another sidecar's commit to
        them waits, then finds them moved on. A write that lost a unit to another sidecar runs
        again holding it, so that a sidecar writing a unit without pause cannot starve another."""
        with self._connection() as conn:
            conn.execute("BEGIN")
            holding = Holding(conn)
            try:
                # In one order on every sidecar (a commit's updates too), so two never wait on each other.
                conn.execute("SELECT version FROM context_sidecar_units WHERE unit = ANY(%s) ORDER BY unit FOR UPDATE",
                             (sorted(units),))
                yield holding
            except self._psycopg.errors.TransactionRollback:  # a deadlock or serialization failure
                raise VersionConflict(list(units)) from None
            finally:
                if not holding.ended and not conn.closed:
                    conn.execute("ROLLBACK")

    def commit(self, held: dict[bytes, int], changes: Changes, holding: Holding | None = None) -> dict[bytes, int]:
        """Write ``changes`` in one SQL transaction, moving each unit from the version ``held`` here
        to the next; the new versions. Nothing is written if any unit was not at the version held.
        ``holding``: in the transaction holding the units, which this ends."""
        try:
            return self._commit(held, changes, holding)
        except self._psycopg.errors.TransactionRollback:  # a serializable engine's word for the same
            raise VersionConflict(list(changes)) from None

    def _commit(self, held: dict[bytes, int], changes: Changes, holding: Holding | None) -> dict[bytes, int]:
        # The new versions are known before asking: each unit moves on by one from the version held
        # here, or the call writes nothing. So the statements go in one pipeline (one round trip),
        # and the COMMIT follows only if every unit moved.
        versions = {unit: held[unit] + 1 for unit in sorted(changes)}  # rows locked in one order (``holding``)
        # One statement for every record of the call; a delete is written as a NULL value.
        rows = [(unit, db, key, value, versions[unit])
                for unit, records in changes.items() for db, key, value in records]
        with self._transaction(holding) as conn:
            with conn.pipeline():
                moves = []
                for unit in versions:
                    cursor = conn.cursor()
                    if held[unit]:
                        cursor.execute("UPDATE context_sidecar_units SET version = version + 1 "
                                       "WHERE unit = %s AND version = %s RETURNING version", (unit, held[unit]))
                    else:  # not held here: it must not exist yet
                        cursor.execute("INSERT INTO context_sidecar_units (unit, version) VALUES (%s, 1) "
                                       "ON CONFLICT (unit) DO NOTHING RETURNING version", (unit,))
                    moves.append((unit, cursor))
                conn.execute(
                    "INSERT INTO context_sidecar_records (unit, db, key, value, version) "
                    "SELECT * FROM unnest(%s::bytea[], %s::text[], %s::bytea[], %s::bytea[], %s::bigint[]) "
                    "ON CONFLICT (unit, db, key) DO UPDATE SET value = excluded.value, version = excluded.version",
                    [list(column) for column in zip(*rows)])
            moved = [unit for unit, cursor in moves if cursor.fetchone() is None]
            if moved:  # leaving the block with an error rolls the transaction back
                raise VersionConflict(moved)
            if holding is not None:
                conn.execute("COMMIT")
                holding.ended = True
        return versions


class Holding:
    """An open transaction holding some units' rows (``SharedStore.holding``)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.ended = False


def _behind(timeline: int, reached: int) -> SharedStoreUnavailable:
    return SharedStoreUnavailable(
        f"the shared store's server is on timeline {timeline}, behind timeline {reached} that this sidecar "
        "reached before: an old primary started again after a failover, which lacks what was written since. "
        "Refused, neither read nor written: stop it, and make it a standby of the new primary (pg_rewind or a "
        "new pg_basebackup)")


def _pool_timeout() -> type[Exception]:
    from psycopg_pool import PoolTimeout
    return PoolTimeout
