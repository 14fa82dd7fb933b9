"""Cache economics: what each window policy makes a provider bill, turn after turn, over long runs.

Against real sidecar processes (one per policy, all running at once), the same long runs are
played turn by turn, the policies in a rotating order each turn so a shared machine's drift hits
them alike. Each turn appends the host's new events and asks for the Anthropic rendering (the
timed call: the per-turn latency), then re-assembles the same iteration rendered for OpenAI
(read only, not timed). The shapes of run, each turn one request, the one that asks for the
turn's answer:

- chat: the previous answer (~200 o200k tokens) and the user's message (~100);
- tools: the previous answer, the user's message, an assistant tool call, and its result of
  200-4,000 tokens (uniform), under a ~2k-token system prompt and 40 tools (~6k tokens);
- mixed: as tools, but a third of the results are under 40 tokens (a cleared placeholder would
  be no smaller) and one in twenty 5,000-8,000;
- agent: an agent loop of many small turns, shaped like real tool-heavy runs: each turn the
  model's tool call or two (sometimes with a short note) and their results, a user message every
  ~15 turns; a third of the results under 40 tokens, most a few hundred, 2.5% of 5,000-7,000
  (median turn ~210 tokens as the sidecar counts it, untrusted fences included).

Summaries: off; host (when the answer says compaction is due, a deterministic fake summariser
records a summary of the candidates through RecordSummary); or built-in ([context] summariser =
"extractive"). Policies: ``max_fill`` (today's rule, clearing off) and ``cache_stable`` at each
``--trim-fractions`` value (tool-result clearing on unless ``--clearing off``). Each setting is
passed as CONTEXT_SIDECAR_<SECTION>_<KEY>; a setting the sidecar does not know is dropped (said
in the output), and a policy that needs it is skipped.

The cache figures are recounted from consecutive rendered bodies (benchmarks/_lib/prompt_cache.py),
never taken from the sidecar's own ``cache`` report. Per run and policy: the identical-prefix
and cached shares of the tokens sent (mean and p10, from turn 2), the mean fill of the transcript
budget and its p10 and the share of the last 10 turns' events in the window (both once the
run's events exceed the budget), summaries and clearings per 100 turns (the run's log entries),
the p50 of the timed AssembleContext, and the billed input per turn in base-price tokens with
Anthropic's and OpenAI's ratios; then the turns that clear tool results (whose request feeds a
cleared placeholder for the first time): their cached shares and their part of the Anthropic
bill; and the sidecar's own ``cache.stable_prefix_tokens`` over the identical prefix modelled
here, the one place the report is read, to check it. Then the issues' aims as ratios measured
here, and a PNG plot of the billed input per turn (needs matplotlib: ``pip install -e
'.[bench]'``). ``--tree`` runs another source tree's sidecar (fastcore compiled in place), so a
branch is measured beside main's.

With ``--idle-every N`` the host pauses before every Nth turn for longer than the providers keep
a cache entry (the models' entries expire), and each cache-stable policy is also played
``+cold``: its sidecar told the caches last 1 s, it takes the pending big steps on the turn after
a pause (docs/transcript.md, "When the cache is cold").

    python -m benchmarks.bench_cache_economics [--turns 1000] [--budgets 8000,32000]
        [--shapes chat,tools,mixed,agent] [--modes off,host,builtin] [--trim-fractions 0.6]
        [--clearing on] [--plot PATH] [--no-sync] [--idle-every 0] [--idle-seconds 1.5] [--tree PATH]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean

import grpc
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc

from benchmarks._lib import corpus
from benchmarks._lib.harness import Samples, add_smoke_flag, sidecar_process, smoke
from benchmarks._lib.prompt_cache import AnthropicCache, OpenAICache, TokenCache, anthropic_blocks, openai_blocks
from benchmarks._lib.workload import TOOLS, profile
from sidecar.settings import ConfigError, env_name, load_settings
from sidecar.text.encodings import load_encoding

SHAPES = ("chat", "tools", "mixed", "agent")
MODES = ("off", "host", "builtin")
MODE_FLAGS = {"off": ["--no-summarization"], "host": ["--summarization", "--summariser", "none"],
              "builtin": ["--summarization", "--summariser", "extractive"]}
MODE_NAMES = {"off": "off", "host": "host", "builtin": "built-in"}
USER_WORDS = 90  # ~100 o200k tokens: with a ~200-token answer, ~300 a chat turn
TOOL_RESULT_TOKENS = (200, 4000)
SMALL_RESULT_TOKENS, LARGE_RESULT_TOKENS = (5, 39), (5000, 8000)  # the "mixed" shape's other results
ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
CLEARED_PLACEHOLDER = "[tool result cleared to save context: "  # how a cleared result is fed
# The agent shape's tool results: a third tiny, most log-uniform over a few hundred, a few huge.
AGENT_TINY_RESULT, AGENT_RESULT, AGENT_HUGE_RESULT = (3, 39), (50, 1000), (5000, 7000)
AGENT_HUGE_SHARE, AGENT_TINY_SHARE = 0.025, 1 / 3
DEFAULT_TRIM_FRACTION = 0.6  # [context] trim_to_fraction's default: the aims are the defaults'
COLD_TTL_SECONDS = 1  # the +cold policies' [render] *_cache_ttl_seconds: a turn's gap is far shorter, a pause longer
# Summaries per 100 turns at an 800-token budget on main before issue 10 (max_fill, the nagging
# signal), measured with: python -m benchmarks.bench_cache_economics --turns 300 --budgets 800
# --modes host,builtin --trim-fractions 0.6 (shape -> mode -> figure).
MAIN_SUMMARIES_PER_100_AT_800 = {"chat": {"host": 99.0, "builtin": 99.0}, "tools": {"host": 99.0, "builtin": 99.0}}


@dataclass(frozen=True)
class Policy:
    label: str
    settings: dict[tuple[str, str], str]  # (section, key) -> value, passed as CONTEXT_SIDECAR_<SECTION>_<KEY>
    required: frozenset[tuple[str, str]]  # without these the sidecar would not run this policy


@dataclass
class Tally:
    """One policy's figures over one run."""

    policy: str
    shape: str
    budget: int
    mode: str
    latency: Samples = field(default_factory=Samples)
    identical: list[float] = field(default_factory=list)  # identical-prefix share (OpenAI rendering)
    cached_anthropic: list[float] = field(default_factory=list)
    cached_openai: list[float] = field(default_factory=list)
    billed_anthropic: list[float] = field(default_factory=list)
    billed_openai: list[float] = field(default_factory=list)
    fill: list[float] = field(default_factory=list)  # once the run's events exceed the budget
    recent: list[float] = field(default_factory=list)  # share of the last 10 turns' events in the window, as fill
    turn_tokens: list[int] = field(default_factory=list)  # each turn's appended tokens, as the sidecar counts them
    summaries: int = 0
    clearings: int = 0
    refused_summaries: list[str] = field(default_factory=list)
    # The turns whose request feeds a tool result as its cleared placeholder for the first time.
    clearing_cached_anthropic: list[float] = field(default_factory=list)
    clearing_cached_openai: list[float] = field(default_factory=list)
    clearing_billed_anthropic: list[float] = field(default_factory=list)
    # The sidecar's own prediction (cache.stable_prefix_tokens) over the identical prefix modelled
    # here, on the turns where both are positive (Anthropic form, the one the turn asks for; a
    # re-assembly in another form is measured against the previous request in the first form)
    predicted_over_modelled: list[float] = field(default_factory=list)

    @property
    def scenario(self) -> tuple[str, int, str]:
        return self.shape, self.budget, self.mode


