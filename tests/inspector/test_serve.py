"""The inspector served by ``context-sidecar serve`` beside the gRPC server (``[inspector]
listen``: a loopback port or a unix socket), off by default, and ``inspect``'s flag over the setting;
each through a real sidecar process, as a user starts it."""

from __future__ import annotations

import http.client
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.helpers import Sidecar, ev, listening_ports, listening_unix_sockets, run_cli

INSPECTOR_READY = "context-sidecar inspector on "


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (as ``curl --unix-socket`` speaks it)."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self.socket_path)


def get(connection: http.client.HTTPConnection, path: str) -> tuple[int, str]:
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read().decode("utf-8")
    finally:
        connection.close()


def http_connection(url: str) -> http.client.HTTPConnection:
    """A connection to ``http://host:port`` or ``unix:PATH``, as the inspector's line names it."""
    if url.startswith("unix:"):
        return UnixHTTPConnection(url[len("unix:"):])
    host, _, port = url[len("http://"):].rpartition(":")
    return http.client.HTTPConnection(host.strip("[]"), int(port), timeout=30)


def inspector_url(sidecar: Sidecar) -> str:
    """The inspector's address from the line serve prints after its own."""
    assert sidecar.process.stdout is not None
    line = sidecar.process.stdout.readline()
    assert line.startswith(INSPECTOR_READY), f"{line!r} {sidecar.log()}"
    return line[len(INSPECTOR_READY):].strip()


def one_turn(sidecar: Sidecar, run_id: str) -> None:
    sidecar.stub.OpenRun(pb.OpenRunRequest(run_id=run_id))
    sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=1,
                                                           append_events=[ev("u1", content="hello")]))


def port_of(url: str) -> int:
    return int(url.rpartition(":")[2])


def test_serve_serves_the_inspector_on_a_loopback_port_from_the_settings(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text('[inspector]\nlisten = "127.0.0.1:0"\nturns_per_page = 1\n')
    sidecar = Sidecar(tmp_path, "--config", str(config))
    try:
        url = inspector_url(sidecar)
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        one_turn(sidecar, "served-run")
        # The same process and store: the run just driven over gRPC is listed.
        status, page = get(http_connection(url), "/")
        assert status == 200 and "served-run" in page
        one_turn(sidecar, "served-run-2")
        sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="served-run-2", iteration=2,
                                                               append_events=[ev("u2", content="again")]))
        # [inspector] turns_per_page is the timeline's page: two turns, two pages.
        assert get(http_connection(url), "/runs/served-run-2?page=2")[0] == 200
        assert get(http_connection(url), "/runs/served-run-2?page=3")[0] == 404
        # The gRPC server's port and the inspector's, no other.
        assert listening_ports(sidecar.process.pid) == {port_of(sidecar.address), port_of(url)}
        assert listening_unix_sockets(sidecar.process.pid) == set()
    finally:
        code, log = sidecar.stop()
    assert code == 0, log
    with pytest.raises(OSError):
        get(http_connection(url), "/")  # stopped with the sidecar


def test_serve_serves_the_inspector_on_an_owner_only_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "inspector.sock"
    # A stale socket file, as a killed sidecar leaves it: nothing listens on it, so it is replaced.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    assert stat.S_ISSOCK(path.lstat().st_mode)
    sidecar = Sidecar(tmp_path, env={"CONTEXT_SIDECAR_INSPECTOR_LISTEN": f"unix:{path}"})
    try:
        assert inspector_url(sidecar) == f"unix:{path}"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        one_turn(sidecar, "socket-run")
        status, page = get(UnixHTTPConnection(str(path)), "/")
        assert status == 200 and "<h1>Runs</h1>" in page and "socket-run" in page
        status, page = get(UnixHTTPConnection(str(path)), "/runs/socket-run")
        assert status == 200 and "data-iteration=1" in page
        assert listening_ports(sidecar.process.pid) == {port_of(sidecar.address)}
        assert listening_unix_sockets(sidecar.process.pid) == {str(path)}
    finally:
        code, log = sidecar.stop()
    assert code == 0, log
    assert not path.exists()  # removed on shutdown


def test_a_file_that_is_not_a_stale_socket_is_never_replaced(tmp_path: Path) -> None:
    taken = tmp_path / "taken.sock"
    taken.write_text("a user's file")
    result = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
                     "--inspector-listen", f"unix:{taken}")
    assert result.returncode == 3
    assert f"cannot serve the inspector on unix:{taken}" in result.stderr and "not a socket" in result.stderr
    assert taken.read_text() == "a user's file"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:  # a socket another process listens on
        live.bind(str(tmp_path / "live.sock"))
        live.listen()
        result = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
                         "--inspector-listen", f"unix:{tmp_path / 'live.sock'}")
    assert result.returncode == 3 and "another process listens" in result.stderr


def test_serve_serves_no_inspector_by_default(tmp_path: Path) -> None:
    sidecar = Sidecar(tmp_path)
    try:
        one_turn(sidecar, "r")
        assert listening_ports(sidecar.process.pid) == {port_of(sidecar.address)}  # the gRPC server's alone
        assert listening_unix_sockets(sidecar.process.pid) == set()
    finally:
        sidecar.process.send_signal(signal.SIGTERM)
        rest, _ = sidecar.process.communicate(timeout=30)
        sidecar.channel.close()
    assert sidecar.process.returncode == 0
    assert INSPECTOR_READY not in rest


@pytest.mark.parametrize("listen", ["0.0.0.0:7070", "192.0.2.1:7070", "[::]:7070", "example.com:7070",
                                    "127.0.0.1", "unix:", "unix://relative.sock"])
def test_an_address_beyond_loopback_or_a_socket_is_refused(tmp_path: Path, listen: str) -> None:
    for command in ("serve", "inspect"):
        result = run_cli(tmp_path, command, "--storage-path", str(tmp_path / "d"), "--inspector-listen", listen)
        assert result.returncode == 2, result.stderr
        assert "configuration error: [inspector] listen: " in result.stderr
        assert repr(listen) in result.stderr
        assert not (tmp_path / "d").exists()  # refused before the store opens


def inspect_url(tmp_path: Path, *flags: str) -> str:
    """The address ``context-sidecar inspect`` serves on with these flags (then stopped with SIGTERM)."""
    process = subprocess.Popen([sys.executable, "-m", "sidecar", "inspect", "--storage-path", str(tmp_path / "d"),
                                *flags], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith(INSPECTOR_READY), line + (process.stderr.read() if process.stderr else "")
        url = line[len(INSPECTOR_READY):].strip()
        assert get(http_connection(url), "/")[0] == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        return url
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_inspect_serves_on_the_setting_and_its_flag_overrides_it(tmp_path: Path) -> None:
    path = tmp_path / "inspect.sock"
    config = tmp_path / "sidecar.toml"
    config.write_text(f'[inspector]\nlisten = "unix:{path}"\n')
    assert inspect_url(tmp_path, "--config", str(config)) == f"unix:{path}"
    assert not path.exists()
    overridden = inspect_url(tmp_path, "--config", str(config), "--inspector-listen", "127.0.0.1:0")
    assert overridden.startswith("http://127.0.0.1:")
    assert not path.exists()  # the setting's socket was never made
