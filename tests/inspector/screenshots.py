"""The screenshots docs/inspector.md and the README show, taken again: a real sidecar on a fresh
store, one run played by ``context-sidecar bench`` (kept), ``context-sidecar inspect`` over the
same store, and Debian's Chromium through Playwright on each view, as a user sees it.

    python -m tests.inspector.screenshots [--out docs/images] [--turns 300]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.helpers import CHROMIUM

SERVING = "context-sidecar serving on "
INSPECTING = "context-sidecar inspector on "
VIEWPORT = {"width": 1600, "height": 900}


@contextmanager
def started(command: list[str], ready: str) -> Iterator[str]:
    """``command``, a server that prints ``ready`` and its address first; its address while it runs."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=os.environ)
    assert process.stdout is not None
    try:
        line = process.stdout.readline()
        if not line.startswith(ready):
            raise SystemExit(f"{' '.join(command[:4])} did not start: {line!r}")
        yield line[len(ready):].strip()
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    parser.add_argument("--turns", type=int, default=300)
    args = parser.parse_args()
    if CHROMIUM is None:
        raise SystemExit("Chromium is not installed (apt-get install --no-install-recommends chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    sidecar = [sys.executable, "-m", "sidecar"]
    with tempfile.TemporaryDirectory() as folder:
        storage = str(Path(folder) / "data")
        with started([*sidecar, "serve", "--listen", "127.0.0.1:0", "--storage-path", storage], SERVING) as address:
            subprocess.run([*sidecar, "bench", "--target", address, "--turns", str(args.turns), "--warmup", "0",
                            "--render", "anthropic_messages", "--keep-runs", "--progress", "off"],
                           check=True, stdout=subprocess.DEVNULL)
            with started([*sidecar, "inspect", "--storage-path", storage, "--inspector-listen", "127.0.0.1:0"],
                         INSPECTING) as base, sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
                page = browser.new_page(viewport=VIEWPORT)
                views = {"inspector-runs.png": "/"}
                page.goto(base + "/")
                run = page.locator("#runs td.run-id a").first.get_attribute("href")
                views["inspector-run.png"] = f"{run}?page=2"
                # The turn shown: the first on that page whose request broke the provider's cache.
                page.goto(base + views["inspector-run.png"])
                broke = page.locator("#turns tr.turn", has=page.locator("td.break-reason:not(:empty)")).first
                turn = f"{run}/turns/{broke.get_attribute('data-iteration')}?render=anthropic_messages"
                views["inspector-turn.png"] = turn
                views["inspector-request.png"] = turn + "#first-difference"
                for name, path in views.items():
                    answer = page.goto(base + path)  # None: the same page, scrolled to an anchor
                    assert answer is None or answer.status == 200, path
                    page.screenshot(path=str(args.out / name))
                    print(args.out / name)
                browser.close()


if __name__ == "__main__":
    main()
