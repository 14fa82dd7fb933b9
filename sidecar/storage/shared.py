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

A COMMIT is bounded too: PostgreSQL holds it while the synchronous standby it waits for is gone,
and ``statement_timeout`` does not cover that wait. Past ``shared_timeout`` the connection's
socket is shut (:class:`_Watchdog`), so the call is refused as the loss of a connection would be:
the commit may have landed on the primary alone, and the next call that names its units finds
out (their version moved on, or not). Never by cancelling the query: PostgreSQL answers a COMMIT
whose wait is cancelled with a warning and success, for a write the standby never got.
"""

from __future__ import annotations

import heapq
import logging
import os
import socket
import threading
import time
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


class _Watchdog:
    """Bounds waits on connections: one thread shuts down the socket of a connection whose wait
    outlived its deadline, and the waiting thread then sees the connection lost (the pool drops
    it). Shutting the socket (not closing it, nor the connection, which its waiting thread owns)
    leaves libpq's descriptor to it alone. Once a wait's block is left, its socket is not shut."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadlines: list[tuple[float, int, _Wait]] = []
        self._count = 0
        self._closing = False
        self._thread: threading.Thread | None = None

    @contextmanager
    def bounding(self, conn: Any, seconds: float) -> Iterator[_Wait]:
        wait = _Wait(conn)
        with self._cond:
            if self._closing:  # the sidecar is stopping: nothing waits on the database any more
                wait.expire()
            else:
                self._count += 1
                heapq.heappush(self._deadlines, (time.monotonic() + seconds, self._count, wait))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="shared-store-watchdog", daemon=True)
                    self._thread.start()
                if self._deadlines[0][2] is wait:  # the first to expire: the thread sleeps until a later one
                    self._cond.notify()
        try:
            yield wait
        finally:
            with self._cond:
                wait.left = True

    def close(self) -> None:
        """End every wait now, and each one begun from now on at once."""
        with self._cond:
            self._closing = True
            for _, _, wait in self._deadlines:
                wait.expire()
            self._deadlines.clear()
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closing:
                now = time.monotonic()
                while self._deadlines and (self._deadlines[0][2].left or self._deadlines[0][0] <= now):
                    _, _, wait = heapq.heappop(self._deadlines)
                    wait.expire()
                self._cond.wait(self._deadlines[0][0] - now if self._deadlines else None)


class _Wait:
    """One bounded wait: ``expired`` once its connection's socket was shut."""

    def __init__(self, conn: Any) -> None:
        # Read by the thread that owns the connection: libpq closes it only when the connection
        # is closed, which that thread does after leaving the block (``left``) if at all.
        self.fileno: int = conn.fileno()
        self.left = False
        self.expired = False

    def expire(self) -> None:  # under the watchdog's lock
        if self.left or self.expired:
            return
        self.expired = True
        try:
            with socket.socket(fileno=os.dup(self.fileno)) as duplicate:
                duplicate.shutdown(socket.SHUT_RDWR)
        except OSError:  # the peer is gone already: the wait ends by itself
            pass


