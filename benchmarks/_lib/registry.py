"""The benchmarks' registry: the table in benchmarks/README.md, one row a ``bench_*.py`` with what it
measures, its command and its smoke command. tests/test_architecture.py checks it against the
files; ``python -m benchmarks --smoke`` runs every smoke command."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import NamedTuple

README = Path("benchmarks") / "README.md"
HEADER = ("bench", "measures", "command", "smoke")


class Row(NamedTuple):
    bench: str  # its file, bench_<what>.py
    measures: str
    command: str
    smoke: str


def _cells(line: str) -> list[str]:
    """A row's cells; a cell that opens with code is that code (a note may follow it)."""
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    return [code.group(1).strip() if (code := re.match(r"`([^`]*)`", cell)) else cell for cell in cells]


def rows(root: Path) -> list[Row]:
    """The registry's rows, in order; [] when the page or its table is missing."""
    page = root / README
    if not page.is_file():
        return []
    lines = page.read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        if line.startswith("|") and tuple(_cells(line)) == HEADER:
            found = []
            for row in lines[index + 2:]:
                if not row.startswith("|"):
                    break
                cells = _cells(row)
                found.append(Row(*cells) if len(cells) == len(HEADER) else Row(cells[0], "", "", ""))
            return found
    return []


def module_of(bench: str) -> str:
    return "benchmarks." + bench.removesuffix(".py")


def violations(root: Path) -> list[str]:
    """Every bench_*.py has a row, every row a file; each row's commands run its module, the smoke
    command with --smoke."""
    if not (root / README).is_file():
        return [f"{README} is missing: the benchmarks' registry lives there"]
    registered = rows(root)
    if not registered:
        return [f"{README} has no table | {' | '.join(HEADER)} |"]
    files = {path.name for path in (root / "benchmarks").glob("bench_*.py")}
    named = [row.bench for row in registered]
    found = [f"benchmarks/{name}: no row in {README}" for name in sorted(files - set(named))]
    found += [f"{README} names {name}, which does not exist" for name in named if name not in files]
    found += [f"{README} names {name} twice" for name in sorted({name for name in named if named.count(name) > 1})]
    for row in registered:
        runs = f"python -m {module_of(row.bench)}"
        if not re.fullmatch(r"bench_\w+\.py", row.bench):
            found.append(f"{README}: {row.bench!r} is not a bench_<what>.py")
        if not row.command.startswith(runs) or not row.measures:
            found.append(f"{README}: {row.bench}'s row says what it measures and its command, {runs} ...")
        if not row.smoke.startswith(runs) or "--smoke" not in shlex.split(row.smoke):
            found.append(f"{README}: {row.bench}'s smoke command is {runs} ... --smoke")
    return found
