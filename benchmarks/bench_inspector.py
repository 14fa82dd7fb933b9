"""The run inspector's page load times over a long run, against the inspector's own floor.

A real sidecar process on a fresh store; ``context-sidecar bench --keep-runs`` plays one run of
``--turns`` turns through it (each a user message, a tool call, its result of lognormal size and
the previous answer, rendered for Anthropic), and keeps it. Then ``context-sidecar inspect``
serves the inspector over the same store, as a user runs it, and each view is fetched over HTTP
in interleaved rounds (a new connection each time, as a browser's first load of the page): the
runs list, the run's first and last timeline pages, its first and newest turns (with the request
body and its diff: OpenAI's, and the newest's Anthropic's too). The floor is a
page that reads nothing from the store (an address no view has: 404), measured in the same rounds;
each view's p50 is printed over it. Every fetch must answer 200 with the page's own marker; no time
is asserted.

    python -m benchmarks.bench_inspector [--turns 2000] [--rounds 200]
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlsplit

from benchmarks._lib.harness import add_smoke_flag, interleaved, print_table, serving, sidecar_serving, smoke, warm

INSPECTOR_READY = "context-sidecar inspector on "
TURNS_PER_PAGE = 100  # the inspector's default page of the timeline


def fetch(host: str, port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def play_run(address: str, turns: int) -> None:
    """One run of ``turns`` turns played by ``context-sidecar bench`` and kept (its id is read
    from the inspector's runs list)."""
    played = subprocess.run(
        [sys.executable, "-m", "sidecar", "bench", "--target", address, "--turns", str(turns), "--warmup", "0",
         "--render", "anthropic_messages", "--keep-runs", "--progress", "off"],
        capture_output=True, text=True, check=True)
    print(played.stdout.strip(), end="\n\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000, help="turns of the run the pages show")
    parser.add_argument("--rounds", type=int, default=200, help="fetches of each page")
    add_smoke_flag(parser)
    args = smoke(parser.parse_args(), turns=30, rounds=3)
    with tempfile.TemporaryDirectory() as folder:
        storage = Path(folder) / "data"
        with sidecar_serving(storage, ["--no-sync"]) as sidecar:
            play_run(sidecar.address, args.turns)
            command = [sys.executable, "-m", "sidecar", "inspect", "--storage-path", str(storage),
                       "--inspector-listen", "127.0.0.1:0", "--log-level", "WARNING"]
            with serving(command, INSPECTOR_READY) as inspector:
                url = urlsplit(inspector.address)
                host, port = url.hostname or "127.0.0.1", url.port or 80
                _, listing = fetch(host, port, "/")
                run_id = listing.decode().split('href="/runs/', 1)[1].split('"', 1)[0]
                run = f"/runs/{run_id}"
                last_page = max(1, -(-args.turns // TURNS_PER_PAGE))
                # Each view's address and a marker its page carries (a page answering something
                # else, an error page say, would otherwise be timed as the view).
                views = {
                    "floor: nothing read (404)": ("/no-such-page", b"Not found", 404),
                    "runs list": ("/", b'id=runs', 200),
                    "run, timeline page 1": (run, b"id=turns", 200),
                    f"run, timeline page {last_page}": (f"{run}?page={last_page}", b"id=turns", 200),
                    "turn 1": (f"{run}/turns/1", b"id=entries", 200),
                    f"turn {args.turns} (newest)": (f"{run}/turns/{args.turns}", b"id=entries", 200),
                    f"turn {args.turns}, Anthropic body": (f"{run}/turns/{args.turns}?render=anthropic_messages",
                                                           b"id=request-body", 200),
                }
                sizes: dict[str, int] = {}

                def loader(name: str, path: str, marker: bytes, expected: int) -> Callable[[], object]:
                    def load() -> None:
                        status, body = fetch(host, port, quote(path, safe="/?=&"))
                        if status != expected or marker not in body:
                            raise SystemExit(f"{name}: {path} answered {status} without {marker!r}")
                        sizes[name] = len(body)
                    return load

                samples = interleaved({name: loader(name, *view) for name, view in views.items()},
                                      args.rounds, warmup=warm(20))
    floor = samples["floor: nothing read (404)"].p50
    print(f"inspector over one run of {args.turns:,} turns, {args.rounds} rounds, each fetch a new connection\n")
    print_table(("page", "p50 ms", "p99 ms", "p50 / floor p50", "page KiB"), (
        (name, f"{figures.p50 / 1000:.2f}", f"{figures.p99 / 1000:.2f}", f"{figures.p50 / floor:.2f}x",
         f"{sizes[name] / 1024:.1f}") for name, figures in samples.items()))


if __name__ == "__main__":
    main()
