"""Every figure of the sidecar's speed table beside the floor it cannot beat, measured in one run.

A figure over the bare RPC says how many RPCs a call costs; over its floor it says how much more
than any server would pay for the same answer or the same durable write. One real sidecar process
(o200k counting, 32k budget, sync on: each write one durable commit) holds a run of --events
corpus events, a run with 50 summaries in force, a run that AppendEvents grows, and a memory
ref of --memory-entries entries (``_lib/workload.py``'s runs and ref, the ref put first by a
--no-sync sidecar on the same store). Beside it a floor server (``_lib/floor_server.py``, a
process of its own as the sidecar is) answers the sidecar's own answers from pre-built bytes and
makes durable LMDB commits of the sizes the sidecar's writes make. Then, round by round, every
call below once, so the drift of a shared machine hits figures and floors alike, in an order drawn
afresh each round (seeded): a rotating order keeps each call's predecessor, and that moved a bare
RPC's p50 by up to 16% here. Each row, a figure / its floor:

- re-assembly 32k: AssembleContext re-assembling a persisted, settled iteration of the run (read
  path; at 10k events a 93 KiB answer under the default cache_stable window; its answer is kept
  and given again, ``sidecar/transcript/reassembly.py``) / the floor server answering that same
  message, serialized once;
- a retried turn: AssembleContext of the newest iteration (the turn's), no events, once after
  each turn: planned again to check nothing was appended, and built (an answer is kept only from
  there on, and each round's turn changes the run) / the same floor as the row above (an answer
  of the same size);
- re-assembly 8k through ``context_sidecar_client``, as a Python host calls / the same answer from the
  floor server, also through ``context_sidecar_client``;
- a turn: AssembleContext appending one ~190-token event for a new iteration (count, one durable
  commit, persist the window, answer) / a bare RPC making one durable commit of the bytes a turn
  writes (below); the turn's answer is not in this floor (the first row's floor is such an answer);
- the same turn / all that a turn cannot skip, in one handler of the floor server: reading the
  request, counting its event with tiktoken (the contract's exact counts), the same durable commit,
  and sending a turn's answer (its bytes pre-built);
- re-assembly with 50 summaries in force / that answer, pre-built;
- a turn of that run (it also feeds RecordSummary the events it folds) / a commit of its bytes;
- RecordSummary, recursive (the summary in force and the oldest unsummarised event into one) /
  a commit of its bytes;
- AppendEvents of 100 events (one durable commit) / tiktoken o200k_base counting the same 100
  texts in this process (``encode_ordinary``, as the sidecar counts), timed in the same rounds,
  plus the bare RPC's p50: the issue's floor, which leaves out the call's durable commit;
- the same AppendEvents / all it cannot skip, in one handler of the floor server: reading the
  request, counting its 100 events with tiktoken, one durable commit of the bytes the call writes,
  and sending its answer (pre-built);
- ListMemory by relevance (BM25, 2,000-token budget, the memory benchmark's query: a word found in most
  entries and two rare ones) / ListMemory by recency on the same ref.

The bytes a call writes: before the rounds, each writing call runs 10 times, and the bytes its
process passed to write calls (/proc/PID/io ``wchar``: LMDB writes a commit's dirty pages and its
meta page so; gRPC's socket sends are not counted) are taken per call, the median. A put into the
floor's small environment writes its value's overflow pages and two pages more (its leaf, the meta
page), so the floor puts a value that fills the call's whole pages less those two; what the
floor's commits write is measured the same way and printed beside.

``figure / bare`` is over the sidecar's bare RPC (a health Check) in the same rounds; the Python
client's row is over a health Check through ``context_sidecar_client``.

    python -m benchmarks.bench_floors [--rounds 300] [--events 10000] [--memory-entries 100000] [--json PATH]
        [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import mmap
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
from context_sidecar_client import Client
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks._lib import corpus, floor_server, workload
from benchmarks._lib.harness import (
    Samples,
    Serving,
    add_smoke_flag,
    channel_to,
    interleaved,
    serving,
    sidecar_process,
    sidecar_serving,
    smoke,
)
from sidecar.text.encodings import load_encoding
from sidecar.wire.server import SERVICE_NAME

FLAGS = ["--token-counter", "o200k_base", "--transcript-token-budget", str(workload.BUDGET)]
SMALL_BUDGET = 8000
STACKED = 50  # summaries in force on the stacked run
APPENDED, WARMUP = workload.APPENDED, workload.WARMUP
CALIBRATION = 10  # calls of each writing call to measure the bytes it writes
# A put into the floor's small environment writes its value's overflow pages (a 16-byte page
# header, then the value) and two pages more: its leaf and the meta page.
FLOOR_PUT_PAGES, OVERFLOW_HEADER = 2, 16
# The floor server's methods: the answer each returns, and the commit of each writing call.
ANSWERS = {"assemble 32k": "AssembleContext32k", "client assemble 8k": "AssembleContext",  # the client's name
           "stacked assemble": "AssembleContextStacked"}
COMMITS = {"turn": "Turn", "stacked turn": "StackedTurn", "record": "RecordSummary"}
WHOLE_TURN = "TurnWhole"  # the floor server's method doing all a turn cannot skip
WHOLE_APPEND = "AppendWhole"  # and all AppendEvents cannot skip
# Each writing call, and the floor call whose commit is made as large as what it writes.
WRITES = {**{figure: f"floor {figure}" for figure in COMMITS}, "append": "floor whole append"}


@dataclass(frozen=True)
class Row:
    name: str
    floor: str
    figure: str  # the figure's call
    floor_call: str
    bare: str = "bare"
    plus_bare: bool = False  # the floor runs in this process: the bare RPC is added to it


@dataclass
class Sidecar:
    """The figures' calls on the loaded sidecar, and what their floors answer and send."""

    calls: dict[str, Callable[[], Any]]
    answers: dict[str, Any]  # by figure: the message its floor answers
    requests: dict[str, Any]  # by figure: the request its floor is sent, like the figure's own
    texts: list[str]  # the texts AppendEvents appends
    details: dict[str, str]


