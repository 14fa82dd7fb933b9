"""``python -m benchmarks``: the registry (benchmarks/README.md); ``--smoke`` runs every registered
bench's smoke command, one after another, and fails if any fails."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._lib import registry

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="run every bench's smoke command")
    args = parser.parse_args()
    problems = registry.violations(ROOT)
    if problems:
        raise SystemExit("\n".join(problems))
    if not args.smoke:
        for row in registry.rows(ROOT):
            print(f"{row.bench:<28} {row.command}")
        return
    failed, began = [], time.perf_counter()
    for row in registry.rows(ROOT):
        command = shlex.split(row.smoke)
        command[0] = sys.executable if command[0] == "python" else command[0]
        print(f"\n## {row.smoke}", flush=True)
        started = time.perf_counter()
        if subprocess.run(command, cwd=ROOT).returncode:
            failed.append(row.bench)
        print(f"## {row.bench}: {time.perf_counter() - started:.1f} s", flush=True)
    print(f"\nsmoke: {len(registry.rows(ROOT))} benches in {time.perf_counter() - began:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
