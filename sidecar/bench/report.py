"""What a bench measured: the table (p50/p90/p99 per RPC beside the health floor), the JSON of
every sample and the settings, and the plot (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from sidecar.bench.run import HEALTH, RPCS, Outcome

PLOT_EXTRA = "plot"


class PlotUnavailable(Exception):
    pass


Number = TypeVar("Number", int, float)


def percentile(values: Sequence[Number], fraction: float) -> Number:
    """The value at ``fraction`` of the sorted values (nearest rank, the upper one: the p50 of
    an even count is the higher middle value). benchmarks/_lib/harness.py uses this same definition."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def summary(outcome: Outcome) -> dict[str, dict[str, Any]]:
    """Per RPC: count, p50/p90/p99/max in milliseconds, p50 over the health Check's p50."""
    floor = outcome.ms(HEALTH)
    rows: dict[str, dict[str, Any]] = {}
    for rpc in RPCS:
        ms = outcome.ms(rpc)
        errors = sum(failure.rpc == rpc for failure in outcome.failures)
        if not ms:
            rows[rpc] = {"count": 0, "errors": errors}
            continue
        rows[rpc] = {"count": len(ms), "errors": errors,
                     **{f"p{q}_ms": round(percentile(ms, q / 100), 4) for q in (50, 90, 99)},
                     "max_ms": round(max(ms), 4),
                     "p50_over_floor": round(percentile(ms, 0.5) / percentile(floor, 0.5), 3) if floor else None}
    return rows


def table(outcome: Outcome) -> str:
    """What the bench prints: the settings and what the turns were, then a row per RPC."""
    settings, rows, turns = outcome.settings, summary(outcome), outcome.turns
    lines = [f"context-sidecar bench: {settings.target}, {settings.runs} run{'s' * (settings.runs != 1)} x "
             f"{settings.turns} turns (+{settings.warmup} warm-up), concurrency {settings.concurrency}",
             f"budget {settings.budget:,} {settings.counter}, render {settings.render}; tool results "
             f"{settings.result_tokens}"]
    if turns:
        results = [turn.result_tokens for turn in turns]
        over = outcome.over_budget
        lines[-1] += f", counted p50 {percentile(results, 0.5):,}, p99 {percentile(results, 0.99):,} tokens"
        entries = f"{percentile([t.entries for t in turns], 0.5)} entries, " if settings.render == "none" else ""
        lines.append(f"windows p50 {percentile([t.token_count for t in turns], 0.5):,} tokens, {entries}"
                     f"{percentile([t.response_bytes for t in turns], 0.5) / 1024:,.1f} KiB; "
                     + ("every one within its budget" if not over else
                        f"{len(over)} OVER BUDGET (the first: run {over[0].run} turn {over[0].turn}, "
                        f"{over[0].token_count} > {over[0].token_budget})"))
        lines.append(f"{len(turns):,} turns in {outcome.seconds:.1f} s, "
                     f"{len(turns) / outcome.seconds if outcome.seconds else 0:,.1f} a second")
    if outcome.interrupted:
        lines.append("INTERRUPTED: what was measured until then")
    errors = any(row["errors"] for row in rows.values())
    lines += ["", f"{'RPC':<17}{'count':>6}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"
              + (f"{'errors':>7}" if errors else "") + "  p50 / health p50"]
    for rpc, row in rows.items():
        failed = f"{row['errors']:>7}" if errors else ""
        if not row["count"]:
            lines.append(f"{rpc:<17}{0:>6}{'-':>9}{'-':>9}{'-':>9}{failed}  -")
            continue
        lines.append(f"{rpc:<17}{row['count']:>6,}{row['p50_ms']:>9.3f}{row['p90_ms']:>9.3f}{row['p99_ms']:>9.3f}"
                     f"{failed}  {row['p50_over_floor']:.2f}x" + (", the floor" if rpc == HEALTH else ""))
    if outcome.failures:
        kinds = Counter((failure.rpc, failure.code) for failure in outcome.failures)
        lines += ["", "failed calls (each ended its run): " + ", ".join(
            f"{rpc} {code} x{count}" for (rpc, code), count in kinds.items()),
                  f"  the first: {outcome.failures[0].message}"]
    return "\n".join(lines)


