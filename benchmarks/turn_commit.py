"""A turn's durable commit beside one put of the same bytes: would fewer B-trees pay?

A turn writes a few small records into several of its run's databases (the event, its id, its
iteration, its counts chunk, the run record, the window record; a clearing more), and its commit
writes every page they dirty in each of those B-trees. Before changing the storage format to keep
a turn in fewer B-trees (a migration for every store), this measures what that could save.

The writes are recorded, not modelled: a sidecar's domain is built in this process
(``turn_stages``: real LMDB, o200k counting, a 32k budget, sync off), the 10,000-event run of
``compare_trees`` is loaded through a real server and --turns turns of one ~190-token event are
made, every transaction's puts and deletes recorded as the shared store records them
(``storage.recording``). They are then replayed into fresh environments, durable (sync and
metasync on, as the sidecar's store), three ways:

- as written: each record into its own database, as the sidecar keeps it;
- one B-tree: every record into one database, keyed by its database's name and its own key;
- one put: a single value of the turn's bytes (its keys and values) under a new key, the
  commit a floor makes (``floors``).

The loading transactions are replayed first (not durable, not timed), so that every tree has the
run's shape. Rounds alternate the three ways; the figure is each way's median commit, µs.

    python -m benchmarks.turn_commit [--turns 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import cast

import lmdb

from benchmarks import corpus
from benchmarks.compare_trees import BUDGET, RUN, load
from benchmarks.turn_stages import domain, turn_event
from sidecar.storage import environment, recording
from sidecar.storage.keys import Txn

Write = tuple[str, bytes, bytes | None]  # database, key, value (None: deleted)
WAYS = ("as written", "one B-tree", "one put")


@contextmanager
def recorded(transactions: list[list[Write]]) -> Iterator[None]:
    """Every write transaction of the store, its writes appended to ``transactions`` once committed."""
    write_local = environment.Store._write_local

    def recording_write(store: environment.Store, work: Callable, ceiling: int, then: Callable | None = None) -> object:
        writes: list[Write] = []

        def work_recorded(txn: lmdb.Transaction) -> object:
            through = recording.RecordingTxn(cast(Txn, txn), store._names)
            result = work(through)
            writes[:] = [(db, key, value) for records in through.changes().values() for db, key, value in records]
            return result

        result = write_local(store, work_recorded, ceiling, then)
        transactions.append(writes)
        return result

    environment.Store._write_local = recording_write  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        environment.Store._write_local = write_local  # type: ignore[method-assign]


def record_turns(turns: int) -> tuple[list[list[Write]], list[list[Write]]]:
    """The transactions that load the run, and those of ``turns`` turns on it."""
    transactions: list[list[Write]] = []
    with domain(sync=False) as (services, stub, _), recorded(transactions):
        last = load(stub, 10_000)
        loaded = len(transactions)
        contents = corpus.contents(512, seed=7)
        for iteration in range(last + 1, last + 1 + turns):
            services.transcripts.assemble("default", RUN, iteration, [turn_event(contents, iteration)], BUDGET)
    return transactions[:loaded], transactions[loaded:]


def replayed(way: str, loading: list[list[Write]], turns: list[list[Write]]) -> float:
    """The median durable commit of ``turns`` replayed ``way``, after ``loading``, in µs."""
    names = sorted({db for writes in loading + turns for db, _, _ in writes})
    commits: list[float] = []
    with tempfile.TemporaryDirectory(prefix="sidecar-turn-commit-") as path:
        for durable in (False, True):  # the loading not durable (not timed), the turns durable
            env = lmdb.open(path, map_size=8 << 30, max_dbs=len(names) + 1, sync=durable, metasync=durable)
            databases = {name: env.open_db(name.encode()) for name in names}
            one = env.open_db(b"one")
            for number, writes in enumerate(turns if durable else loading):
                txn = env.begin(write=True)
                if durable and way == "one put":
                    payload = sum(len(key) + len(value or b"") for _, key, value in writes)
                    txn.put(b"floor-%08d" % number, b"x" * payload, db=one)
                else:
                    for db, key, value in writes:
                        into, key = (databases[db], key) if way == "as written" else (one, db.encode() + b"\0" + key)
                        if value is None:
                            txn.delete(key, db=into)
                        else:
                            txn.put(key, value, db=into)
                started = time.perf_counter()
                txn.commit()
                if durable:
                    commits.append(time.perf_counter() - started)
            env.close()
    return statistics.median(commits) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    loading, turns = record_turns(args.turns)
    written = sorted(len(writes) for writes in turns)
    databases = sorted(len({db for db, _, _ in writes}) for writes in turns)
    payload = sorted(sum(len(key) + len(value or b"") for _, key, value in writes) for writes in turns)
    figures: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            figures[way].append(replayed(way, loading, turns))
    print(f"{args.turns} turns of one event on a 10,000-event run, each replayed as one durable commit; "
          f"a turn writes (median) {statistics.median(written):.0f} records into "
          f"{statistics.median(databases):.0f} databases, {statistics.median(payload):,.0f} bytes of keys and values\n")
    print(f"{'commit':<14} {'median µs':>10}  {'/ one put':>9}   rounds")
    floor = statistics.median(figures["one put"])
    for way in WAYS:
        median = statistics.median(figures[way])
        print(f"{way:<14} {median:10.0f}  {median / floor:9.2f}   {' '.join(f'{x:.0f}' for x in figures[way])}")


if __name__ == "__main__":
    main()
