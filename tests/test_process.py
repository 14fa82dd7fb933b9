"""The sidecar as a real process: the command line, startup refusals, SIGTERM, and kill -9."""

from __future__ import annotations

import contextlib
import grp
import gzip
import importlib.metadata
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from grpc_health.v1 import health_pb2

from sidecar.text.encodings import bundled_dir
from tests.helpers import READY, ROOT, Sidecar, run_cli


def test_help_explains_every_flag(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "serve", "--help")
    assert result.returncode == 0
    for flag in ("--listen", "--storage-path", "--map-size", "--sync", "--token-counter",
                 "--transcript-token-budget", "--keep-last-turns", "--transcript-window", "--config"):
        assert flag in result.stdout
    assert "CONTEXT_SIDECAR_STORAGE_PATH" in result.stdout


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "context-sidecar"
    assert subprocess.run([str(script), "--help"], capture_output=True, timeout=60).returncode == 0


def test_version_is_the_installed_distributions(tmp_path: Path) -> None:
    expected = f"context-sidecar {importlib.metadata.version('context-sidecar')}\n"
    script = Path(sys.executable).parent / "context-sidecar"
    for command in ([str(script), "--version"], [sys.executable, "-m", "sidecar", "--version"]):
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stdout, result.stderr) == (0, expected, "")
    listed = run_cli(tmp_path, "--help")
    assert listed.returncode == 0 and "--version" in listed.stdout


@pytest.mark.parametrize("args, message", [
    (["--transcript-token-budget", "0"], "[context] transcript_token_budget (from command line): must be at least 1"),
    (["--listen", "0.0.0.0:0"], "[server] listen: '0.0.0.0:0' is not a loopback address"),
    (["--token-counter", "bpe"], "[context] token_counter"),
])
def test_bad_configuration_stops_with_the_key_named(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"), *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_proto_prints_the_shipped_contract_and_writes_it_out(tmp_path: Path) -> None:
    printed = run_cli(tmp_path, "proto")
    assert printed.returncode == 0, printed.stderr
    written = run_cli(tmp_path, "proto", "--write", str(tmp_path / "contract"))
    assert written.returncode == 0, written.stderr
    sources = {"contextsidecar/v1/sidecar.proto": ROOT / "proto",
               "google/rpc/error_details.proto": ROOT / "third_party", "google/rpc/status.proto": ROOT / "third_party"}
    assert written.stdout.splitlines() == [str(tmp_path / "contract" / name) for name in sources]
    for number, include in enumerate((Path(printed.stdout.strip()), tmp_path / "contract")):
        assert {name: (include / name).read_bytes() for name in sources} == {
            name: (root / name).read_bytes() for name, root in sources.items()}
        # An include root a code generator takes as it is (Python's here: grpc_tools is at hand).
        out = tmp_path / f"generated{number}"
        out.mkdir()
        result = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{include}", f"--python_out={out}",
                                 *sources], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert (out / "contextsidecar" / "v1" / "sidecar_pb2.py").is_file()


def test_a_missing_compiled_extension_stops_the_sidecar(tmp_path: Path) -> None:
    # As if fastcore/_fastcore*.so were absent: importing it fails, and no Python fallback runs.
    program = ("import sys; sys.modules['fastcore._fastcore'] = None; from sidecar.cli import main; "
               f"sys.exit(main(['serve', '--storage-path', {str(tmp_path / 'd')!r}, '--listen', '127.0.0.1:0']))")
    result = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    assert "fastcore's compiled extension is not built" in result.stderr
    assert READY not in result.stdout


def test_a_tampered_encoding_file_stops_the_sidecar(tmp_path: Path) -> None:
    encodings = tmp_path / "encodings"
    encodings.mkdir()
    shutil.copy(bundled_dir() / "cl100k_base.tiktoken.gz", encodings)
    original = gzip.decompress((bundled_dir() / "o200k_base.tiktoken.gz").read_bytes())
    (encodings / "o200k_base.tiktoken.gz").write_bytes(gzip.compress(original[:-200]))
    result = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
                     "--encodings-dir", str(encodings))
    assert result.returncode == 3
    assert "o200k_base encoding file" in result.stderr and "tiktoken expects" in result.stderr


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"), "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 3
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_serves_on_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.sock"
    sidecar = Sidecar(tmp_path, "--listen", f"unix://{path}")
    try:
        assert sidecar.address == f"unix://{path}"
        assert sidecar.health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
        opened = sidecar.stub.OpenRun(pb.OpenRunRequest(run_id="r"))
        assert opened.settings.token_counter == "o200k_base"
    finally:
        code, _ = sidecar.stop()
    assert code == 0


