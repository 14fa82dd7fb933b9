"""A real PostgreSQL server for the shared store's tests and benchmarks: a server of Debian's
``postgresql`` package started in a temporary folder (``.ci/run`` installs the package).

Also the deployment PostgreSQL users run for availability: a primary that streams to a
synchronous standby (``Postgres(replication_slot=...)`` and :meth:`Postgres.standby_of`), and what
a failover does to it: ``kill_9`` of a postmaster, ``promote``, ``start`` again."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class Postgres:
    """A PostgreSQL server from Debian's ``postgresql`` package (``.ci/run`` installs it) in a
    folder of its own, on a free loopback port, started now and stopped by :meth:`close`. As root
    it runs as the package's ``postgres`` user: the server refuses to run as root. It keeps its
    durability defaults (fsync on, synchronous commit), as a production database would.

    ``replication_slot``: a primary for one synchronous streaming standby, which
    :meth:`standby_of` makes: WAL for replicas, a physical slot of that name (the standby's, so
    the primary keeps the WAL it has not received), ``synchronous_standby_names`` naming it and
    ``synchronous_commit = on``, so that a commit is acknowledged only once the standby has it."""

    def __init__(self, replication_slot: str = "", *, _data_from: Postgres | None = None) -> None:
        versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                          key=lambda path: int(path.parent.parent.name))
        if not versions:
            raise AssertionError("PostgreSQL is not installed: apt-get install postgresql (.ci/run does)")
        self._bin = versions[-1].parent
        self.folder = Path(tempfile.mkdtemp(prefix="sidecar-pg-"))
        self.data = self.folder / "data"
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user:
            shutil.chown(self.folder, self._user)
        with socket_on_free_port() as port:
            self.port = port
        self.host = f"127.0.0.1:{self.port}"
        self._settings: dict[str, str] = {}
        self._killed: list[int] = []
        self.replication_slot = replication_slot
        if _data_from is not None:  # a standby: a base backup of the primary, which -R makes follow it
            self._settings["cluster_name"] = _data_from.replication_slot  # the name it reports to the primary
            self._pg("pg_basebackup", "-h", "127.0.0.1", "-p", str(_data_from.port), "-U", "postgres",
                     "-D", str(self.data), "-R", "-S", _data_from.replication_slot, "-X", "stream", "--no-sync")
        else:
            self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        if replication_slot:  # initdb --auth=trust lets 127.0.0.1 connect for replication too
            self._settings.update(wal_level="replica", max_wal_senders="4", max_replication_slots="4",
                                  synchronous_standby_names=f"'{replication_slot}'", synchronous_commit="on")
        self.start()
        self.url = f"postgresql://postgres@{self.host}/postgres"
        self._databases = 0
        if replication_slot:
            self.execute("postgres", f"SELECT pg_create_physical_replication_slot('{replication_slot}')")

    @classmethod
    def standby_of(cls, primary: Postgres) -> Postgres:
        """A streaming standby of ``primary`` (made with ``replication_slot``), on a port of its own:
        ``pg_basebackup -R -S slot``, started, and once it streams, the primary's synchronous standby."""
        if not primary.replication_slot:
            raise ValueError("the primary was made without a replication_slot")
        standby = cls(_data_from=primary)
        deadline = time.monotonic() + 60
        while primary.query("postgres", "SELECT sync_state FROM pg_stat_replication "
                                         f"WHERE application_name = '{primary.replication_slot}'") != [("sync",)]:
            if time.monotonic() > deadline:
                standby.close()
                raise AssertionError("the standby did not become the primary's synchronous standby")
            time.sleep(0.05)
        return standby

    def _pg(self, program: str, *args: str) -> None:
        # As the postgres user through runuser, not subprocess's user=: changing user makes Python
        # fork() rather than vfork(), and a fork of a process with gRPC's threads running can crash
        # the child before its exec (pg_ctl "died with SIGSEGV" in CI, mid-test).
        become = ["runuser", "-u", self._user, "--"] if self._user else []
        subprocess.run([*become, str(self._bin / program), *args], check=True, capture_output=True,
                       cwd=self.folder, timeout=120)

    def start(self) -> None:
        self._wait_for_killed()
        settings = "".join(f" -c {name}={value}" for name, value in self._settings.items())
        self._pg("pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.folder / "log"),
                 "-o", f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1{settings}")

    def _wait_for_killed(self) -> None:
        """Wait until the processes of a killed server are gone, not only dead: a zombie still
        counts as running for the next postmaster's check of the data folder."""
        deadline = time.monotonic() + 30
        for process in self._killed:
            while Path(f"/proc/{process}").exists():
                if time.monotonic() > deadline:
                    raise AssertionError(f"process {process} of the killed server is still there")
                time.sleep(0.01)
        self._killed = []

    def stop(self) -> None:
        self._pg("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.data))

    def kill_9(self) -> None:
        """SIGKILL to the postmaster (its pid: postmaster.pid's first line), as when its host dies:
        it stops listening at once, and its backends exit when they find it gone. :meth:`start`
        waits for them before it starts the server again."""
        pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        children = [int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat") if _parent(stat) == pid]
        os.kill(pid, signal.SIGKILL)
        self._killed = [pid, *children]

    def promote(self) -> None:
        """``pg_ctl promote``: a standby becomes a primary, on the next timeline (waits until it is)."""
        self._pg("pg_ctl", "promote", "-w", "-D", str(self.data))

    def execute(self, database: str, statement: str) -> None:
        """One statement, in autocommit, in ``database`` of this server."""
        import psycopg  # only here: importing the tests' helpers does not need it

        with psycopg.connect(f"postgresql://postgres@{self.host}/{database}", autocommit=True) as conn:
            conn.execute(statement)

    def query(self, database: str, statement: str) -> list[tuple]:
        """The rows of one query in ``database`` of this server."""
        import psycopg

        with psycopg.connect(f"postgresql://postgres@{self.host}/{database}", autocommit=True) as conn:
            return conn.execute(statement).fetchall()

    def database(self) -> str:
        """The URL of a new, empty database on this server."""
        self._databases += 1
        name = f"t{self._databases}"
        self.execute("postgres", f"CREATE DATABASE {name}")
        return f"postgresql://postgres@{self.host}/{name}"

    def close(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.folder, ignore_errors=True)


def _parent(stat: Path) -> int:
    """The parent's pid in a /proc/<pid>/stat file (0 if the process is gone)."""
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


class socket_on_free_port:
    """A loopback port no one listens on now (bound, then released at the end of the block)."""

    def __enter__(self) -> int:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        return int(self._socket.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._socket.close()
