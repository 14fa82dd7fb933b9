"""Drives a running sidecar with synthetic agent turns and times every call, as a host sees it.

Each run opens a run on the sidecar and plays its turns one after the other; ``concurrency``
threads play runs at once, over one shared ``context_sidecar_client.Client`` (one channel, as a host
process has). A turn is one AssembleContext that appends the turn's events (the previous turn's
answer, then the user's message, the tool call and its result) under the run's budget, and one
health Check beside it, in alternating order, so the floor is measured under the same load, on
the same channel, in the same moments. The warm-up plays ``warmup`` turns on runs of its own
first, one per thread, and none of it is counted. Calls are never retried: a bench reports a
failure, it does not hide one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from context_sidecar_client import Client, ClientTls, SidecarCallError

from sidecar.bench.workload import Event, Sizes, agent_turns

HEALTH, ASSEMBLE = "Health/Check", "AssembleContext"
RPCS = (HEALTH, ASSEMBLE)
RENDERINGS = ("none", "openai_responses", "anthropic_messages")


class BenchError(Exception):
    """The bench cannot go on: no sidecar at the target, or a run refused at its start."""


@dataclass(frozen=True)
class BenchSettings:
    target: str = "127.0.0.1:50051"
    token: str | None = None
    tls: ClientTls | None = None
    turns: int = 200
    runs: int = 1
    concurrency: int = 1
    warmup: int = 20
    budget: int = 8000
    counter: str = "o200k_base"
    render: str = "none"
    result_tokens: Sizes = field(default_factory=lambda: Sizes.parse("lognormal:300"))
    seed: int = 1
    timeout: float = 30.0
    keep_runs: bool = False

    def public(self) -> dict[str, Any]:
        """The settings as the report shows them: everything but the token."""
        return {"target": self.target, "tenant_token": self.token is not None, **self._tls(), "turns": self.turns,
                "runs": self.runs, "concurrency": self.concurrency, "warmup": self.warmup, "budget": self.budget,
                "counter": self.counter, "render": self.render, "result_tokens": str(self.result_tokens),
                "seed": self.seed, "timeout": self.timeout, "keep_runs": self.keep_runs}

    def _tls(self) -> dict[str, Any]:
        """Over TLS, ``tls``: the files' paths (nothing of what they hold); plaintext: nothing."""
        if self.tls is None:
            return {}
        return {"tls": {name: None if path is None else os.fspath(path)
                        for name, path in (("ca_file", self.tls.ca_file), ("cert_file", self.tls.cert_file))}}


@dataclass
class Sample:
    rpc: str
    run: int
    turn: int  # 0-based, within the run
    ms: float
    at_s: float  # when the call started, seconds after the measured part began


@dataclass
class TurnRecord:
    """What one AssembleContext answered."""

    run: int
    turn: int
    run_id: str
    iteration: int
    token_count: int
    token_budget: int
    entries: int
    result_tokens: int  # the tool result's count, by the sidecar
    response_bytes: int


@dataclass
class Failure:
    rpc: str
    run: int
    turn: int
    code: str
    message: str


@dataclass
class Outcome:
    settings: BenchSettings
    started_at: str
    seconds: float = 0.0  # the measured part, wall clock
    samples: list[Sample] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    interrupted: bool = False

    def ms(self, rpc: str) -> list[float]:
        return [sample.ms for sample in self.samples if sample.rpc == rpc]

    @property
    def over_budget(self) -> list[TurnRecord]:
        return [turn for turn in self.turns if turn.token_count > turn.token_budget]


class _Stopped(Exception):
    pass