def _cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_sigterm_drains_in_flight_calls_and_exits_zero(tmp_path: Path) -> None:
    # The slow call below carries 24 MB, over the default [context] max_request_bytes (8 MiB).
    sidecar = Sidecar(tmp_path, "--grace-seconds", "30", "--max-request-bytes", "32MiB")
    statuses: list[int] = []
    watching = threading.Event()
    watch = sidecar.health.Watch(health_pb2.HealthCheckRequest(service="contextsidecar.v1.ContextSidecar"))

    def follow_health() -> None:
        try:
            for answer in watch:
                statuses.append(answer.status)
                watching.set()
        except grpc.RpcError:
            pass  # the stream ends when the server stops

    watcher = threading.Thread(target=follow_health, daemon=True)
    watcher.start()
    assert watching.wait(10), "the health Watch stream never answered"
    # A call that takes a while: counting ~24 MB of text in o200k_base.
    texts = ["Some prose, some code(), some JSON {\"k\": [1, 2, 3]}.\n" * 20000] * 24
    outcome: dict[str, object] = {}

    def slow_call() -> None:
        try:
            outcome["answer"] = sidecar.stub.CountTokens(pb.CountTokensRequest(token_counter="o200k_base", texts=texts))
            outcome["finished"] = time.monotonic()
        except grpc.RpcError as error:
            outcome["error"] = error

    caller = threading.Thread(target=slow_call)
    before = _cpu_seconds(sidecar.process.pid)
    caller.start()
    # The call is being served once the server has spent CPU on it: receiving and parsing 24 MB
    # costs it a small part of a second, counting them about two. A fixed sleep raced the upload
    # on a loaded machine, and SIGTERM then cancelled a call that had not yet arrived.
    waited = time.monotonic()
    while _cpu_seconds(sidecar.process.pid) - before < 0.5:
        assert time.monotonic() - waited < 60, "the server never started on the call"
        time.sleep(0.02)
    signalled = time.monotonic()
    code, stderr = sidecar.stop(signal.SIGTERM)
    caller.join(timeout=30)
    watcher.join(timeout=5)
    assert code == 0, stderr
    assert "error" not in outcome, outcome.get("error")
    assert len(outcome["answer"].counts) == 24
    assert outcome["finished"] > signalled, "the call must still have been running at SIGTERM"
    assert statuses[0] == health_pb2.HealthCheckResponse.SERVING
    assert health_pb2.HealthCheckResponse.NOT_SERVING in statuses, statuses
    assert "received SIGTERM: draining" in stderr


@pytest.mark.parametrize("stop", range(3))
def test_sigterm_ends_open_event_watches_with_ok(tmp_path: Path, stop: int) -> None:
    """Every open watch ends with OK. A stop used to cut in between a watch's last message and its
    status (RST_STREAM on the client), seen on a loaded machine; four watches, stopped three
    times, make that window likelier to be hit."""
    sidecar = Sidecar(tmp_path, "--compaction-enabled", "--drain-seconds", "30")
    watches = [sidecar.stub.WatchEvents(pb.WatchEventsRequest()) for _ in range(4)]  # all the default serves
    for watch in watches:
        watch.initial_metadata()  # registered
    started = time.monotonic()
    code, stderr = sidecar.stop(signal.SIGTERM)
    for watch in watches:
        assert list(watch) == []  # ends without an RpcError: the status is OK, not CANCELLED or INTERNAL
        assert watch.code() == grpc.StatusCode.OK
    assert code == 0, stderr
    assert time.monotonic() - started < 10, "an open watch does not hold the stop for the drain"


def test_acknowledged_writes_survive_kill_9(tmp_path: Path) -> None:
    """A writer appends batches as fast as it can; kill -9 lands mid-stream. After a restart every
    acknowledged batch is there, whole, and no batch is there in part."""
    sidecar = Sidecar(tmp_path)
    acknowledged: list[int] = []
    stop = threading.Event()

    def writer() -> None:
        batch = 0
        while not stop.is_set():
            events = [pb.Event(event_id=f"b{batch}-{i}", iteration=batch + 1, role="user",
                               content=f"batch {batch} #{i}") for i in range(5)]
            try:
                sidecar.stub.AppendEvents(pb.AppendEventsRequest(run_id="run", events=events), timeout=5)
            except grpc.RpcError:
                return
            acknowledged.append(batch)
            batch += 1

    thread = threading.Thread(target=writer)
    thread.start()
    while len(acknowledged) < 30:
        time.sleep(0.01)
    sidecar.process.kill()  # SIGKILL: no cleanup of any kind
    sidecar.process.wait(timeout=10)
    stop.set()
    thread.join(timeout=10)
    sidecar.channel.close()

    restarted = Sidecar(tmp_path)
    try:
        stored, from_seq = [], 0
        while True:
            page = restarted.stub.ListRunEvents(pb.ListRunEventsRequest(run_id="run", from_seq=from_seq, limit=1000))
            stored += [e.event_id for e in page.events]
            if not page.HasField("next_from_seq"):
                break
            from_seq = page.next_from_seq
    finally:
        code, _ = restarted.stop()
    assert code == 0
    batches: dict[int, int] = {}
    for event_id in stored:
        batch = int(event_id[1:].split("-")[0])
        batches[batch] = batches.get(batch, 0) + 1
    assert set(acknowledged) <= set(batches), "an acknowledged batch was lost"
    assert all(count == 5 for count in batches.values()), "a batch was half-written"
    assert sorted(batches) == list(range(len(batches))), "batches land in order, without gaps"