def bytes_written(pid: int) -> int:
    """What process ``pid`` has passed to write calls so far."""
    with open(f"/proc/{pid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))


def written_per_call(pid: int, call: Callable[[], object]) -> int:
    """The median of the bytes process ``pid`` writes during one ``call``."""
    spent = []
    for _ in range(CALIBRATION):
        before = bytes_written(pid)
        call()
        spent.append(bytes_written(pid) - before)
    return sorted(spent)[len(spent) // 2]


def load_memory(storage: Path, entries: int) -> float:
    """Put the memory ref with a --no-sync sidecar (loading only); the seconds it took."""
    with sidecar_process(storage, ["--no-sync"]) as channel:
        return workload.load_memory(pb_grpc.ContextSidecarStub(channel), entries)


def load_sidecar(channel: grpc.Channel, client: Client, events: int, rounds: int) -> Sidecar:
    """Load the runs into the sidecar (the memory ref is there already) and persist the windows
    the rounds re-assemble."""
    stub, health = pb_grpc.ContextSidecarStub(channel), health_pb2_grpc.HealthStub(channel)
    new_contents = corpus.contents(512, seed=7)
    run = workload.calls_for(channel, events, new_contents)
    whole = cast(pb.AssembleContextResponse, run["assemble"]())
    small: dict[str, Any] = {"run_id": workload.RUN, "iteration": whole.iteration - 1,
                             "max_transcript_tokens": SMALL_BUDGET}
    small_answer = client.assemble_context(**small)  # persists the window the rounds re-assemble
    state = workload.build_stacked(stub, STACKED)
    pinned = pb.AssembleContextRequest(run_id=workload.STACKED_RUN, iteration=state["iteration"] - 1)
    stacked_answer = stub.AssembleContext(pinned)
    stacked = workload.stacked_writes(stub, state, corpus.contents(rounds + 64, seed=11))
    texts = corpus.contents(APPENDED, seed=13)
    # The rounds' appends, the calibration's (``written_per_call``) and one for the floor's answer.
    appends = workload.append_requests(texts, WARMUP + rounds + CALIBRATION + 1)
    recency = pb.ListMemoryRequest(memory_ref=workload.MEMORY_REF, token_budget=workload.MEMORY_BUDGET)
    relevance = pb.ListMemoryRequest(memory_ref=workload.MEMORY_REF, token_budget=workload.MEMORY_BUDGET,
                                     rank="relevance", query=workload.QUERY)
    newest = [whole.iteration]

    def turn() -> Any:
        answer = cast(pb.AssembleContextResponse, run["turn"]())
        newest[0] = answer.iteration
        return answer

    def retry() -> Any:  # the newest iteration again, the first time since its turn: planned again, built
        return stub.AssembleContext(pb.AssembleContextRequest(run_id=workload.RUN, iteration=newest[0],
                                                              max_transcript_tokens=workload.BUDGET))

    calls = {"bare": lambda: health.Check(health_pb2.HealthCheckRequest()), "client bare": client.check_health,
             "assemble 32k": run["assemble"], "client assemble 8k": lambda: client.assemble_context(**small),
             "turn": turn, "retry": retry, "stacked assemble": lambda: stub.AssembleContext(pinned),
             "stacked turn": stacked["turn"], "record": stacked["record"],
             "append": lambda: stub.AppendEvents(next(appends)),
             "relevance": lambda: stub.ListMemory(relevance), "recency": lambda: stub.ListMemory(recency)}
    turn_event = pb.Event(event_id="floor", role="user", content=new_contents[0])
    requests = {
        "assemble 32k": pb.AssembleContextRequest(run_id=workload.RUN, iteration=whole.iteration,
                                                  max_transcript_tokens=workload.BUDGET),
        "client assemble 8k": small, "stacked assemble": pinned,
        "turn": pb.AssembleContextRequest(run_id=workload.RUN, iteration=whole.iteration + 1,
                                          append_events=[turn_event], max_transcript_tokens=workload.BUDGET),
        "stacked turn": pb.AssembleContextRequest(run_id=workload.STACKED_RUN, iteration=state["iteration"],
                                                  append_events=[turn_event]),
        "record": pb.RecordSummaryRequest(run_id=workload.STACKED_RUN, iteration=state["iteration"],
                                          strategy="recursive",
                                          replaced_event_ids=[state["refs"][-1], state["unsummarised"][0]],
                                          summary_text=workload.summary_text(STACKED)),
        "append": next(workload.append_requests(texts, 1))}
    answers = {"assemble 32k": whole, "client assemble 8k": small_answer, "stacked assemble": stacked_answer}
    details = {name: f"{len(answer.entries)} entries, {answer.ByteSize() / 1024:.0f} KiB"
               for name, answer in answers.items()}
    summaries_in_force = sum(1 for entry in stacked_answer.entries if entry.type == "context.summary")
    details["stacked assemble"] += f", {summaries_in_force} summaries"
    return Sidecar(calls, answers, requests, texts, details)


def floor_put_size(written: int) -> int:
    """The value a floor commit puts so that it writes the whole pages of ``written`` bytes."""
    return max((written // mmap.PAGESIZE - FLOOR_PUT_PAGES) * mmap.PAGESIZE - OVERFLOW_HEADER, 0)


@contextmanager
def floor_server_for(folder: Path, answers: dict[str, Any], commit_bytes: dict[str, int],
                     turn_answer: Any, append_answer: Any) -> Iterator[Serving]:
    """The floor server, answering ``answers`` (by figure) and committing ``commit_bytes`` (by
    figure); its whole turn commits a turn's bytes and answers ``turn_answer``, its whole append
    an append's bytes and ``append_answer``."""
    arguments = ["--store", str(folder / "floor-lmdb")]
    for figure, answer in answers.items():
        path = folder / f"{ANSWERS[figure]}.bin"
        path.write_bytes(answer.SerializeToString())
        arguments += ["--answer", f"{ANSWERS[figure]}={path}"]
    for figure, method in COMMITS.items():
        arguments += ["--commit", f"{method}={floor_put_size(commit_bytes[figure])}"]
    for option, method, figure, answer in (("--turn", WHOLE_TURN, "turn", turn_answer),
                                           ("--append", WHOLE_APPEND, "append", append_answer)):
        path = folder / f"{method}.bin"
        path.write_bytes(answer.SerializeToString())
        arguments += [option, f"{method}={floor_put_size(commit_bytes[figure])}:{path}"]
    with serving([sys.executable, "-m", "benchmarks._lib.floor_server", *arguments], floor_server.READY) as server:
        yield server


def floor_calls(channel: grpc.Channel, client: Client, sidecar: Sidecar) -> dict[str, Callable[[], Any]]:
    """Each floor's call: the figure's request, and its response type, to the floor server's method."""
    def unary(method: str, request: Any, response: Any) -> Callable[[], Any]:
        rpc = channel.unary_unary(f"/{SERVICE_NAME}/{method}", request_serializer=type(request).SerializeToString,
                                  response_deserializer=response.FromString)
        return lambda: rpc(request)

    health = health_pb2_grpc.HealthStub(channel)
    encoding = load_encoding("o200k_base")
    calls = {"floor bare": lambda: health.Check(health_pb2.HealthCheckRequest()),
             "floor client assemble 8k": lambda: client.assemble_context(**sidecar.requests["client assemble 8k"]),
             "tiktoken": lambda: [len(encoding.encode_ordinary(text)) for text in sidecar.texts]}
    for figure in ("assemble 32k", "stacked assemble"):
        calls[f"floor {figure}"] = unary(ANSWERS[figure], sidecar.requests[figure], pb.AssembleContextResponse)
    for figure, method in COMMITS.items():
        response = pb.RecordSummaryResponse if figure == "record" else pb.AssembleContextResponse
        calls[f"floor {figure}"] = unary(method, sidecar.requests[figure], response)
    calls["floor whole turn"] = unary(WHOLE_TURN, sidecar.requests["turn"], pb.AssembleContextResponse)
    calls["floor whole append"] = unary(WHOLE_APPEND, sidecar.requests["append"], pb.AppendEventsResponse)
    return calls


def rows_of(sidecar: Sidecar, written: dict[str, int], events: int, entries: int) -> list[Row]:
    details = sidecar.details

    def commit(figure: str) -> str:
        return f"bare RPC + one durable commit of {written[figure]:,} B"

    return [
        Row(f"AssembleContext re-assembly, 32k, {events:,} events ({details['assemble 32k']})",
            "the same answer, pre-built", "assemble 32k", "floor assemble 32k"),
        Row("AssembleContext of the newest iteration again, first since its turn (planned again, built)",
            "a 32k re-assembly's answer, pre-built", "retry", "floor assemble 32k"),
        Row(f"AssembleContext re-assembly, 8k ({details['client assemble 8k']}), Python client",
            "the same answer, pre-built, Python client", "client assemble 8k", "floor client assemble 8k",
            bare="client bare"),
        Row("a turn: AssembleContext appending one event (32k, durable commit, persist)", commit("turn"),
            "turn", "floor turn"),
        Row("the same turn beside all a turn cannot skip",
            "reading the request, counting its event (tiktoken), the same commit, sending a turn's answer pre-built",
            "turn", "floor whole turn"),
        Row(f"re-assembly with summaries in force ({details['stacked assemble']})", "the same answer, pre-built",
            "stacked assemble", "floor stacked assemble"),
        Row("a turn with 50 summaries in force", commit("stacked turn"), "stacked turn", "floor stacked turn"),
        Row("RecordSummary (recursive)", commit("record"), "record", "floor record"),
        Row(f"AppendEvents of {APPENDED} events", f"tiktoken o200k counting the {APPENDED} texts + bare RPC",
            "append", "tiktoken", plus_bare=True),
        Row("the same AppendEvents beside all it cannot skip",
            f"reading the request, counting its {APPENDED} events (tiktoken), one durable commit of its "
            f"{written['append']:,} B, sending its answer pre-built", "append", "floor whole append"),
        Row(f"ListMemory relevance, {entries:,} entries, a near-stopword in the query",
            "ListMemory recency, same ref", "relevance", "recency"),
    ]


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="sidecar-floors-") as tmp, ExitStack() as stack:
        folder = Path(tmp)
        load_seconds = load_memory(folder / "lmdb", args.memory_entries)
        print(f"put {args.memory_entries:,} memory entries in {load_seconds:.1f} s (--no-sync)", file=sys.stderr)
        started = time.perf_counter()
        # --tree: the figures of another source tree's sidecar (the floors are the same): run
        # once with the tree before a change and once without, and compare figure / floor.
        sidecar_server = stack.enter_context(sidecar_serving(folder / "lmdb", FLAGS, tree=args.tree))
        channel = stack.enter_context(channel_to(sidecar_server.address))
        client = stack.enter_context(Client(sidecar_server.address))
        sidecar = load_sidecar(channel, client, args.events, args.rounds)
        print(f"loaded the runs in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        written = {figure: written_per_call(sidecar_server.process.pid, sidecar.calls[figure]) for figure in WRITES}
        # A turn's answer and an append's, for the floors of all each cannot skip.
        turn_answer, append_answer = sidecar.calls["turn"](), sidecar.calls["append"]()
        floor = stack.enter_context(floor_server_for(folder, sidecar.answers, written, turn_answer, append_answer))
        floor_channel = stack.enter_context(channel_to(floor.address))
        floors = floor_calls(floor_channel, stack.enter_context(Client(floor.address)), sidecar)
        floor_written = {figure: written_per_call(floor.process.pid, floors[call]) for figure, call in WRITES.items()}
        samples = interleaved({**sidecar.calls, **floors}, args.rounds, WARMUP, random.Random(1))
        changed = [figure for figure, answer in sidecar.answers.items()
                   if sidecar.calls[figure]().SerializeToString() != answer.SerializeToString()]
    if changed:
        print(f"warning: the answer of {', '.join(changed)} changed during the rounds; its floor's did not",
              file=sys.stderr)
    return report(args, samples, rows_of(sidecar, written, args.events, args.memory_entries), written, floor_written)


def report(args: argparse.Namespace, samples: dict[str, Samples], rows: list[Row], written: dict[str, int],
           floor_written: dict[str, int]) -> dict:
    figures = []
    for row in rows:
        figure = samples[row.figure].p50
        floor = samples[row.floor_call].p50 + (samples["bare"].p50 if row.plus_bare else 0)
        figures.append({"call": row.figure, "row": row.name, "floor": row.floor, "figure_p50_us": round(figure),
                        "floor_p50_us": round(floor), "figure_over_floor": round(figure / floor, 2),
                        "figure_over_bare": round(figure / samples[row.bare].p50, 2)})
    return {"rounds": args.rounds, "events": args.events, "memory_entries": args.memory_entries,
            "bare_p50_us": round(samples["bare"].p50), "client_bare_p50_us": round(samples["client bare"].p50),
            "floor_server_bare_p50_us": round(samples["floor bare"].p50),
            "bytes_written": {figure: {"call": written[figure], "floor": floor_written[figure]} for figure in WRITES},
            "rows": figures}


def print_report(result: dict) -> None:
    print(f"\n{result['rounds']} interleaved rounds; {result['events']:,} events in the run, "
          f"{result['memory_entries']:,} memory entries; p50 µs on this machine. Bare RPC (health Check) "
          f"{result['bare_p50_us']:,}, through context_sidecar_client {result['client_bare_p50_us']:,}; the floor "
          f"server's own {result['floor_server_bare_p50_us']:,}.")
    print("Bytes written per call (wchar), the sidecar's / its floor's: " + "; ".join(
        f"{figure} {sizes['call']:,} / {sizes['floor']:,}" for figure, sizes in result["bytes_written"].items()) + "\n")
    print("| row | floor | figure p50 µs | floor p50 µs | figure / floor | figure / bare |")
    print("|---|---|---:|---:|---:|---:|")
    for row in result["rows"]:
        print(f"| {row['row']} | {row['floor']} | {row['figure_p50_us']:,} | {row['floor_p50_us']:,} | "
              f"{row['figure_over_floor']:.2f} | {row['figure_over_bare']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="interleaved rounds of every call")
    parser.add_argument("--events", type=int, default=10_000, help="events in the run re-assembled")
    parser.add_argument("--memory-entries", type=int, default=100_000, help="entries in the memory ref")
    parser.add_argument("--json", type=Path, help="also write the figures here, as JSON")
    parser.add_argument("--tree", type=Path, help="run the sidecar of this source tree (fastcore compiled in place)")
    add_smoke_flag(parser)
    args = smoke(parser.parse_args(), rounds=1, events=200, memory_entries=50)
    result = measure(args)
    print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
