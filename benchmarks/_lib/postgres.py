"""A real PostgreSQL server for the shared store's tests and benchmarks: a server of Debian's
``postgresql`` package started in a temporary folder (``.ci/run`` installs the package)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


class Postgres:
    """A PostgreSQL server from Debian's ``postgresql`` package (``.ci/run`` installs it) in a
    folder of its own, on a free loopback port, started now and stopped by :meth:`close`. As root
    it runs as the package's ``postgres`` user: the server refuses to run as root. It keeps its
    durability defaults (fsync on, synchronous commit), as a production database would."""

    def __init__(self) -> None:
        versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                          key=lambda path: int(path.parent.parent.name))
        if not versions:
            raise AssertionError("PostgreSQL is not installed: apt-get install postgresql (.ci/run does)")
        self._bin = versions[-1].parent
        self.folder = Path(tempfile.mkdtemp(prefix="sidecar-pg-"))
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user:
            shutil.chown(self.folder, self._user)
        with socket_on_free_port() as port:
            self.port = port
        self._pg("initdb", "-D", str(self.folder / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                 "--no-sync")
        self.start()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._databases = 0

    def _pg(self, program: str, *args: str) -> None:
        # As the postgres user through runuser, not subprocess's user=: changing user makes Python
        # fork() rather than vfork(), and a fork of a process with gRPC's threads running can crash
        # the child before its exec (pg_ctl "died with SIGSEGV" in CI, mid-test).
        become = ["runuser", "-u", self._user, "--"] if self._user else []
        subprocess.run([*become, str(self._bin / program), *args], check=True, capture_output=True,
                       cwd=self.folder, timeout=120)

    def start(self) -> None:
        self._pg("pg_ctl", "start", "-w", "-D", str(self.folder / "data"), "-l", str(self.folder / "log"),
                 "-o", f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1")

    def stop(self) -> None:
        self._pg("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.folder / "data"))

    def database(self) -> str:
        """The URL of a new, empty database on this server."""
        import psycopg  # only here: importing the tests' helpers does not need it

        self._databases += 1
        name = f"t{self._databases}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.folder, ignore_errors=True)


class socket_on_free_port:
    """A loopback port no one listens on now (bound, then released at the end of the block)."""

    def __enter__(self) -> int:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        return int(self._socket.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._socket.close()
