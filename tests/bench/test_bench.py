"""``context-sidecar bench`` through the real command line against real sidecar processes: its
table, its JSON (every sample, every answer within its budget, recounted), its plot, a Unix
socket, a tenant's token, and what it says when there is nothing to measure."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from context_sidecar_client import Client, SidecarCallError

from tests.helpers import Sidecar, run_cli

ROWS = re.compile(r"^(Health/Check|AssembleContext)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x",
                  re.MULTILINE)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    process = Sidecar(tmp_path_factory.mktemp("sidecar"))
    yield process
    process.stop()


def bench(tmp_path: Path, target: str, *args: str, env: dict[str, str] | None = None):
    return run_cli(tmp_path, "bench", "--target", target, *args, env=env)


def rows(stdout: str) -> dict[str, tuple[int, float, float, float, float]]:
    """RPC -> (count, p50, p90, p99 ms, p50 over the health p50), as the table prints them."""
    return {m[1]: (int(m[2]), float(m[3]), float(m[4]), float(m[5]), float(m[6])) for m in ROWS.finditer(stdout)}


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def test_the_table_the_json_and_the_plot(sidecar: Sidecar, tmp_path: Path) -> None:
    result = bench(tmp_path, sidecar.address, "--turns", "12", "--runs", "3", "--concurrency", "2", "--warmup", "3",
                   "--budget", "3000", "--result-tokens", "lognormal:400", "--json", "out.json", "--plot", "out.png",
                   "--keep-runs")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    table = rows(result.stdout)
    assert set(table) == {"Health/Check", "AssembleContext"}, result.stdout
    assert table["Health/Check"][0] == table["AssembleContext"][0] == 12 * 3  # warm-up turns not counted
    for _, p50, p90, p99, _ in table.values():
        assert 0 < p50 <= p90 <= p99
    assert table["Health/Check"][4] == 1.0 and "1.00x, the floor" in result.stdout
    health, assemble = table["Health/Check"], table["AssembleContext"]
    assert assemble[4] == pytest.approx(assemble[1] / health[1], abs=0.01)
    assert "every one within its budget" in result.stdout

    document = json.loads((tmp_path / "out.json").read_text())
    assert document["settings"] | {"target": None} == {
        "target": None, "tenant_token": False, "turns": 12, "runs": 3, "concurrency": 2, "warmup": 3, "budget": 3000,
        "counter": "o200k_base", "render": "none", "result_tokens": "lognormal:400", "seed": 1, "timeout": 30.0,
        "keep_runs": True}
    for rpc in ("Health/Check", "AssembleContext"):
        samples = document["samples"][rpc]
        assert len(samples) == document["summary"][rpc]["count"] == 12 * 3
        assert sorted((s["run"], s["turn"]) for s in samples) == [(r, t) for r in range(3) for t in range(12)]
        assert all(s["ms"] > 0 for s in samples)
    turns = document["turns"]
    assert len(turns) == 36 and len(document["run_ids"]) == 3
    assert all(turn["token_count"] <= turn["token_budget"] == 3000 for turn in turns)
    assert max(turn["token_count"] for turn in turns) > 2000  # the budget was what held the windows
    assert 250 < sorted(turn["result_tokens"] for turn in turns)[18] < 650  # lognormal:400, fenced

    # A few answers recounted, apart from the bench: the window as persisted, each entry through CountTokens.
    with Client(sidecar.address) as client:
        for turn in turns[::7]:
            window = client.get_transcript_window(run_id=turn["run_id"], iteration=turn["iteration"])
            counts = client.count_tokens(token_counter="o200k_base", texts=[e.rendered for e in window.entries]).counts
            assert list(counts) == [e.tokens for e in window.entries]
            assert sum(counts) == window.token_count == turn["token_count"] <= 3000
            assert len(window.entries) == turn["entries"]

    assert png_size(tmp_path / "out.png") == (1200, 460)
    assert (tmp_path / "out.png").stat().st_size > 20_000  # lines and text, not an empty canvas


def test_the_runs_are_deleted_afterwards_unless_kept(sidecar: Sidecar, tmp_path: Path) -> None:
    result = bench(tmp_path, sidecar.address, "--turns", "3", "--warmup", "2", "--json", "out.json")
    assert result.returncode == 0, result.stderr
    run_ids = json.loads((tmp_path / "out.json").read_text())["run_ids"]
    assert len(run_ids) == 1
    with Client(sidecar.address) as client:
        with pytest.raises(SidecarCallError) as refused:
            client.list_run_events(run_id=run_ids[0])
        assert refused.value.code.name == "NOT_FOUND"


def test_renderings_and_fixed_sizes(sidecar: Sidecar, tmp_path: Path) -> None:
    for render in ("none", "openai_responses", "anthropic_messages"):
        result = bench(tmp_path, sidecar.address, "--turns", "4", "--warmup", "0", "--render", render,
                       "--result-tokens", "fixed:500", "--json", f"{render}.json")
        assert result.returncode == 0, result.stderr
        assert f"render {render}" in result.stdout
        turns = json.loads((tmp_path / f"{render}.json").read_text())["turns"]
        assert all(300 < turn["result_tokens"] < 850 for turn in turns)  # 500, give or take a JSON record
        assert all(turn["response_bytes"] > 2000 for turn in turns)
        # A rendered answer carries the window in its body, not in entries.
        assert all((turn["entries"] == 0) == (render != "none") for turn in turns)


def test_a_unix_socket_target(tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))  # a socket path must stay under 108 bytes
    process = Sidecar(tmp_path, "--listen", f"unix://{folder}/s.sock")
    try:
        assert process.address == f"unix://{folder}/s.sock"
        result = bench(tmp_path, process.address, "--turns", "5", "--warmup", "1")
        assert result.returncode == 0, result.stderr
        assert rows(result.stdout)["AssembleContext"][0] == 5
        assert f"context-sidecar bench: unix://{folder}/s.sock, 1 run x 5 turns" in result.stdout
    finally:
        process.stop()


def test_a_tenants_sidecar_needs_the_token_and_the_token_is_never_shown(tmp_path: Path) -> None:
    token = "bench-token-e3b0c44298fc1c149afb"
    config = tmp_path / "sidecar.toml"
    config.write_text(f'[[auth.tenants]]\nid = "acme"\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n')
    process = Sidecar(tmp_path, "--config", str(config))
    try:
        refused = bench(tmp_path, process.address, "--turns", "2", "--warmup", "0")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "UNAUTHENTICATED" in refused.stderr and "needs --token" in refused.stderr
        assert "Traceback" not in refused.stderr
        result = bench(tmp_path, process.address, "--turns", "2", "--warmup", "1", "--token", token,
                       "--json", "out.json", "--progress", "on")
        assert result.returncode == 0, result.stderr
        written = (tmp_path / "out.json").read_text()
        assert json.loads(written)["settings"]["tenant_token"] is True
        assert token not in written + result.stdout + result.stderr
    finally:
        process.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("target", ["127.0.0.1:{port}", "unix:///tmp/no-such-folder/sidecar.sock",
                                    "no-such-host.invalid:50051"])
def test_no_sidecar_at_the_target_is_said_so_with_exit_code_1(tmp_path: Path, target: str) -> None:
    target = target.format(port=free_port())
    result = bench(tmp_path, target, "--turns", "2", "--json", "out.json", "--timeout", "10")
    assert result.returncode == 1, result.stdout + result.stderr
    said = f"context-sidecar bench: no sidecar answers at {target}: UNAVAILABLE"
    assert result.stderr.startswith(said), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "out.json").exists()


def test_failed_calls_are_counted_and_make_exit_code_1(sidecar: Sidecar, tmp_path: Path) -> None:
    # A 20-token budget cannot hold a 3,000-token tool result even clipped: every turn is refused.
    result = bench(tmp_path, sidecar.address, "--turns", "3", "--runs", "2", "--warmup", "0", "--budget", "20",
                   "--result-tokens", "fixed:3000", "--json", "out.json")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(r"^AssembleContext\s+0\s+-\s+-\s+-\s+2  -$", result.stdout, re.MULTILINE), result.stdout
    assert "AssembleContext FAILED_PRECONDITION x2" in result.stdout and "token_budget_exceeded" in result.stdout
    document = json.loads((tmp_path / "out.json").read_text())
    assert [(f["rpc"], f["run"], f["turn"], f["code"]) for f in sorted(document["failures"], key=lambda f: f["run"])] \
        == [("AssembleContext", 0, 0, "FAILED_PRECONDITION"), ("AssembleContext", 1, 0, "FAILED_PRECONDITION")]


@pytest.mark.parametrize("args, said", [
    (["--result-tokens", "normal:300"], "argument --result-tokens: 'normal:300' is not a size distribution; one of"),
    (["--turns", "0"], "argument --turns: 0 is not a positive number"),
    (["--render", "gemini"], "argument --render: invalid choice"),
    (["--plot", "no-such-folder/out.png"], "--plot no-such-folder/out.png: the folder"),
])
def test_bad_arguments_are_said_so_with_exit_code_2(tmp_path: Path, args: list[str], said: str) -> None:
    result = bench(tmp_path, "127.0.0.1:1", *args)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_plot_without_matplotlib_names_the_extra_before_measuring(tmp_path: Path) -> None:
    # A matplotlib that cannot be imported, ahead of the real one on the path.
    (tmp_path / "shadow" / "matplotlib").mkdir(parents=True)
    (tmp_path / "shadow" / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    root = Path(__file__).resolve().parents[2]
    result = bench(tmp_path, "127.0.0.1:1", "--plot", "out.png",
                   env={"PYTHONPATH": f"{tmp_path / 'shadow'}:{root}"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--plot needs matplotlib" in result.stderr and "pip install 'context-sidecar[plot]'" in result.stderr
    assert "no sidecar answers" not in result.stderr  # said before any call


def test_the_progress_bar_and_the_help(sidecar: Sidecar, tmp_path: Path) -> None:
    result = bench(tmp_path, sidecar.address, "--turns", "6", "--warmup", "2", "--progress", "on")
    assert result.returncode == 0, result.stderr
    assert re.search(r"warm-up \[#{30}\] 2/2 turns 100%", result.stderr), result.stderr
    assert re.search(r"turns   \[#{30}\] 6/6 turns 100%", result.stderr), result.stderr
    quiet = bench(tmp_path, sidecar.address, "--turns", "2", "--warmup", "0")  # stderr is no terminal here
    assert quiet.returncode == 0 and quiet.stderr == ""
    listed = run_cli(tmp_path, "--help")
    assert listed.returncode == 0 and "bench" in listed.stdout
    helped = run_cli(tmp_path, "bench", "--help")
    assert helped.returncode == 0 and "lognormal:M[:S]" in helped.stdout and "Exit codes" in helped.stdout


def test_an_interrupted_bench_reports_what_it_measured_and_cleans_up(sidecar: Sidecar, tmp_path: Path) -> None:
    arguments = ["bench", "--target", sidecar.address, "--turns", "100000", "--warmup", "1", "--json", "out.json",
                 "--progress", "on"]
    # Ctrl-C as a terminal sends it, whatever the disposition this process was started with (a
    # shell's background job ignores SIGINT, and Python then leaves it ignored): the child restores
    # Python's own handler itself. (A preexec_fn would run after fork in a process with grpc's
    # threads, which grpc's fork handlers may abort.)
    restore = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               f"sys.argv = ['sidecar', *{arguments!r}]; runpy.run_module('sidecar', run_name='__main__')")
    process = subprocess.Popen([sys.executable, "-c", restore], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    seen, deadline = "", time.monotonic() + 60
    while "turns   [" not in seen:  # the measured turns' progress bar: past the warm-up
        assert time.monotonic() < deadline and process.poll() is None, seen
        seen += os.read(process.stderr.fileno(), 4096).decode(errors="replace")
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr and "INTERRUPTED: what was measured until then" in stdout
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["interrupted"] is True and document["seconds"] > 0
    assert 0 < document["summary"]["AssembleContext"]["count"] < 100000
    with Client(sidecar.address) as client:
        with pytest.raises(SidecarCallError) as refused:
            client.list_run_events(run_id=document["run_ids"][0])
        assert refused.value.code.name == "NOT_FOUND"