def _unconfirmed(why: str) -> SharedStoreUnavailable:
    return SharedStoreUnavailable(
        f"the shared store did not confirm the write's commit {why}: the write may or may not have landed "
        "(the primary may have committed it and be waiting for a synchronous standby that is gone). The next "
        "call that names its run or memory ref finds out: look for it, or call again (appends by event id, "
        "puts by entry id and summaries by range are idempotent)")


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
        self._watchdog = _Watchdog()
        # The server processes of this sidecar's commits that were not confirmed (a write's, a
        # health probe's): while one still waits for its synchronous standby, writes and probes
        # are refused at once rather than leave one more process waiting on the server each.
        self._waiting: set[int] = set()
        self._waiting_lock = threading.Lock()
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
        """Every wait on the database ends now (a write still waiting on its commit is refused)."""
        self._watchdog.close()
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
        with self._connection() as conn, self._begun(conn) as begun, conn.cursor() as cursor:
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
            self._end(begun)
        with self._connection() as conn:
            return str(conn.execute("SELECT value FROM context_sidecar_meta WHERE name = 'store_id'").fetchone()[0])

    def ping(self) -> bool:
        """Whether the store takes writes: a transaction that writes one row of its own (the
        ``heartbeat`` row of context_sidecar_meta), so that its COMMIT waits for the synchronous
        standby as a write's does, bounded as a write's. (A transaction that writes nothing, or
        only takes a transaction id, commits without waiting for any standby.) While the server
        process of a probe that was not confirmed still waits for its standby, the next probes ask
        whether it does, rather than leave one more process waiting on the server."""
        try:
            with self._connection() as conn:
                self._refuse_while_waiting(conn)
                with self._begun(conn) as begun:
                    conn.execute("INSERT INTO context_sidecar_meta (name, value) VALUES ('heartbeat', '') "
                                 "ON CONFLICT (name) DO UPDATE SET value = excluded.value")
                    self._end(begun)
            return True
        except SharedStoreUnavailable:
            return False

    def _refuse_while_waiting(self, conn: Any) -> None:
        """Refused, having written nothing, while the server process of a commit of this sidecar's
        that was not confirmed still waits for a synchronous standby (one query, only after such
        a commit; the processes that stopped waiting are forgotten). PostgreSQL's view: an engine
        without it has no such wait to look at."""
        if not self._waiting:
            return
        with self._waiting_lock:
            asked = list(self._waiting)
        try:
            waiting = {pid for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s) AND wait_event = 'SyncRep'", (asked,))}
        except self._psycopg.ProgrammingError:
            waiting = set()
        with self._waiting_lock:
            self._waiting -= set(asked) - waiting
        if waiting:
            self.reachable = False
            raise SharedStoreUnavailable(
                "the shared store has not confirmed an earlier commit of this sidecar's: its primary waits for a "
                "synchronous standby that is gone. Nothing of this call was written: call again once the standby is "
                "back")

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
        with self._connection() as conn, self._begun(conn) as holding:
            try:
                # In one order on every sidecar (a commit's updates too), so two never wait on each other.
                conn.execute("SELECT version FROM context_sidecar_units WHERE unit = ANY(%s) ORDER BY unit FOR UPDATE",
                             (sorted(units),))
                yield holding
            except self._psycopg.errors.TransactionRollback:  # a deadlock or serialization failure
                raise VersionConflict(list(units)) from None

    @contextmanager
    def _begun(self, conn: Any) -> Iterator[Holding]:
        """A transaction on ``conn`` (autocommit: BEGIN and COMMIT are sent as statements, so that
        the COMMIT's wait can be bounded, :meth:`_end`), rolled back unless it was ended."""
        conn.execute("BEGIN")
        holding = Holding(conn)
        try:
            yield holding
        finally:
            if not holding.ended and not conn.closed:
                conn.execute("ROLLBACK")

    def _end(self, holding: Holding) -> None:
        """COMMIT, waiting ``shared_timeout`` at most for the server to confirm it; past that, or if
        the server says it stopped waiting for its synchronous standby (a cancelled wait: committed
        locally, maybe not replicated), the write may or may not have landed: refused."""
        conn, errors = holding.conn, self._psycopg
        server_process = conn.info.backend_pid
        not_replicated: list[str] = []

        def note_cancelled_wait(diagnostic: Any) -> None:
            if (diagnostic.message_primary or "").startswith("canceling wait for synchronous replication"):
                not_replicated.append(diagnostic.message_primary)

        conn.add_notice_handler(note_cancelled_wait)
        try:
            with self._watchdog.bounding(conn, self._timeout) as wait:
                try:
                    conn.execute("COMMIT")
                except (errors.OperationalError, errors.InterfaceError):
                    if wait.expired:
                        self.reachable = False
                        with self._waiting_lock:
                            self._waiting.add(server_process)
                        raise _unconfirmed(f"within [storage] shared_timeout ({self._timeout:g} s)") from None
                    raise
        finally:
            conn.remove_notice_handler(note_cancelled_wait)
        holding.ended = True
        if wait.expired:  # confirmed just as its socket was shut: the connection is not to be used again
            conn.close()
        if not_replicated:
            raise _unconfirmed(f"to its synchronous standby ({not_replicated[0]})")

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
        if holding is None:
            with self._connection() as conn:
                self._refuse_while_waiting(conn)
                with self._begun(conn) as begun:
                    return self._write(begun, versions, held, rows)
        self._refuse_while_waiting(holding.conn)
        return self._write(holding, versions, held, rows)

    def _write(self, holding: Holding, versions: dict[bytes, int], held: dict[bytes, int],
               rows: list[tuple[bytes, str, bytes, bytes | None, int]]) -> dict[bytes, int]:
        conn = holding.conn
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
        self._end(holding)
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
