"""The executable specification: random workloads over every combination of the window's
settings, against three real sidecars at once, checked on every step (docs/specification.md).

CI runs a bounded, derandomised number of examples (the same ones every run). The long command
runs fresh random examples until a time budget is spent, and prints how many examples and steps
it tried::

    SIDECAR_SPEC_SECONDS=3600 .venv/bin/python -m pytest tests/specification -q -s

Other knobs: ``SIDECAR_SPEC_EXAMPLES`` (examples per batch, default 20 in CI, 50 in the long
command), ``SIDECAR_SPEC_STEPS`` (steps per example, default 25).
A failure prints the shrunk sequence of steps that reproduces it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from sidecar.text.counting import Counters
from tests.helpers import Postgres
from tests.specification.machine import SpecificationMachine
from tests.specification.sidecars import Config

SECONDS = float(os.environ.get("SIDECAR_SPEC_SECONDS", "0"))  # 0: the bounded CI run
LONG = SECONDS > 0
EXAMPLES = int(os.environ.get("SIDECAR_SPEC_EXAMPLES", "50" if LONG else "20"))
STEPS = int(os.environ.get("SIDECAR_SPEC_STEPS", "25"))


def hypothesis_settings(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=STEPS, deadline=None,
                    derandomize=not LONG,  # CI: the same examples every run, so it never flakes
                    database=None, report_multiple_bugs=False,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def counters() -> Counters:
    return Counters()


def run_for(machine: type[SpecificationMachine], examples: int) -> None:
    """One bounded run; or, for the long command, batches until the time budget is spent, each
    failure (shrunk) printed as it is found and the run going on, failing at the end if any did."""
    started = time.monotonic()
    batches, failures = 0, []
    while True:
        try:
            run_state_machine_as_test(machine, settings=hypothesis_settings(examples))
        except Exception as failure:  # noqa: BLE001 - the long command reports every failure it finds
            if not LONG:
                raise
            failures.append(failure)
            print(f"\n--- failure {len(failures)} after {time.monotonic() - started:.0f} s:\n{failure}\n"
                  f"{getattr(failure, '__notes__', '')}", flush=True)
        batches += 1
        if not LONG or time.monotonic() - started > SECONDS:
            break
    print(f"\nspecification ({machine.__name__}): {batches} batch(es) of {examples} examples, "
          f"{machine.steps} steps, {machine.summaries_asked} host summaries asked for, {machine.summaries_fed} "
          f"checked fed, {len(failures)} failure(s), {time.monotonic() - started:.0f} s")
    assert not failures, f"{len(failures)} failing sequence(s), printed above"


def test_lmdb_alone(counters: Counters) -> None:
    machine = type("LmdbAlone", (SpecificationMachine,), {"counters": counters, "shared_urls": None, "steps": 0})
    run_for(machine, EXAMPLES)


# A turn with nothing in it but the host's user message, for the fixed sequences below.
QUIET = {"seed": 0, "user_words": 0, "untrusted": False, "calls": [], "cross_turn": False, "reply_words": 0,
         "via_append": False, "render": "", "max_tokens": None}


@contextmanager
def fixed_sequence(counters: Counters, name: str, config: Config) -> Iterator[SpecificationMachine]:
    """The machine started on ``config``, for a test that calls its steps itself (the same steps
    and checks the random runs take), torn down however the steps end."""
    machine = type(name, (SpecificationMachine,), {"counters": counters, "shared_urls": None, "steps": 0,
                                                   "summaries_asked": 0, "summaries_fed": 0})
    state = machine()
    try:
        state.start(config=config)
        yield state
    finally:
        state.teardown()


def test_a_host_summary_asked_for_is_fed(counters: Counters) -> None:
    """CI's random examples are too short to reach compaction (25 steps, budgets up to 12,000):
    this fixed sequence of steps, through the same machine and checks, does. A host records the
    summary compaction asks for, across a restart, and it is fed at the next iteration; a replay
    fork of the run is fed the source's windows, that summary included."""
    config = Config(token_counter="o200k_base", budget=600, window_policy="cache_stable", clearing=True,
                    summaries="host", keep_last_turns=1, transcript_window=0, trim_to_fraction=0.6)
    with fixed_sequence(counters, "HostSummary", config) as state:
        for seed in range(6):
            state.turn(index=0, shape={**QUIET, "seed": seed, "user_words": 12, "calls": ["small"], "reply_words": 30})
            if seed == 3:
                state.restart()
        state.reassemble(index=0, back=1)
        state.fork(index=0, where=0.2, mode="replay", depart=None)
        for _ in range(6):
            state.turn(index=1, shape=QUIET)
    assert type(state).summaries_fed >= 2, "the source's summary and the fork's are checked fed"


def test_a_branch_fork_recuts_the_clips_it_carries(counters: Counters) -> None:
    """Found by the long command (after 52 minutes): a result clipped in its own turn is re-cut to
    half the budget on the next, and that turn, its own results clipped too, may cut it shorter
    still. A branch fork that carries the first turn but not the second re-cuts the result for
    its own turn, to half the budget: the source's later bytes are not the fork's."""
    config = Config(token_counter="o200k_base", budget=600, window_policy="cache_stable", clearing=False,
                    summaries="none", keep_last_turns=0, transcript_window=0, trim_to_fraction=0.6)
    with fixed_sequence(counters, "BranchClip", config) as state:
        state.turn(index=0, shape={**QUIET, "calls": ["huge", "tiny"], "cross_turn": True})
        state.reassemble(back=0, index=0)
        state.turn(index=0, shape={**QUIET, "calls": ["huge"]})
        state.reassemble(back=0, index=0)
        state.fork(depart=None, index=0, mode="branch", where=0.505129817097491)
        state.turn(index=1, shape=QUIET)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    server = Postgres()
    yield server
    server.close()


def test_shared_store(counters: Counters, postgres: Postgres) -> None:
    """The same, each sidecar on a PostgreSQL database of its own ([storage] shared)."""
    urls = lambda: (postgres.database(), postgres.database(), postgres.database())  # noqa: E731
    machine = type("SharedStore", (SpecificationMachine,), {"counters": counters, "shared_urls": urls, "steps": 0})
    run_for(machine, max(2, EXAMPLES // 4))
