"""How much memory a sidecar keeps for what it was fed: anonymous RSS before and after many runs.

A real sidecar process (o200k_base, a 32k transcript budget) is fed runs of one turn each: a user
message, a tool call, a ~100 KB prose tool result fed whole, and an answer, assembled for
Anthropic. After a warm-up (which loads the encodings and fills what the process keeps anyway),
its ``RssAnon`` (/proc/PID/status) is read, then again after ``--runs`` more runs. What the
in-process caches hold is bounded in bytes (docs/caches.md), so the growth should plateau well
under what was fed; the caches' own totals are read from /metrics and printed beside it.

    python -m benchmarks.bench_rss_growth [--runs 1000] [--warmup 50] [--result-kib 100] [--cache on|off]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from context_sidecar_client import Client

from benchmarks._lib.harness import add_smoke_flag, sidecar_serving, smoke
from sidecar.bench.workload import prose

METRICS_READY = "context-sidecar metrics on "
BUDGET = 32_000


def rss_anon_kib(pid: int) -> int:
    """The process's anonymous resident memory, in KiB."""
    found = re.search(r"^RssAnon:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    if not found:
        raise SystemExit("this benchmark reads /proc/PID/status (Linux)")
    return int(found[1])


def cache_figures(url: str) -> dict[str, dict[str, float]]:
    """Each cache's figures from /metrics: bytes held, its bound, hits, misses, evictions."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    figures: dict[str, dict[str, float]] = {}
    for name, cache, value in re.findall(r'^context_sidecar_cache_(\w+)\{cache="([^"]+)"\} (\S+)$', text, re.M):
        figures.setdefault(cache, {})[name.removesuffix("_total")] = float(value)
    return figures


def one_run(client: Client, run_id: str, result: str) -> None:
    client.open_run(run_id=run_id, token_counter="o200k_base", transcript_token_budget=BUDGET)
    client.assemble_context(run_id=run_id, iteration=1, render="anthropic_messages", append_events=[
        {"event_id": "u", "iteration": 1, "role": "user", "type": "message",
         "content": "Find what the report says about the quarterly figures, please."},
        {"event_id": "c", "iteration": 1, "role": "assistant", "type": "tool_call", "call_id": "call-1",
         "tool_name": "read_report", "content": json.dumps({"path": f"reports/{run_id}.md"})},
        {"event_id": "r", "iteration": 1, "role": "tool", "type": "tool_result", "call_id": "call-1",
         "content": result},
        {"event_id": "a", "iteration": 1, "role": "assistant", "type": "message",
         "content": "The report covers the quarter; the figures are in its second part."}])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--result-kib", type=int, default=100, help="each tool result's size")
    parser.add_argument("--cache", choices=("on", "off"), default="on", help="[cache] enabled")
    parser.add_argument("--tree", type=Path, help="a source tree whose sidecar runs instead of the installed one")
    add_smoke_flag(parser)
    args = smoke(parser.parse_args(), runs=2, warmup=1, result_kib=4)
    rng = random.Random(23)
    # Distinct texts (as real tool results are), made before the measurement starts.
    paragraphs = [prose(rng, 2_000) for _ in range(64)]

    def result_text(n: int) -> str:
        pick = random.Random(n)
        text = ""
        while len(text) < args.result_kib * 1024:
            text += paragraphs[pick.randrange(len(paragraphs))] + f"\n\n(section {n}.{len(text)})\n\n"
        return text[:args.result_kib * 1024]

    flags = ["--metrics-listen", "127.0.0.1:0"]
    env = {"CONTEXT_SIDECAR_CACHE_ENABLED": "false"} if args.cache == "off" else {}
    with tempfile.TemporaryDirectory() as folder, \
            sidecar_serving(Path(folder) / "data", flags, env, args.tree) as sidecar:
        assert sidecar.process.stdout is not None  # serving() reads its first line through a pipe
        metrics_line = sidecar.process.stdout.readline()
        metrics_url = metrics_line[len(METRICS_READY):].strip() if metrics_line.startswith(METRICS_READY) else ""
        pid = sidecar.process.pid
        with Client(sidecar.address, timeout=120) as client:
            for n in range(args.warmup):
                one_run(client, f"warm-{n}", result_text(-1 - n))
            time.sleep(1)
            before = rss_anon_kib(pid)
            fed = 0
            began = time.perf_counter()
            for n in range(args.runs):
                text = result_text(n)
                fed += len(text.encode())
                one_run(client, f"run-{n}", text)
            seconds = time.perf_counter() - began
            time.sleep(1)
            after = rss_anon_kib(pid)
        caches = cache_figures(metrics_url) if metrics_url else {}
    growth_mib = (after - before) / 1024
    fed_mib = fed / (1 << 20)
    print(f"runs {args.runs} (after {args.warmup} warm-up), each one turn with a {args.result_kib} KiB tool result, "
          f"cache {args.cache}, {seconds:.1f} s")
    print(f"RssAnon before {before / 1024:.1f} MiB, after {after / 1024:.1f} MiB: "
          f"growth {growth_mib:.1f} MiB for {fed_mib:.1f} MiB fed ({growth_mib / fed_mib:.3f} MiB per MiB)")
    if caches:
        print(f"{'cache':<22} {'bytes held':>12} {'bound':>12} {'hits':>9} {'misses':>9} {'evictions':>10}")
        for name, figure in sorted(caches.items()):
            held, bound = figure.get("bytes", 0), figure.get("max_bytes", 0)
            hits, misses, evictions = figure.get("hits", 0), figure.get("misses", 0), figure.get("evictions", 0)
            print(f"{name:<22} {held:>12,.0f} {bound:>12,.0f} {hits:>9,.0f} {misses:>9,.0f} {evictions:>10,.0f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