def document(outcome: Outcome) -> dict[str, Any]:
    """The JSON written by --json: the settings (never the token), the summary, every sample."""
    return {
        "tool": "context-sidecar bench",
        "settings": outcome.settings.public(),
        "started_at": outcome.started_at,
        "seconds": round(outcome.seconds, 3),
        "interrupted": outcome.interrupted,
        "summary": summary(outcome),
        "samples": {rpc: [{"run": s.run, "turn": s.turn, "ms": round(s.ms, 4), "at_s": round(s.at_s, 4)}
                          for s in outcome.samples if s.rpc == rpc] for rpc in RPCS},
        "turns": [vars(turn) for turn in outcome.turns],
        "failures": [vars(failure) for failure in outcome.failures],
        "run_ids": outcome.run_ids,
    }


def write_json(outcome: Outcome, path: Path) -> None:
    path.write_text(json.dumps(document(outcome), indent=1) + "\n", encoding="utf-8")


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or PlotUnavailable naming the extra."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise PlotUnavailable(f"--plot needs matplotlib, which is not installed ({error}); it comes with "
                              f"the {PLOT_EXTRA!r} extra: pip install 'context-sidecar[{PLOT_EXTRA}]'") from error
    return plt


def plot(outcome: Outcome, path: Path) -> None:
    """Latency per turn (the median over runs at each turn, the window's tokens beside it) and
    the distribution of each RPC's latency (its CDF), side by side, written to ``path`` (PNG)."""
    plt = pyplot()
    settings = outcome.settings
    figure, (per_turn, spread) = plt.subplots(1, 2, figsize=(12, 4.6), dpi=100)
    colours = {"Health/Check": "#7f7f7f", "AssembleContext": "#1f77b4"}
    for rpc in RPCS:
        by_turn: dict[int, list[float]] = {}
        for sample in outcome.samples:
            if sample.rpc == rpc:
                by_turn.setdefault(sample.turn, []).append(sample.ms)
        if not by_turn:
            continue
        xs = sorted(by_turn)
        per_turn.plot(xs, [statistics.median(by_turn[x]) for x in xs], color=colours[rpc], linewidth=0.9,
                      label=f"{rpc}" + (" (median of runs)" if settings.runs > 1 else ""))
        ms = sorted(outcome.ms(rpc))
        spread.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))], color=colours[rpc],
                    label=f"{rpc}: p50 {percentile(ms, 0.5):.2f}, p99 {percentile(ms, 0.99):.2f} ms")
        for q, marker in ((0.5, "o"), (0.9, "s"), (0.99, "^")):
            spread.plot([percentile(ms, q)], [q], marker=marker, color=colours[rpc], markersize=5)
    spread.set_xscale("log")
    per_turn.set_yscale("log")
    ticker = plt.matplotlib.ticker
    for axis in (per_turn.yaxis, spread.xaxis):  # 0.5, 1, 2, 5: not 5x10^-1
        axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_minor_formatter(ticker.NullFormatter())
    per_turn.set_xlabel("turn of the run")
    per_turn.set_ylabel("latency, ms (log)")
    per_turn.set_title("latency per turn")
    per_turn.grid(True, which="both", alpha=0.25)
    if outcome.turns:
        fill: dict[int, list[int]] = {}
        for turn in outcome.turns:
            fill.setdefault(turn.turn, []).append(turn.token_count)
        tokens = per_turn.twinx()
        xs = sorted(fill)
        tokens.plot(xs, [statistics.median(fill[x]) for x in xs], color="#ff7f0e", linewidth=0.7, linestyle="--",
                    alpha=0.45, label="window tokens")
        tokens.axhline(settings.budget, color="#ff7f0e", linewidth=0.6, alpha=0.5)
        per_turn.set_zorder(tokens.get_zorder() + 1)  # the latencies in front of the tokens
        per_turn.patch.set_visible(False)
        tokens.set_ylim(0, settings.budget * 1.15)
        tokens.set_ylabel("window tokens (dashed; the line is the budget)")
    per_turn.legend(loc="upper left", fontsize=8)
    spread.set_xlabel("latency, ms (log)")
    spread.set_ylabel("fraction of calls at or below")
    spread.set_title("distribution (markers: p50, p90, p99)")
    spread.grid(True, which="both", alpha=0.25)
    spread.legend(loc="lower right", fontsize=8)
    figure.suptitle(f"context-sidecar bench: {settings.runs} x {settings.turns} turns, concurrency "
                    f"{settings.concurrency}, budget {settings.budget:,}, tool results {settings.result_tokens}, "
                    f"render {settings.render}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
