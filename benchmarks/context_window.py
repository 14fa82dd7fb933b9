"""AssembleContext with a full profile and a provider rendering, against the bare RPC.

A real sidecar process; two runs with the same transcript of ~200-token events (user prose, a
tool call with JSON arguments, its result, the answer): one with no profile, one with a full
profile (a ~2k-token system prompt, 40 tools with JSON schemas, participants, three remote
agents, a skills index, a task with a plan, one loaded skill). Then, round by round, every call
once in a rotating order:

- bare: a health Check, the floor under any RPC;
- transcript only: re-assembling an iteration of the run without a profile (the window alone);
- sections: the same iteration of the full run (sections, prefix hash, accounting);
- openai / anthropic: the same, rendered as that provider's request body;
- turn + openai: a new iteration appending one event (count, durable commit, persist), rendered.

    python -m benchmarks.context_window [--rounds 300] [--budget 8000] [--turns 60]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import corpus
from benchmarks.harness import interleaved, sidecar_process
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.pb.contextsidecar.v1 import sidecar_pb2_grpc as pb_grpc

TOOLS = 40


def profile(rng: random.Random) -> pb.Profile:
    prompt = "\n\n".join(corpus.prose(rng) for _ in range(10))  # ~2k tokens
    tools = []
    for i in range(TOOLS):
        params = {f"{rng.choice(corpus._NAMES)}_{k}": {"type": rng.choice(("string", "integer", "boolean")),
                                                       "description": corpus.prose(rng)[:80]}
                  for k in range(rng.randrange(2, 6))}
        tools.append(pb.ToolDefinition(name=f"tool_{i:02d}", description=corpus.prose(rng)[:160],
                                       parameters_json=json.dumps({"type": "object", "properties": params,
                                                                   "required": list(params)[:1]})))
    return pb.Profile(
        system_prompt=prompt, tools=tools,
        participants=[pb.Participant(role=r, description=corpus.prose(rng)[:120]) for r in ("planner", "executor")],
        agents=[pb.RemoteAgent(id=f"agent-{i}", name=f"Agent {i}", description=corpus.prose(rng)[:200],
                               skills=["search", "summarise"]) for i in range(3)],
        skills=[pb.SkillSummary(name=f"skill-{i}", description=corpus.prose(rng)[:100]) for i in range(5)])


def events(turns: int) -> list[pb.Event]:
    out = []
    for e in corpus.events(turns * corpus.EVENTS_PER_TURN, seed=5):
        tool_name = "tool_00" if e.type == "tool_call" else ""
        out.append(pb.Event(event_id=e.event_id, iteration=e.iteration, role=e.role, type=e.type, content=e.content,
                            call_id=e.call_id, tool_name=tool_name))
    return out


def measure(rounds: int, budget: int, turns: int) -> None:
    rng = random.Random(9)
    full_profile = profile(rng)
    task = pb.Task(task_id="bench-task", goal=corpus.prose(rng)[:300], acceptance_criteria=["cited", "tested"],
                   plan="\n".join(f"{i}. {corpus.prose(rng)[:100]}" for i in range(1, 8)))
    log = events(turns)
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        with sidecar_process(Path(tmp) / "lmdb", ["--token-counter", "o200k_base",
                                                  "--transcript-token-budget", str(budget)]) as channel:
            stub = pb_grpc.ContextSidecarStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            stub.OpenRun(pb.OpenRunRequest(run_id="plain"))
            stub.OpenRun(pb.OpenRunRequest(run_id="full", profile=full_profile, task=task))
            stub.LoadSkill(pb.LoadSkillRequest(run_id="full", skill=pb.LoadedSkill(
                name="skill-0", body="\n".join(corpus.prose(rng) for _ in range(2)))))
            for run in ("plain", "full"):
                for first in range(0, len(log), 400):
                    stub.AppendEvents(pb.AppendEventsRequest(run_id=run, events=log[first:first + 400]))
                stub.AssembleContext(pb.AssembleContextRequest(run_id=run, iteration=turns))
            state = {"iteration": turns + 1}
            new_contents = corpus.contents(rounds + 64, seed=13)

            def turn() -> None:
                iteration = state["iteration"]
                stub.AssembleContext(pb.AssembleContextRequest(
                    run_id="full", iteration=iteration, render="openai_responses", append_events=[
                        pb.Event(event_id=f"t{iteration}", role="user",
                                 content=new_contents[iteration % len(new_contents)])]))
                state["iteration"] += 1

            def assemble(run: str, render: str = ""):
                request = pb.AssembleContextRequest(run_id=run, iteration=turns, render=render)
                return lambda: stub.AssembleContext(request)

            shown = stub.AssembleContext(pb.AssembleContextRequest(run_id="full", iteration=turns))
            rendered = stub.AssembleContext(pb.AssembleContextRequest(run_id="full", iteration=turns,
                                                                      render="openai_responses"))
            calls = {"bare": lambda: health.Check(health_pb2.HealthCheckRequest()),
                     "plain": assemble("plain"), "sections": assemble("full"),
                     "openai": assemble("full", "openai_responses"),
                     "anthropic": assemble("full", "anthropic_messages"),
                     "turn": turn}
            samples = interleaved(calls, rounds)

    static = sum(s.tokens for s in shown.sections if s.stability == "static")
    print(f"\n{rounds} interleaved rounds; transcript budget {budget}; window of iteration {turns}: "
          f"{len(shown.entries)} entries, {shown.token_count} transcript tokens, {shown.window_tokens} in all "
          f"({static} in static sections, {shown.tools_tokens} in {TOOLS} tools); "
          f"openai body {len(rendered.rendered.encode()) // 1024} KiB\n")
    bare = samples["bare"].p50
    plain = samples["plain"].p50
    print("| call | p50 us | p99 us | p50 / bare | p50 / transcript only |\n|---|---:|---:|---:|---:|")
    for name, label in [("bare", "bare RPC (health Check)"), ("plain", "AssembleContext, transcript only (no profile)"),
                        ("sections", "AssembleContext, full profile: sections"),
                        ("openai", "... rendered openai_responses"), ("anthropic", "... rendered anthropic_messages"),
                        ("turn", "turn: append + persist + openai_responses")]:
        s = samples[name]
        print(f"| {label} | {s.p50:,.0f} | {s.p99:,.0f} | {s.p50 / bare:.2f} | {s.p50 / plain:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--budget", type=int, default=8000, help="the transcript token budget")
    parser.add_argument("--turns", type=int, default=60, help="turns of 4 events in each run")
    args = parser.parse_args()
    measure(args.rounds, args.budget, args.turns)


if __name__ == "__main__":
    main()