def p10(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[int(len(ordered) * 0.1)] if ordered else float("nan")


def mean(values: Sequence[float]) -> float:
    return fmean(values) if values else float("nan")


# The runs -----------------------------------------------------------------------------------------

def tool_result(rng: random.Random, encoding, target: int) -> str:
    """JSON and code of exactly ``target`` o200k tokens."""
    pieces, tokens = [], 0
    while tokens < target:
        piece = rng.choice((corpus.json_document, corpus.code))(rng)
        pieces.append(piece)
        tokens += len(encoding.encode_ordinary(piece)) + 1
    return encoding.decode(encoding.encode_ordinary("\n".join(pieces))[:target])


def result_tokens(shape: str, rng: random.Random) -> int:
    """A tool result's size: "tools" 200-4,000 tokens; "mixed" a third under 40 tokens (too small
    for a placeholder to save anything), one in twenty over 5,000, the rest 200-4,000."""
    if shape == "mixed":
        draw = rng.random()
        if draw < 1 / 3:
            return rng.randint(*SMALL_RESULT_TOKENS)
        if draw < 1 / 3 + 1 / 20:
            return rng.randint(*LARGE_RESULT_TOKENS)
    return rng.randint(*TOOL_RESULT_TOKENS)


def agent_result_tokens(rng: random.Random) -> int:
    draw = rng.random()
    if draw < AGENT_HUGE_SHARE:
        return rng.randint(*AGENT_HUGE_RESULT)
    if draw < AGENT_HUGE_SHARE + AGENT_TINY_SHARE:
        return rng.randint(*AGENT_TINY_RESULT)
    low, high = AGENT_RESULT
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def agent_turns(count: int, encoding) -> list[list[pb.Event]]:
    """The agent shape: the model's tool calls (a short note before them at times) and their
    results each turn, a user message every ~15 turns."""
    rng = random.Random(f"agent-{count}")
    turns = []
    for turn in range(1, count + 1):
        events = []
        if turn == 1 or rng.random() < 1 / 15:
            words = rng.randint(15, 60)
            events.append(pb.Event(event_id=f"u{turn}", role="user",
                                   content=" ".join(corpus.prose(rng).split()[:words])))
        if rng.random() < 0.3:
            events.append(pb.Event(event_id=f"n{turn}", role="assistant",
                                   content=" ".join(corpus.prose(rng).split()[:rng.randint(10, 50)])))
        for call in range(2 if rng.random() < 0.15 else 1):
            call_id = f"call-{turn}-{call}"
            arguments = f'{{"query": "{" ".join(rng.sample(corpus._WORDS, rng.randint(2, 8)))}", ' \
                        f'"limit": {rng.randrange(5, 50)}}}'
            events.append(pb.Event(event_id=f"c{turn}-{call}", role="assistant", type="tool_call", call_id=call_id,
                                   tool_name=f"tool_{rng.randrange(TOOLS):02d}", content=arguments))
            events.append(pb.Event(event_id=f"r{turn}-{call}", role="tool", type="tool_result", call_id=call_id,
                                   content=tool_result(rng, encoding, agent_result_tokens(rng))))
        turns.append(events)
    return turns


def turns_of(shape: str, count: int, encoding) -> list[list[pb.Event]]:
    """Each turn's new events (iteration 0: the one being assembled), the same for every policy."""
    if shape == "agent":
        return agent_turns(count, encoding)
    rng = random.Random(f"{shape}-{count}")
    turns, answer = [], None
    for turn in range(1, count + 1):
        events = [answer] if answer else []
        user = " ".join(corpus.prose(rng).split()[:USER_WORDS])
        events.append(pb.Event(event_id=f"u{turn}", role="user", content=user))
        if shape in ("tools", "mixed"):
            # A provider's call ids are long (Anthropic's "toolu_01" and 22 more): in every placeholder.
            call_id = f"call-{turn}" if shape == "tools" else "toolu_01" + "".join(rng.choices(ID_CHARS, k=22))
            arguments = f'{{"query": "{" ".join(rng.sample(corpus._WORDS, 6))}", "limit": {rng.randrange(5, 50)}}}'
            events.append(pb.Event(event_id=f"c{turn}", role="assistant", type="tool_call", call_id=call_id,
                                   tool_name=f"tool_{rng.randrange(TOOLS):02d}", content=arguments))
            events.append(pb.Event(event_id=f"r{turn}", role="tool", type="tool_result", call_id=call_id,
                                   content=tool_result(rng, encoding, result_tokens(shape, rng))))
        turns.append(events)
        # The model's answer to this turn's request reaches the sidecar with the next turn's events.
        answer = pb.Event(event_id=f"a{turn}", role="assistant", content=rng.choice((corpus.prose, corpus.code))(rng))
    return turns


def fake_summary(index: int, candidates: Sequence[str], tokens_before: int) -> str:
    """A host's summary, deterministic: about an eighth of what it replaces, 30 to 400 words."""
    rng = random.Random(index)
    words = max(30, min(400, tokens_before // 8))
    return (f"Summary {index} of {len(candidates)} earlier entries ({tokens_before} tokens): "
            + " ".join(rng.choice(corpus._WORDS) for _ in range(words)) + ".")


class Player:
    """One policy's sidecar playing one run, turn by turn, with the provider caches it would meet."""

    def __init__(self, stub: pb_grpc.ContextSidecarStub, tally: Tally, tokens: TokenCache,
                 run_profile: pb.Profile, task: pb.Task) -> None:
        self.stub, self.tally, self.tokens = stub, tally, tokens
        self.run_id = f"{tally.shape}-{tally.budget}"
        self.anthropic, self.openai = AnthropicCache(), OpenAICache()
        self.appended_tokens = 0
        self.cleared = 0  # tool results the last request fed as their placeholder
        self.turn_ids: list[list[str]] = []  # each turn's events, oldest turn first
        stub.OpenRun(pb.OpenRunRequest(run_id=self.run_id, transcript_token_budget=tally.budget,
                                       summarization_supported=tally.mode != "off", profile=run_profile, task=task))

    def play(self, iteration: int, events: list[pb.Event]) -> None:
        tally = self.tally
        begin = time.perf_counter()
        answer = self.stub.AssembleContext(pb.AssembleContextRequest(
            run_id=self.run_id, iteration=iteration, append_events=events, render="anthropic_messages"))
        tally.latency.seconds.append(time.perf_counter() - begin)
        openai = self.stub.AssembleContext(pb.AssembleContextRequest(
            run_id=self.run_id, iteration=iteration, render="openai_responses"))
        appended = sum(result.tokens for result in answer.appended)
        self.appended_tokens += appended
        tally.turn_tokens.append(appended)
        self.turn_ids.append([event.event_id for event in events])
        if self.appended_tokens > answer.token_budget:
            tally.fill.append(answer.token_count / answer.token_budget)
            recent = [event_id for ids in self.turn_ids[-10:] for event_id in ids]
            fed = set(answer.event_ids)
            tally.recent.append(sum(event_id in fed for event_id in recent) / len(recent))
        anthropic_bill = self.anthropic.bill(anthropic_blocks(answer.rendered, self.tokens))
        openai_bill = self.openai.bill(openai_blocks(openai.rendered, self.tokens))
        tally.billed_anthropic.append(anthropic_bill.billed)
        tally.billed_openai.append(openai_bill.billed)
        if iteration > 1:  # the first request has no previous one to share a prefix with
            tally.identical.append(openai_bill.identical_share)
            tally.cached_anthropic.append(anthropic_bill.cached_share)
            tally.cached_openai.append(openai_bill.cached_share)
        if anthropic_bill.identical_prefix and answer.cache.stable_prefix_tokens:
            tally.predicted_over_modelled.append(answer.cache.stable_prefix_tokens / anthropic_bill.identical_prefix)
        cleared = openai.rendered.count(CLEARED_PLACEHOLDER)
        if cleared > self.cleared:
            tally.clearing_cached_anthropic.append(anthropic_bill.cached_share)
            tally.clearing_cached_openai.append(openai_bill.cached_share)
            tally.clearing_billed_anthropic.append(anthropic_bill.billed)
        self.cleared = cleared
        due = answer.compaction
        if tally.mode == "host" and due.due and due.candidate_event_ids:
            try:
                self.stub.RecordSummary(pb.RecordSummaryRequest(
                    run_id=self.run_id, iteration=iteration + 1, replaced_event_ids=due.candidate_event_ids,
                    summary_text=fake_summary(iteration, due.candidate_event_ids, due.tokens_before)))
            except grpc.RpcError as error:
                tally.refused_summaries.append(f"turn {iteration}: {error.code().name}: {error.details()}")

    def expire(self) -> None:
        """The run paused longer than the providers keep a cache entry."""
        self.anthropic.expire()
        self.openai.expire()

    def count_log_entries(self) -> None:
        """Summaries and clearings, from the run's own log: one context.summarized or context.cleared each."""
        from_seq = 0
        while True:
            page = self.stub.ListRunEvents(pb.ListRunEventsRequest(run_id=self.run_id, from_seq=from_seq, limit=1000))
            for event in page.events:
                self.tally.summaries += event.type == "context.summarized"
                self.tally.clearings += event.type == "context.cleared"
            if len(page.events) < 1000:
                return
            from_seq = page.events[-1].seq + 1


# Policies and the settings the sidecar knows ------------------------------------------------------

def policies(trim_fractions: Sequence[float], clearing: Sequence[str], cold_ttl: int = 0) -> list[Policy]:
    """The policies to play; with ``cold_ttl`` (seconds), each cache-stable one also as "+cold": its
    sidecar told the providers' caches last that long, so a pause past it is a cold turn."""
    window_policy, trim, clear = ("context", "window_policy"), ("context", "trim_to_fraction"), \
        ("context.clearing", "enabled")
    ttls = (("render", "anthropic_cache_ttl_seconds"), ("render", "openai_cache_ttl_seconds"))
    chosen = [Policy("max_fill", {window_policy: "max_fill", clear: "false"}, frozenset())]
    for fraction in trim_fractions:
        for state in clearing:
            label = f"cache_stable {fraction:g}" + (" +clearing" if state == "on" else "")
            settings = {window_policy: "cache_stable", trim: f"{fraction:g}",
                        clear: "true" if state == "on" else "false"}
            required = frozenset({window_policy, trim} | ({clear} if state == "on" else set()))
            chosen.append(Policy(label, settings, required))
            if cold_ttl:
                chosen.append(Policy(label + " +cold", {**settings, **{ttl: str(cold_ttl) for ttl in ttls}},
                                     required | frozenset(ttls)))
    return chosen


def unknown_settings(settings: dict[tuple[str, str], str]) -> set[tuple[str, str]]:
    """The settings this sidecar refuses as unknown, found by its own loader (any other refusal stops)."""
    unknown = set()
    for (section, key), value in settings.items():
        name = env_name(section, key)
        try:
            load_settings(env={name: value})
        except ConfigError as error:
            if "names no setting" not in str(error):
                raise SystemExit(f"the sidecar refuses {name}={value}: {error}") from None
            unknown.add((section, key))
    return unknown


# The table, the aims, the plot ----------------------------------------------------------------------

def _ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}" if baseline else "-"


def print_table(tallies: list[Tally]) -> None:
    print("| shape | budget | summaries | policy | identical prefix mean / p10 | cached A mean / p10 | "
          "cached O mean / p10 | fill mean / p10 | last 10 turns | summaries /100 | clearings /100 | p50 us | "
          "billed A /turn | A / max_fill | billed O /turn | O / max_fill |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    baselines = {t.scenario: t for t in tallies if t.policy == "max_fill"}
    for t in tallies:
        base = baselines.get(t.scenario)
        turns = len(t.billed_anthropic)
        billed_a, billed_o = mean(t.billed_anthropic), mean(t.billed_openai)
        print(f"| {t.shape} | {t.budget} | {MODE_NAMES[t.mode]} | {t.policy} | "
              f"{mean(t.identical):.2f} / {p10(t.identical):.2f} | "
              f"{mean(t.cached_anthropic):.2f} / {p10(t.cached_anthropic):.2f} | "
              f"{mean(t.cached_openai):.2f} / {p10(t.cached_openai):.2f} | {mean(t.fill):.2f} / {p10(t.fill):.2f} | "
              f"{mean(t.recent):.2f} | "
              f"{100 * t.summaries / turns:.1f} | {100 * t.clearings / turns:.1f} | {t.latency.p50:,.0f} | "
              f"{billed_a:,.0f} | {_ratio(billed_a, mean(base.billed_anthropic)) if base else '-'} | "
              f"{billed_o:,.0f} | {_ratio(billed_o, mean(base.billed_openai)) if base else '-'} |")


def print_clearing_turns(tallies: list[Tally]) -> None:
    """The turns that clear tool results: what their requests read from the cache, and their share
    of the Anthropic bill."""
    cleared = [t for t in tallies if t.clearing_billed_anthropic]
    if not cleared:
        return
    print("\nClearing turns (a request that feeds a cleared placeholder for the first time):\n")
    print("| shape | budget | summaries | policy | turns | cached A mean | cached O mean | share of A's bill |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for t in cleared:
        print(f"| {t.shape} | {t.budget} | {MODE_NAMES[t.mode]} | {t.policy} | {len(t.clearing_billed_anthropic)} | "
              f"{mean(t.clearing_cached_anthropic):.2f} | {mean(t.clearing_cached_openai):.2f} | "
              f"{sum(t.clearing_billed_anthropic) / sum(t.billed_anthropic):.2f} |")


def print_predictions(tallies: list[Tally]) -> None:
    """How the sidecar's cache report compares with the modelled provider's count."""
    print("\nThe sidecar's cache.stable_prefix_tokens over the identical prefix modelled here (Anthropic form, o200k, "
          "4 tokens a block), mean / p10:\n")
    for t in tallies:
        if t.predicted_over_modelled:
            print(f"- {t.shape} {t.budget} {MODE_NAMES[t.mode]} {t.policy}: {mean(t.predicted_over_modelled):.2f} / "
                  f"{p10(t.predicted_over_modelled):.2f}")


def print_aims(tallies: list[Tally], default_fraction: float) -> None:
    """The issue's aims, each as the ratio this run measured."""
    stable = f"cache_stable {default_fraction:g}"
    by = {(t.scenario, t.policy): t for t in tallies}
    budgets = sorted({t.budget for t in tallies})
    aim_budget = 32000 if 32000 in budgets else budgets[-1]
    print(f"\nAims (issue 10, section 6) at a {aim_budget} budget"
          + ("" if aim_budget == 32000 else " (the issue's are at 32000: this run has no 32000 budget)") + ":")

    def line(passed: bool, text: str) -> None:
        print(f"- {'pass' if passed else 'MISS'}: {text}")

    def pair(shape: str, mode: str, label: str) -> tuple[Tally | None, Tally | None]:
        scenario = (shape, aim_budget, mode)
        return by.get((scenario, label)), by.get((scenario, "max_fill"))

    # Clearing changes nothing without tool results: the chat aim takes cache_stable with or without it.
    for shape, labels, share_aim, billed_aim in (("chat", (stable, stable + " +clearing"), 0.90, 0.20),
                                                 ("tools", (stable + " +clearing",), 0.85, 0.30)):
        label = next((label for label in labels if by.get(((shape, aim_budget, "off"), label))), labels[-1])
        policy, base = pair(shape, "off", label)
        if policy is None or base is None:
            print(f"- not measured: {shape}, summaries off, {label} beside max_fill")
            continue
        ratio = mean(policy.billed_anthropic) / mean(base.billed_anthropic)
        cached = min(mean(policy.cached_anthropic), mean(policy.cached_openai))
        line(cached >= share_aim, f"{shape}, {label}: cached share {mean(policy.cached_anthropic):.2f} (Anthropic) / "
                                  f"{mean(policy.cached_openai):.2f} (OpenAI), aim >= {share_aim:.2f}")
        line(ratio <= billed_aim, f"{shape}, {label}: billed input per turn {ratio:.2f} of max_fill's (Anthropic), "
                                  f"aim <= {billed_aim:.2f}")
    for t in tallies:
        if t.budget == aim_budget and t.mode != "off" and t.policy.startswith(stable):
            cached = min(mean(t.cached_anthropic), mean(t.cached_openai))
            line(cached >= 0.80, f"{t.shape}, {MODE_NAMES[t.mode]} summaries, {t.policy}: cached share "
                                 f"{mean(t.cached_anthropic):.2f} (Anthropic) / {mean(t.cached_openai):.2f} (OpenAI), "
                                 "aim >= 0.80")
    for t in tallies:
        if t.budget == aim_budget and t.policy.startswith("cache_stable"):
            base = by.get((t.scenario, "max_fill"))
            fill_note = f"mean fill {mean(t.fill):.2f}" if t.fill else "the run never filled its budget"
            if t.fill and t.mode == "off":
                line(mean(t.fill) >= 0.6,
                     f"{t.shape}, summaries off, {t.policy}: {fill_note} of the budget, aim >= 0.60")
            if base is not None:
                ratio = t.latency.p50 / base.latency.p50
                line(ratio <= 1.1, f"{t.shape}, summaries {MODE_NAMES[t.mode]}, {t.policy}: AssembleContext p50 "
                                   f"{ratio:.2f}x max_fill's, aim <= 1.10")
    print_agent_aims(tallies, stable + " +clearing")
    for t in tallies:
        if t.budget == 800 and t.mode != "off" and t.policy.startswith(stable):
            today = MAIN_SUMMARIES_PER_100_AT_800.get(t.shape, {}).get(t.mode)
            per_100 = 100 * t.summaries / len(t.billed_anthropic)
            if today:
                line(per_100 <= today / 3, f"{t.shape}, {MODE_NAMES[t.mode]} summaries at 800 tokens: {per_100:.1f} "
                                           f"per 100 turns, {per_100 / today:.2f} of main's {today:.1f}, aim <= 0.33")


def print_agent_aims(tallies: list[Tally], label: str) -> None:
    """Issue 23's aims on the agent shape, the default policy (``label``) at each budget and mode."""
    agent = [t for t in tallies if t.shape == "agent"]
    if not agent:
        return
    by = {(t.scenario, t.policy): t for t in agent}
    sizes = sorted(size for t in agent if t.policy == "max_fill" for size in t.turn_tokens) or \
        sorted(size for t in agent for size in t.turn_tokens)
    print(f"\nAims (issue 23) on the agent shape, {label} (turns of median {sizes[len(sizes) // 2]} tokens "
          f"as counted, p90 {sizes[int(len(sizes) * 0.9)]}):")

    def line(passed: bool, text: str) -> None:
        print(f"- {'pass' if passed else 'MISS'}: {text}")

    for t in agent:
        if t.policy != label:
            continue
        name = f"{t.budget}, summaries {MODE_NAMES[t.mode]}"
        line(mean(t.fill) >= 0.6 and p10(t.fill) >= 0.45,
             f"{name}: fill mean {mean(t.fill):.2f} / p10 {p10(t.fill):.2f}, aim >= 0.60 / 0.45")
        below_half = sum(share < 0.5 for share in t.recent)
        line(mean(t.recent) >= 0.9, f"{name}: the last 10 turns' events in the window {mean(t.recent):.2f} on "
                                    f"average, aim >= 0.90 (fewer than half of them on {below_half} turns)")
        line(min(mean(t.cached_anthropic), mean(t.cached_openai)) >= 0.85,
             f"{name}: cached share {mean(t.cached_anthropic):.2f} (Anthropic) / {mean(t.cached_openai):.2f} "
             "(OpenAI), aim >= 0.85")
        base = by.get((t.scenario, "max_fill"))
        if t.mode == "off" and base is not None:
            # The aim is for the policy without clearing; with it, said beside.
            for policy in dict.fromkeys((label.removesuffix(" +clearing"), label)):
                played = by.get((t.scenario, policy))
                if played is None:
                    continue
                ratio_a = mean(played.billed_anthropic) / mean(base.billed_anthropic)
                ratio_o = mean(played.billed_openai) / mean(base.billed_openai)
                line(max(ratio_a, ratio_o) <= 0.35, f"{name}: billed input of {policy} {ratio_a:.2f} (Anthropic) / "
                                                    f"{ratio_o:.2f} (OpenAI) of max_fill's, aim <= 0.35")
        print(f"- {name}: {100 * t.summaries / len(t.billed_anthropic):.1f} summaries per 100 turns")


SMOOTHING = 25  # turns a plotted point averages


def plot(tallies: list[Tally], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("\nno plot: matplotlib is not installed (pip install -e '.[bench]')")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def smoothed(values: Sequence[float]) -> list[float]:
        """The mean of the last SMOOTHING turns at each turn: a cache break is one turn's spike, and
        the raw lines of several policies would hide one another."""
        sums = [0.0, *itertools.accumulate(values)]
        return [(sums[i + 1] - sums[max(0, i + 1 - SMOOTHING)]) / min(i + 1, SMOOTHING) for i in range(len(values))]

    scenarios = list(dict.fromkeys(t.scenario for t in tallies))
    figure, axes = plt.subplots(len(scenarios), 1, figsize=(11, 3.2 * len(scenarios)), squeeze=False)
    colours = {label: f"C{i}" for i, label in enumerate(dict.fromkeys(t.policy for t in tallies))}
    for axis, scenario in zip(axes[:, 0], scenarios):
        for t in (t for t in tallies if t.scenario == scenario):
            turns = range(1, len(t.billed_anthropic) + 1)
            axis.plot(turns, smoothed(t.billed_anthropic), color=colours[t.policy], linewidth=1.2,
                      label=f"{t.policy}, Anthropic")
            axis.plot(turns, smoothed(t.billed_openai), color=colours[t.policy], linewidth=1.0, linestyle="--",
                      label=f"{t.policy}, OpenAI")
        shape, budget, mode = scenario
        axis.set_title(f"{shape}, transcript budget {budget}, summaries {MODE_NAMES[mode]} "
                       f"(mean of the last {SMOOTHING} turns)", fontsize=10)
        axis.set_ylabel("billed input tokens")
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=7, loc="upper left", ncol=2)
    axes[-1, 0].set_xlabel("turn")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    print(f"\nplot of the billed input per turn: {path}")


# The whole benchmark --------------------------------------------------------------------------------

def measure(args: argparse.Namespace) -> list[Tally]:
    budgets = [int(b) for b in args.budgets.split(",")]
    shapes = args.shapes.split(",")
    modes = args.modes.split(",")
    for name, values, allowed in (("shapes", shapes, SHAPES), ("modes", modes, MODES)):
        if set(values) - set(allowed):
            raise SystemExit(f"--{name}: expected some of {', '.join(allowed)}, got {','.join(values)}")
    fractions = [float(f) for f in args.trim_fractions.split(",")]
    chosen = []
    if args.idle_every and args.idle_seconds <= COLD_TTL_SECONDS:
        raise SystemExit(f"--idle-seconds must pass the +cold sidecars' TTL of {COLD_TTL_SECONDS} s")
    cold_ttl = COLD_TTL_SECONDS if args.idle_every else 0
    for policy in policies(fractions, ["on", "off"] if args.clearing == "both" else [args.clearing], cold_ttl):
        unknown = unknown_settings(policy.settings)
        missing = unknown & policy.required
        names = ", ".join(sorted(env_name(*setting) for setting in unknown))
        if missing:
            print(f"skipped {policy.label}: this sidecar does not know {names}")
            continue
        if unknown:
            print(f"{policy.label}: this sidecar does not know {names}: run without (its behaviour is this policy's)")
        chosen.append(Policy(policy.label, {k: v for k, v in policy.settings.items() if k not in unknown},
                             policy.required))
    encoding = load_encoding("o200k_base")
    tokens = TokenCache(encoding)
    rng = random.Random(9)
    run_profile = profile(rng)
    task = pb.Task(task_id="bench-task", goal=corpus.prose(rng)[:300], acceptance_criteria=["cited", "tested"],
                   plan="\n".join(f"{i}. {corpus.prose(rng)[:100]}" for i in range(1, 8)))
    flags = ["--token-counter", "o200k_base", "--transcript-token-budget", str(max(budgets)),
             *(["--no-sync"] if args.no_sync else [])]
    tallies: list[Tally] = []
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        for mode in modes:
            with ExitStack() as stack:
                stubs = {}
                for index, policy in enumerate(chosen):
                    env = {env_name(*setting): value for setting, value in policy.settings.items()}
                    channel = stack.enter_context(sidecar_process(Path(tmp) / f"{mode}-{index}",
                                                                  flags + MODE_FLAGS[mode], env, args.tree))
                    stubs[policy.label] = pb_grpc.ContextSidecarStub(channel)
                for shape in shapes:
                    turns = turns_of(shape, args.turns, encoding)
                    for budget in budgets:
                        begin = time.perf_counter()
                        players = [Player(stub, Tally(label, shape, budget, mode), tokens, run_profile, task)
                                   for label, stub in stubs.items()]
                        for iteration, events in enumerate(turns, start=1):
                            if args.idle_every and iteration > 1 and iteration % args.idle_every == 0:
                                # The host pauses for longer than the providers keep a cache entry.
                                time.sleep(args.idle_seconds)
                                for player in players:
                                    player.expire()
                            offset = iteration % len(players)
                            for player in players[offset:] + players[:offset]:
                                player.play(iteration, events)
                        for player in players:
                            player.count_log_entries()
                            tallies.append(player.tally)
                        print(f"{shape}, budget {budget}, summaries {MODE_NAMES[mode]}: {args.turns} turns of "
                              f"{len(players)} policies in {time.perf_counter() - begin:,.0f} s", file=sys.stderr,
                              flush=True)
                    tokens.clear()  # the next shape shares no text with this one
    return tallies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000, help="turns of each run")
    parser.add_argument("--budgets", default="8000,32000", help="transcript token budgets, comma-separated")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="chat, tools, mixed, agent")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="summaries: off, host (RecordSummary when due), builtin (the extractive summariser)")
    parser.add_argument("--trim-fractions", default="0.6",
                        help="cache_stable is run at each [context] trim_to_fraction, e.g. 0.5,0.6,0.7,0.8")
    parser.add_argument("--clearing", choices=("on", "off", "both"), default="on",
                        help="[context.clearing] enabled under cache_stable (max_fill always runs without)")
    parser.add_argument("--plot", type=Path, default=Path(tempfile.gettempdir()) / "cache_economics.png")
    parser.add_argument("--no-sync", action="store_true", help="run the sidecars with --no-sync")
    parser.add_argument("--idle-every", type=int, default=0,
                        help="pause before every Nth turn for longer than the providers keep a cache entry (the "
                             "cache models expire); each cache-stable policy is also played +cold, its sidecar told "
                             "the caches last 1 s, so it takes the pending steps then. 0: no pauses")
    parser.add_argument("--idle-seconds", type=float, default=1.5,
                        help="how long a pause of --idle-every lasts (it stands for one past the providers' TTL)")
    parser.add_argument("--tree", type=Path, default=None,
                        help="run the sidecar of this source tree (fastcore compiled in place), e.g. main's")
    add_smoke_flag(parser)
    args = smoke(parser.parse_args(), turns=4, budgets="8000", shapes="tools,agent", modes="host,builtin")
    started = time.perf_counter()
    tallies = measure(args)
    elapsed = time.perf_counter() - started
    print(f"\n{args.turns} turns a run; billed input in base-price tokens a turn (Anthropic: read 0.1, write 1.25, "
          f"breakpoints as rendered; OpenAI: cached 0.1 from 1,024 tokens in 128-token steps); shares from turn 2; "
          f"fill once the run's events exceed the budget; p50 of the AssembleContext that appends and renders\n")
    print_table(tallies)
    print_clearing_turns(tallies)
    print_predictions(tallies)
    for t in tallies:
        if t.refused_summaries:
            print(f"\n{t.shape} {t.budget} {t.policy}: {len(t.refused_summaries)} RecordSummary refused, first: "
                  f"{t.refused_summaries[0]}")
    fractions = [float(fraction) for fraction in args.trim_fractions.split(",")]
    print_aims(tallies, DEFAULT_TRIM_FRACTION if DEFAULT_TRIM_FRACTION in fractions else fractions[0])
    plot(tallies, args.plot)
    print(f"\nmeasured in {elapsed:,.0f} s")


if __name__ == "__main__":
    main()
