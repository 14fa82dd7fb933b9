"""Where a call's time goes inside the sidecar: cProfile around the servicer's method, per call kind.

The speed benchmarks say how long a call takes as a host sees it; this says what the server does
with that time. A sidecar is built in this process (the same ``Services`` and ``build_server`` as
``serve``; real LMDB with sync on, o200k counting) so the profiler can wrap each RPC's method on
the server's own threads; a real gRPC client calls it. Each kind's profile is collected over its
calls only, and its top entries printed by own time (``tottime``) and by cumulative time:

- assemble: AssembleContext re-assembling a persisted iteration of a 10k-event run, 32k budget;
- turn: AssembleContext appending one event for a new iteration of that run;
- assemble 50 summaries: re-assembly of an iteration with 50 summaries in force;
- record: RecordSummary (recursive) keeping 50 summaries stacked;
- append 100: AppendEvents of 100 new events.

    python -m benchmarks.profile_calls [--calls 300] [--top 15] [--kinds assemble,turn,...]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import tempfile
from collections.abc import Callable
from pathlib import Path

import grpc

from benchmarks import corpus
from benchmarks.compare_trees import BUDGET, RUN, load
from benchmarks.summaries import build as build_summaries
from benchmarks.summaries import summary_text
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.pb.contextsidecar.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.settings import load_settings
from sidecar.wire import server as server_module
from sidecar.wire.servicer import ContextSidecarServicer

KINDS = ("assemble", "turn", "assemble 50 summaries", "record", "append 100")
# The kind being profiled: (its RPC, the profile collecting its calls); other calls run unprofiled.
RPC_OF = {"assemble": "AssembleContext", "turn": "AssembleContext", "assemble 50 summaries": "AssembleContext",
          "record": "RecordSummary", "append 100": "AppendEvents"}
_current: dict[str, cProfile.Profile] = {}


def profiled(method: Callable) -> Callable:
    @functools.wraps(method)
    def call(self: ContextSidecarServicer, request: object, context: grpc.ServicerContext) -> object:
        profile = _current.get(method.__name__)
        if profile is None:
            return method(self, request, context)
        profile.enable()
        try:
            return method(self, request, context)
        finally:
            profile.disable()
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls of each kind, profiled")
    parser.add_argument("--top", type=int, default=15, help="entries printed per kind and order")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    for name in set(RPC_OF.values()):
        setattr(ContextSidecarServicer, name, profiled(getattr(ContextSidecarServicer, name)))
    with tempfile.TemporaryDirectory(prefix="sidecar-profile-") as tmp:
        settings = load_settings(env={}, overrides={
            ("storage", "path"): str(Path(tmp) / "lmdb"), ("server", "listen"): "127.0.0.1:0",
            # As the speed benchmarks run it: summarization is off but for the run that asks for
            # it (benchmarks/summaries.py opens its run with summarization_supported).
            ("context", "token_counter"): "o200k_base", ("context", "transcript_token_budget"): BUDGET})
        services = server_module.Services.open(settings)
        server, port, health = server_module.build_server(settings, services)
        server_module.start(server, health)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 64 << 20)])
        stub = pb_grpc.ContextSidecarStub(channel)
        try:
            for kind in args.kinds.split(","):
                call = calls_for(kind, stub, args.events)
                for _ in range(20):  # warm
                    call()
                _current[RPC_OF[kind]] = profile = cProfile.Profile()
                for _ in range(args.calls):
                    call()
                _current.clear()
                report(kind, profile, args.calls, args.top)
        finally:
            channel.close()
            server.stop(None).wait()
            services.close()


def calls_for(kind: str, stub: pb_grpc.ContextSidecarStub, events: int) -> Callable[[], object]:
    contents = corpus.contents(512, seed=7)
    if kind in ("assemble", "turn"):
        if "last" not in _loaded:
            _loaded["last"] = load(stub, events)
        last = _loaded["last"]
        read = pb.AssembleContextRequest(run_id=RUN, iteration=last, max_transcript_tokens=BUDGET)
        stub.AssembleContext(read)
        if kind == "assemble":
            return lambda: stub.AssembleContext(read)
        next_turn = [last + 1000]

        def turn() -> object:
            next_turn[0] += 1
            event = pb.Event(event_id=f"turn-{next_turn[0]}", role="user", content=contents[next_turn[0] % 512])
            return stub.AssembleContext(pb.AssembleContextRequest(
                run_id=RUN, iteration=next_turn[0], append_events=[event], max_transcript_tokens=BUDGET))
        return turn
    if kind in ("assemble 50 summaries", "record"):
        state = _stacked(stub)
        if kind == "assemble 50 summaries":
            pinned = pb.AssembleContextRequest(run_id="stacked", iteration=state["iteration"] - 1)
            return lambda: stub.AssembleContext(pinned)

        def record() -> object:
            # The summary in force folded with the next event, as benchmarks/summaries.py does;
            # a new turn first, so there is always an event to fold.
            iteration = state["iteration"]
            stub.AssembleContext(pb.AssembleContextRequest(run_id="stacked", iteration=iteration, append_events=[
                pb.Event(event_id=f"t{iteration}", role="user", content=contents[iteration % 512])]))
            state["unsummarised"].append(f"t{iteration}")
            state["iteration"] += 1
            folded = state["unsummarised"].popleft()
            recorded = stub.RecordSummary(pb.RecordSummaryRequest(
                run_id="stacked", iteration=state["iteration"], strategy="recursive",
                replaced_event_ids=[state["refs"][-1], folded], summary_text=summary_text(len(state["refs"]))))
            state["refs"][-1] = recorded.summary_ref
            return recorded
        return record
    if kind == "append 100":
        stub.OpenRun(pb.OpenRunRequest(run_id="appends"))
        batch = [0]
        texts = corpus.contents(100, seed=5)

        def append() -> object:
            batch[0] += 1
            return stub.AppendEvents(pb.AppendEventsRequest(run_id="appends", events=[
                pb.Event(event_id=f"b{batch[0]}-{i}", iteration=batch[0], role="user", content=text)
                for i, text in enumerate(texts)]))
        return append
    raise SystemExit(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")


_loaded: dict[str, int] = {}  # the 10k-event run, loaded once for both kinds that use it
_stacked_state: dict = {}


def _stacked(stub: pb_grpc.ContextSidecarStub) -> dict:
    if not _stacked_state:
        _stacked_state.update(build_summaries(stub, 50))
    return _stacked_state


def report(kind: str, profile: cProfile.Profile, calls: int, top: int) -> None:
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out).strip_dirs().sort_stats(order)
        stats.print_stats(top)
        body = out.getvalue()
        body = body[body.index("   ncalls"):] if "   ncalls" in body else body
        print(f"\n## {kind}: {calls} calls, top {top} by {order} (total {stats.total_tt * 1e6 / calls:,.0f} µs "
              f"a call inside the servicer)\n{body}")


if __name__ == "__main__":
    main()