def test_compactions_are_all_or_nothing_across_kill_9(tmp_path: Path) -> None:
    """Puts and compactions (the background job's and requested ones) run until SIGKILL lands at
    a random moment; after a restart every compaction is whole or absent and every
    acknowledged put is either there or accounted for by a compaction that took it."""
    import json
    import random

    flags = ["--compaction-enabled", "--compaction-interval-seconds", "0.05", "--compaction-min-entries", "6",
             "--compaction-keep-recent", "2", "--compaction-max-input-entries", "20"]
    sidecar = Sidecar(tmp_path, *flags)
    acknowledged: list[str] = []
    stop = threading.Event()

    def put_forever() -> None:
        i = 0
        while not stop.is_set():
            try:
                sidecar.stub.PutMemory(pb.PutMemoryRequest(memory_ref="mem:crash", entry_id=f"p{i}",
                                                           content=f"Note {i}: the customer asked about order {i}."),
                                       timeout=5)
            except grpc.RpcError:
                return
            acknowledged.append(f"p{i}")
            i += 1

    def compact_forever() -> None:
        while not stop.is_set():
            try:
                sidecar.stub.CompactMemory(pb.CompactMemoryRequest(memory_ref="mem:crash"), timeout=5)
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.UNAVAILABLE:
                    return
            time.sleep(0.01)

    threads = [threading.Thread(target=put_forever), threading.Thread(target=compact_forever)]
    for thread in threads:
        thread.start()
    while len(acknowledged) < 40:
        time.sleep(0.01)
    time.sleep(random.uniform(0.05, 0.6))
    sidecar.process.kill()
    sidecar.process.wait(timeout=10)
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    sidecar.channel.close()

    restarted = Sidecar(tmp_path)  # compaction off: the store stays as the crash left it
    try:
        stub = restarted.stub
        events = [json.loads(e.json) for e in stub.ListMemoryEvents(
            pb.ListMemoryEventsRequest(memory_ref="mem:crash", limit=1000)).events]
        live = {e.id: e for e in stub.ListMemory(pb.ListMemoryRequest(memory_ref="mem:crash")).entries}
    finally:
        code, _ = restarted.stop()
    assert code == 0
    assert events, "compactions ran before the kill"
    compacted = {source for event in events for source in event["sourceIds"]}
    for position, event in enumerate(events):
        assert not set(event["sourceIds"]) & set(live), "a compaction left a source behind"
        later_sources = {s for later in events[position + 1:] for s in later["sourceIds"]}
        assert event["outputId"] in live or event["outputId"] in later_sources, "a compaction lost its output"
    known = {event["compactionId"] for event in events}
    for entry in live.values():
        for tag in entry.tags:
            if tag.startswith("compacted-from:"):
                assert tag.split(":", 1)[1] in known, "an output without its event"
    lost = [put for put in acknowledged if put not in live and put not in compacted]
    assert not lost, f"acknowledged puts lost: {lost[:5]}"


