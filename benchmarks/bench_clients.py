"""Every client's bench program against one sidecar: what a call costs in each host language.

Starts ONE real sidecar process, then runs each available client's implementation of the common
bench protocol (``benchmarks/client_bench.py`` says it in full) against it, one after the other:

- python: ``python -m benchmarks._lib.client_bench`` (context_sidecar_client)
- python-stubs: the same with ``--stubs``: the generated stubs, no client, and the client timed
  in the same rounds (what the client adds, printed under the table)
- node:   ``node clients/node/bench.js`` (the package, built: ``npm ci && npm run build``)
- go:     ``go run ./cmd/bench`` in clients/go
- java:   the class in a ``Bench.java``, built by Maven (``clients/java/pom.xml``), run by ``java -cp``
- rust:   ``cargo run --release --example bench`` in clients/rust (the first build takes minutes;
          under --smoke the unoptimised build of ``cargo test``)

A language whose program or tool is missing is skipped, saying so. Each program prints one line
of JSON; the table sets them side by side: the health Check p50 (the floor of any call from that
client), AssembleContext re-assembling an 8k window p50, and their ratio.

    python -m benchmarks.bench_clients [--rounds 300] [--clients python-stubs,python,node,go,java,rust] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._lib.harness import add_smoke_flag, sidecar_address, smoke

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ROOT / "clients"


def command(language: str, target: str, rounds: int, smoke_run: bool) -> tuple[list[str], Path] | str:
    """The command running ``language``'s bench program, and where; or why it cannot run."""
    args = ["--target", target, "--rounds", str(rounds)]
    if language in ("python", "python-stubs"):
        stubs = ["--stubs"] if language == "python-stubs" else []
        return [sys.executable, "-m", "benchmarks._lib.client_bench", *args, *stubs], ROOT
    if language == "node":
        if not (CLIENTS / "node" / "bench.js").is_file():
            return "clients/node/bench.js is missing"
        if not (CLIENTS / "node" / "dist" / "index.js").is_file():
            return "clients/node is not built (cd clients/node && npm ci && npm run build)"
        return [shutil.which("node") or "node", "bench.js", *args], CLIENTS / "node"
    if language == "go":
        if not (CLIENTS / "go" / "cmd" / "bench").is_dir():
            return "clients/go/cmd/bench is missing"
        if not shutil.which("go"):
            return "go is not on PATH"
        return ["go", "run", "./cmd/bench", *args], CLIENTS / "go"
    if language == "java":
        pom = CLIENTS / "java" / "pom.xml"
        bench = sorted((CLIENTS / "java" / "src" / "main" / "java").rglob("Bench.java"))
        if not pom.is_file() or not bench:
            return "clients/java/pom.xml or its Bench.java is missing"
        if not shutil.which("mvn"):
            return "mvn is not on PATH"
        main_class = ".".join(bench[0].relative_to(CLIENTS / "java" / "src" / "main" / "java").with_suffix("").parts)
        # Maven builds and writes the classpath; the bench runs in a JVM of its own, so its stdout is
        # its one JSON line (exec:java lets Maven's terminal codes onto it).
        build = "mvn -q -B -f pom.xml compile dependency:build-classpath >&2"
        java = f'exec java -cp "target/classes:$(cat target/classpath.txt)" {main_class} {" ".join(args)}'
        return ["bash", "-c", f"{build} && {java}"], CLIENTS / "java"
    if language == "rust":
        if not (CLIENTS / "rust" / "examples" / "bench.rs").is_file():
            return "clients/rust/examples/bench.rs is missing"
        if not shutil.which("cargo"):
            return "cargo is not on PATH"
        # Measured: an optimised build. The smoke only checks that the program runs, so it takes the
        # unoptimised build the Rust tests made (cargo test builds the examples): nothing to compile.
        profile = [] if smoke_run else ["--release"]
        return ["cargo", "run", *profile, "--locked", "--quiet", "--example", "bench", "--", *args], CLIENTS / "rust"
    return f"no bench program is known for {language}"


def run(language: str, target: str, rounds: int, smoke_run: bool) -> dict | str:
    found = command(language, target, rounds, smoke_run)
    if isinstance(found, str):
        return found
    argv, cwd = found
    print(f"{language}: {' '.join(argv)}", file=sys.stderr, flush=True)
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return f"failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}"
    return json.loads(lines[-1])  # the program's one line of JSON comes last (a build may print before it)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--clients", default="python-stubs,python,node,go,java,rust",
                        help="languages, comma-separated, in order")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    add_smoke_flag(parser)
    # The smoke runs the Python client and the Rust one (in the build of the Rust tests, which run
    # before it): building the Go and Java programs takes minutes.
    args = smoke(parser.parse_args(), rounds=2, clients="python-stubs,python,rust")
    results: dict[str, dict | str] = {}
    with tempfile.TemporaryDirectory(prefix="sidecar-clients-") as tmp:
        with sidecar_address(Path(tmp) / "lmdb", ["--token-counter", "o200k_base"]) as target:
            for language in args.clients.split(","):
                results[language] = run(language, target, args.rounds, args.smoke)
    rows = [(language, r["health_p50_us"], r["assemble_p50_us"], r["assemble_p50_us"] / r["health_p50_us"])
            for language, r in results.items() if isinstance(r, dict)]
    print(f"\n{args.rounds} rounds per client, one sidecar; p50 in microseconds\n")
    if args.markdown:
        print("| client | health p50 us | assemble 8k p50 us | assemble / health |\n|---|---:|---:|---:|")
        for language, health, assemble, ratio in rows:
            print(f"| {language} | {health:,.0f} | {assemble:,.0f} | {ratio:.2f}x |")
    else:
        print(f"{'client':<13} {'health p50 us':>14} {'assemble 8k p50 us':>19} {'ratio':>7}")
        for language, health, assemble, ratio in rows:
            print(f"{language:<13} {health:>14,.0f} {assemble:>19,.0f} {ratio:>6.2f}x")
    stubs = results.get("python-stubs")
    if isinstance(stubs, dict):
        extra = {call: stubs[f"client_{call}_p50_us"] - stubs[f"{call}_p50_us"] for call in ("health", "assemble")}
        print(f"\nthe Python client in the same rounds as python-stubs: health {stubs['client_health_p50_us']:,.0f} "
              f"({extra['health']:+,.0f}), assemble {stubs['client_assemble_p50_us']:,.0f} ({extra['assemble']:+,.0f})")
    for language, result in results.items():
        if isinstance(result, str):
            print(f"{language}: skipped: {result}")
    if args.smoke and any(isinstance(result, str) for result in results.values()):
        raise SystemExit("--smoke: every client asked for must run")


if __name__ == "__main__":
    main()
