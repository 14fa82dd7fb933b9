"""AssembleContext of one turn that holds N events: the time per event, which must stay flat in N.

In process, over the domain API (``sidecar.transcript.Transcripts``, real LMDB, real o200k
counting), so the figure is the sidecar's own work on the turn, not the wire's: for each N a fresh
run receives N events of ~40 tokens, all of iteration 1, in one assemble call (append, choose,
persist, answer), twice:

- whole: a budget the turn fits, so every event is fed as it is;
- clipped: a budget of half the turn's tokens, so every event is fed clipped with the elision
  marker (the water-filling cap is ~20 tokens, above what the marker needs).

A step that is quadratic in the events of one turn shows as a column that grows with N; linear
work gives a flat column.

    python -m benchmarks.one_turn [--sizes 1000,4000,16000,64000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from benchmarks.corpus import _WORDS
from sidecar.settings import ContextSettings
from sidecar.storage.environment import Store
from sidecar.text.counting import Counters
from sidecar.transcript.log import NewEvent
from sidecar.transcript.transcripts import Transcripts

TENANT = "bench"
WORDS_PER_EVENT = 40
MAX_BUDGET = 2**31 - 1


def turn_events(count: int) -> list[NewEvent]:
    rng = random.Random(count)
    return [NewEvent(f"e{i}", 1, "user" if i % 2 else "assistant", "message",
                     " ".join(rng.choice(_WORDS) for _ in range(WORDS_PER_EVENT))) for i in range(count)]


def seconds_per_event(counters: Counters, events: list[NewEvent], budget: int | None, folder: Path) -> float:
    """One assemble of ``events`` as a new run's turn 1; ``budget`` None: one the turn fits."""
    store = Store(str(folder), map_size=4 << 30, sync=False)
    try:
        # The per-call caps are lifted: this measures the work per event, not the caps.
        transcripts = Transcripts(store, counters, ContextSettings(
            transcript_token_budget=MAX_BUDGET, model_window_tokens=MAX_BUDGET,
            max_request_events=len(events), max_request_bytes=sum(len(e.content.encode()) for e in events)))
        if budget is not None:
            transcripts.open_run(TENANT, "run", token_counter="o200k_base", transcript_token_budget=budget)
        started = time.perf_counter()
        assembled, _ = transcripts.assemble(TENANT, "run", 1, events)
        elapsed = time.perf_counter() - started
        window = assembled.window
        assert len(window.event_ids) == len(events), "the whole turn is fed"
        assert bool(window.clips) == (budget is not None), "clipped exactly when the budget asks for it"
        return elapsed / len(events)
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,4000,16000,64000", help="events in the turn, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the best is shown")
    args = parser.parse_args()
    counters = Counters()
    count = counters.get("o200k_base").count
    print(f"{'events':>8} {'tokens':>10} {'whole us/event':>15} {'clipped us/event':>17}")
    with tempfile.TemporaryDirectory() as scratch:
        for n in (int(size) for size in args.sizes.split(",")):
            events = turn_events(n)
            tokens = sum(count(e.content) for e in events)
            best: dict[str, float] = {}
            for attempt in range(args.repeat):
                for kind, budget in (("whole", None), ("clipped", tokens // 2)):
                    folder = Path(scratch) / f"{n}-{kind}-{attempt}"
                    spent = seconds_per_event(counters, events, budget, folder)
                    best[kind] = min(best.get(kind, spent), spent)
            print(f"{n:>8} {tokens:>10} {best['whole'] * 1e6:>15.1f} {best['clipped'] * 1e6:>17.1f}", flush=True)


if __name__ == "__main__":
    main()