@pytest.mark.parametrize("attempt", range(3))
def test_sigterm_exits_once_the_drain_is_over(tmp_path: Path, attempt: int) -> None:
    """A call still running when the drain ends is cancelled and the process exits at once:
    `stopped` is the last line it logs, and nothing holds it afterwards (it used to wait for the
    call's thread, and to miss a SIGTERM that reached another thread than the main one). Three
    attempts, as that second defect showed now and then."""
    drain = 1.0
    # DEBUG: each call's line once it ends, so a call that outlives `stopped` shows in the log.
    sidecar = Sidecar(tmp_path, "--drain-seconds", str(drain), "--max-request-bytes", "48MiB",
                      "--log-level", "DEBUG")
    watch = sidecar.health.Watch(health_pb2.HealthCheckRequest())
    statuses = [next(watch).status]
    texts = ["Some prose, some code(), some JSON {\"k\": [1, 2, 3]}.\n" * 20000] * 40  # ~40 MB: seconds of counting
    outcome: dict[str, object] = {}

    def slow_call() -> None:
        try:
            outcome["answer"] = sidecar.stub.CountTokens(pb.CountTokensRequest(token_counter="o200k_base", texts=texts))
        except grpc.RpcError as error:
            outcome["error"] = error.code()

    caller = threading.Thread(target=slow_call, daemon=True)
    before = _cpu_seconds(sidecar.process.pid)
    caller.start()
    waited = time.monotonic()
    while _cpu_seconds(sidecar.process.pid) - before < 0.5:  # being served (see the test above)
        assert time.monotonic() - waited < 60, "the server never started on the call"
        time.sleep(0.02)
    signalled = time.monotonic()
    sidecar.process.send_signal(signal.SIGTERM)
    try:
        sidecar.process.wait(timeout=drain + 30)  # a hang detector: the bound is generous
    finally:
        if sidecar.process.poll() is None:
            sidecar.process.kill()
        sidecar.process.wait()
    exited = time.monotonic() - signalled
    caller.join(timeout=10)
    statuses += [answer.status for answer in _rest_of(watch)]
    sidecar.channel.close()
    assert sidecar.process.returncode == 0, sidecar.log()
    assert exited < drain + 30, f"exit took {exited:.1f} s after SIGTERM"
    assert statuses[0] == health_pb2.HealthCheckResponse.SERVING
    assert health_pb2.HealthCheckResponse.NOT_SERVING in statuses, statuses
    # Past the drain the call is cancelled; on a fast machine it may have finished within it.
    assert outcome.get("error") in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE) or (
        len(outcome["answer"].counts) == 40), outcome
    lines = sidecar.log().splitlines()
    assert "received SIGTERM: draining" in sidecar.log()
    assert lines[-1].endswith("sidecar.wire.server: stopped"), lines[-3:]


def _rest_of(watch) -> list:
    """The answers a health Watch stream still had, until the server ended it."""
    answers = []
    try:
        answers.extend(watch)
    except grpc.RpcError:
        pass  # the server's stop ends the stream
    return answers


def _a_group_not_the_sockets_default() -> grp.struct_group:
    """A group this process may give a file it owns, other than the one the file gets anyway."""
    others = [gid for gid in os.getgroups() if gid != os.getegid()]
    if os.geteuid() == 0:  # root gives any group
        others += [group.gr_gid for group in grp.getgrall() if group.gr_gid != os.getegid()]
    for gid in others:
        with contextlib.suppress(KeyError):
            return grp.getgrgid(gid)
    pytest.skip("no group other than the primary one to give the socket")


@pytest.mark.parametrize("by", ["name", "id"])
def test_a_unix_sockets_mode_and_group_are_set_before_it_serves(tmp_path: Path, by: str) -> None:
    group = _a_group_not_the_sockets_default()
    path = tmp_path / "sidecar.sock"
    named = group.gr_name if by == "name" else str(group.gr_gid)
    sidecar = Sidecar(tmp_path, "--listen", f"unix://{path}", "--unix-socket-mode", "0660",
                      "--unix-socket-group", named)
    try:
        status = path.stat()  # as soon as it says it serves
        assert (stat.S_IMODE(status.st_mode), status.st_gid) == (0o660, group.gr_gid)
        assert sidecar.health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    finally:
        code, _ = sidecar.stop()
    assert code == 0


def test_a_unix_sockets_mode_and_group_are_left_alone_by_default(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.sock"
    sidecar = Sidecar(tmp_path, "--listen", f"unix://{path}")
    umask = os.umask(0)
    os.umask(umask)
    try:
        status = path.stat()
        assert (stat.S_IMODE(status.st_mode), status.st_gid) == (0o777 & ~umask, os.getegid())
    finally:
        code, _ = sidecar.stop()
    assert code == 0


@pytest.mark.parametrize("flags, message", [
    (["--unix-socket-mode", "0968"], "[server] unix_socket_mode (from command line): expected an octal mode"),
    (["--unix-socket-mode", "rw-rw----"], "[server] unix_socket_mode (from command line): expected an octal mode"),
    (["--unix-socket-mode", "17777"], "[server] unix_socket_mode (from command line): expected an octal mode"),
    (["--unix-socket-group", "no-such-group-27"], "[server] unix_socket_group (from command line): no group"),
    (["--unix-socket-group", "-5"], "[server] unix_socket_group (from command line): no group"),
])
def test_a_bad_unix_socket_mode_or_group_is_refused(tmp_path: Path, flags: list[str], message: str) -> None:
    result = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"),
                     "--listen", f"unix://{tmp_path / 'sidecar.sock'}", *flags)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "sidecar.sock").exists()


def test_a_unix_socket_mode_is_refused_for_a_tcp_listen(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
                     "--unix-socket-mode", "0660")
    assert result.returncode == 2
    assert "[server] unix_socket_mode: applies to a unix:// listen only" in result.stderr