class Driver:
    def __init__(self, settings: BenchSettings, client: Client, on_turn: Callable[[], None]) -> None:
        self.settings, self.client, self.on_turn = settings, client, on_turn
        self.stop = threading.Event()
        self.prefix = f"bench-{os.urandom(4).hex()}"  # new run ids each time: re-running needs no cleanup
        self.opened: list[str] = []
        self._lock = threading.Lock()

    def play(self, run: int, turns: int, outcome: Outcome | None, begun: float) -> None:
        """One run of ``turns`` turns; ``outcome`` None: the warm-up, nothing kept."""
        settings, client = self.settings, self.client
        run_id = f"{self.prefix}-{'warmup' if outcome is None else 'run'}-{run}"
        try:
            client.open_run(run_id=run_id, token_counter=settings.counter,
                            transcript_token_budget=settings.budget)
        except SidecarCallError as error:
            raise BenchError(f"OpenRun of {run_id} was refused: {error}"
                             + (" (a sidecar with tenants needs --token)" if error.code.name == "UNAUTHENTICATED"
                                else "")) from error
        with self._lock:
            self.opened.append(run_id)
        source = agent_turns(f"{'warmup' if outcome is None else 'run'}/{settings.seed}/{run}", settings.result_tokens)
        answer: Event | None = None  # the previous turn's answer, sent with this turn's events
        render = "" if settings.render == "none" else settings.render
        for index in range(turns):
            if self.stop.is_set():
                raise _Stopped
            turn = next(source)
            iteration = index + 1
            events = ([answer] if answer else []) + [turn.user, turn.call, turn.result]
            calls: list[tuple[str, Callable[[], Any]]] = [
                (HEALTH, client.check_health),
                (ASSEMBLE, partial(client.assemble_context, run_id=run_id, iteration=iteration, append_events=events,
                                   render=render))]
            if index % 2:
                calls.reverse()
            for rpc, call in calls:
                started = time.perf_counter()
                try:
                    response = call()
                except SidecarCallError as error:
                    if outcome is None:
                        raise BenchError(f"the warm-up's {rpc} failed: {error}") from error
                    with self._lock:
                        outcome.failures.append(Failure(rpc, run, index, error.code.name, str(error)))
                    return  # the run's state is unknown now: it ends here
                ms = (time.perf_counter() - started) * 1e3
                if outcome is None:
                    continue
                with self._lock:
                    outcome.samples.append(Sample(rpc, run, index, ms, started - begun))
                    if rpc == ASSEMBLE:
                        outcome.turns.append(TurnRecord(
                            run, index, run_id, iteration, response.token_count, response.token_budget,
                            len(response.entries), response.appended[-1].tokens if response.appended else 0,
                            response.ByteSize()))
            answer = turn.answer
            self.on_turn()

    def play_all(self, count: int, turns: int, outcome: Outcome | None, begun: float) -> None:
        with ThreadPoolExecutor(max_workers=self.settings.concurrency, thread_name_prefix="bench") as pool:
            futures = [pool.submit(self.play, run, turns, outcome, begun) for run in range(count)]
            try:
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                for future in done:
                    if future.exception() is not None and not isinstance(future.exception(), _Stopped):
                        self.stop.set()
                        raise future.exception()  # type: ignore[misc]
            except BaseException:
                self.stop.set()
                raise

    def delete_runs(self) -> list[str]:
        """Delete every run this bench opened; the ids of those that could not be deleted."""
        left = []
        for run_id in self.opened:
            try:
                self.client.delete_run(run_id=run_id)
            except SidecarCallError:
                left.append(run_id)
        return left


def probe(client: Client, target: str) -> None:
    """A health Check: is anything serving at the target?"""
    try:
        answer = client.check_health()
    except SidecarCallError as error:
        raise BenchError(f"no sidecar answers at {target}: {error.code.name}: {error.message}") from error
    if answer.status != answer.SERVING:
        raise BenchError(f"the sidecar at {target} is not serving (health {answer.ServingStatus.Name(answer.status)})")


def run_bench(settings: BenchSettings, progress: Callable[[str, int], Callable[[], None]] | None = None,
              done: Callable[[], None] | None = None) -> Outcome:
    """The whole bench: probe, warm-up, the measured runs, then their runs deleted (unless
    ``keep_runs``). ``progress(label, total)`` returns the per-turn callback of a phase;
    ``done()`` closes it. KeyboardInterrupt stops the runs and returns what was measured,
    ``interrupted`` set."""
    outcome = Outcome(settings, datetime.now(UTC).isoformat(timespec="seconds"))
    client = Client(settings.target, settings.token, timeout=settings.timeout, retries=0, tls=settings.tls)
    ticks: list[Callable[[], None]] = [lambda: None]
    driver = Driver(settings, client, lambda: ticks[0]())
    try:
        probe(client, settings.target)
        phases = ([("warm-up", min(settings.concurrency, settings.runs), settings.warmup, None)]
                  if settings.warmup else []) + [("turns", settings.runs, settings.turns, outcome)]
        for label, count, turns, kept in phases:
            if progress:
                ticks[0] = progress(label, count * turns)
            begun = time.perf_counter()
            try:
                driver.play_all(count, turns, kept, begun)
            finally:
                if kept is not None:
                    outcome.seconds = time.perf_counter() - begun
                if done:
                    done()
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        outcome.run_ids = [run_id for run_id in driver.opened if "-run-" in run_id]
        if not settings.keep_runs:
            driver.delete_runs()
        client.close()
    outcome.samples.sort(key=lambda sample: sample.at_s)
    outcome.turns.sort(key=lambda turn: (turn.run, turn.turn))
    return outcome
