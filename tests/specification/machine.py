"""The workload generator: a Hypothesis state machine that plays hosts against three real
sidecars (tests/specification/sidecars.py) and checks, on every step, the properties of
tests/specification/properties.py and the answers of the model (tests/specification/model.py).

A host's turn appends a user message (trusted or not), parallel tool calls with results from a
few tokens to thousands, a call whose result comes a turn later, an assistant reply; sometimes
through AppendEvents first, sometimes rendered for a provider, sometimes under a tighter
``max_transcript_tokens``. Between turns the workload re-assembles old iterations, forks runs
(branch or replay, from any seq, re-sending the source's events or departing from them),
deletes summaries' artifacts, restarts a sidecar, and sends requests that must be refused.

Every request goes to all three sidecars, whose answers (or errors) must be equal byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field

import grpc
from context_sidecar_client.v1 import sidecar_pb2 as pb
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.helpers import rich_error
from tests.specification.model import SIDECAR_TYPES, Refusal, RunModel, Window
from tests.specification.properties import SUMMARY_TYPE, check_seam, check_window, same_window
from tests.specification.sidecars import Config, Trio

WORDS = ("refund", "policy", "order", "shipping", "invoice", "customer", "line", "file", "status", "1234",
         "damaged", "clause", "kettle", "warehouse", "the", "a", "of", "naïve", "日本", "🙂")
TOOLS = ("search", "read_file", "list_dir")
RESULT_WORDS = {"tiny": (1, 6), "small": (10, 60), "medium": (80, 400), "huge": (1500, 6000)}

RENDERS = ["", "", "openai_responses", "anthropic_messages"]


class Refused(Exception):
    def __init__(self, error: tuple) -> None:
        super().__init__(error)
        self.code, self.reason, self.fields = error


@dataclass
class Replay:
    """A replay fork's host: the source's events it re-sends, iteration by iteration, and the
    windows the source was fed at those iterations, which the fork must be fed too."""

    turns: list[tuple[int, list[pb.Event]]]
    source_windows: dict[int, pb.GetTranscriptWindowResponse]
    depart_at: int | None  # the replayed turn whose events the host changes (None: never departs)
    tightened: dict[int, int] = field(default_factory=dict)  # the source's max_transcript_tokens per iteration
    departed: bool = False
    done: int = 0


@dataclass
class HostRun:
    run_id: str
    model: RunModel
    iteration: int = 0  # the last iteration assembled
    originals: dict[str, pb.Event] = field(default_factory=dict)  # every event as the host sent it
    answers: dict[int, pb.AssembleContextResponse] = field(default_factory=dict)  # first answer of each
    tightened: dict[int, int] = field(default_factory=dict)  # iteration -> its max_transcript_tokens
    open_calls: list[tuple[str, str]] = field(default_factory=list)  # (call_id, tool): results still to come
    # A summary recorded for the next turn: (iteration, ref, the budget it was asked under, its tokens).
    asked: tuple[int, str, int, int] | None = None
    deleted: set[str] = field(default_factory=set)  # summary refs whose artifact was deleted
    summary_refs: list[str] = field(default_factory=list)  # every summary of its log
    replay: Replay | None = None
    serial: int = 0


def unsummarised(log: list[pb.StoredEvent]) -> list[pb.StoredEvent]:
    """The host events of ``log`` that no summary in it replaced."""
    replaced = {event_id for event in log if event.type == "context.summarized"
                for event_id in json.loads(event.content)["replacedTurns"]}
    return [event for event in log if event.type not in SIDECAR_TYPES and event.event_id not in replaced]


turn_shapes = st.fixed_dictionaries({
    "seed": st.integers(0, 2 ** 16),
    "user_words": st.sampled_from([0, 3, 12, 40, 200]),
    "untrusted": st.booleans(),
    "calls": st.lists(st.sampled_from(tuple(RESULT_WORDS)), max_size=3),
    "cross_turn": st.booleans(),
    "reply_words": st.sampled_from([0, 5, 30]),
    "via_append": st.booleans(),
    "render": st.sampled_from(RENDERS),
    "max_tokens": st.one_of(st.none(), st.none(), st.none(), st.integers(1, 3000)),
})

configs = st.builds(
    Config,
    token_counter=st.sampled_from(["o200k_base", "o200k_base", "cl100k_base", "chars"]),
    budget=st.sampled_from([40, 150, 600, 2500, 12000]),
    window_policy=st.sampled_from(["cache_stable", "max_fill"]),
    clearing=st.booleans(),
    summaries=st.sampled_from(["none", "host", "host-recursive", "extractive", "extractive-recursive"]),
    keep_last_turns=st.integers(0, 3),
    transcript_window=st.sampled_from([0, 0, 0, 6, 20]),
    trim_to_fraction=st.sampled_from([0.6, 0.3, 0.9]),
)


class SpecificationMachine(RuleBasedStateMachine):
    """Drives one configuration's sidecars; ``shared_urls`` (set by the test) gives each of the
    three a PostgreSQL database of its own, for the shared store."""

    counters = None  # the test sets the tiktoken counters, loaded once
    shared_urls = None  # a callable giving three new database URLs, or None for LMDB alone
    steps = 0  # steps tried, across examples (the long command reports it)
    summaries_fed = 0  # summaries asked for, recorded by the host and checked fed, across examples
    summaries_asked = 0  # summaries asked for and recorded by the host, across examples

    def __init__(self) -> None:
        super().__init__()
        self.trio: Trio | None = None
        self.runs: list[HostRun] = []

    # Calling the three sidecars alike.

    def call(self, method: str, request):
        """``request`` on every sidecar; their answers (or errors) must be the same bytes."""
        assert self.trio is not None
        outcomes = []
        for sidecar in self.trio.all:
            try:
                response = getattr(sidecar.stub, method)(request, timeout=120)
                outcomes.append((sidecar.name, "answer", response.SerializeToString(deterministic=True), response))
            except grpc.RpcError as error:
                outcomes.append((sidecar.name, "error", rich_error(error), None))
        first = outcomes[0]
        for other in outcomes[1:]:
            assert other[1:3] == first[1:3], (
                f"{method}: {other[0]} answers differently from {first[0]}:\n"
                f"{first[0]}: {first[1]} {first[3] if first[3] is not None else first[2]}\n"
                f"{other[0]}: {other[1]} {other[3] if other[3] is not None else other[2]}")
        if first[1] == "error":
            assert first[2][0] != grpc.StatusCode.INTERNAL, f"{method} answered INTERNAL: {first[2]}"
            raise Refused(first[2])
        return first[3]

    def log(self, run: HostRun) -> list[pb.StoredEvent]:
        events, from_seq = [], 0
        while True:
            page = self.call("ListRunEvents", pb.ListRunEventsRequest(run_id=run.run_id, from_seq=from_seq,
                                                                      limit=1000))
            events += page.events
            if not page.HasField("next_from_seq"):
                return events
            from_seq = page.next_from_seq

    def artifacts(self, run: HostRun, refs: list[str]) -> dict[str, str]:
        return {ref: self.call("GetArtifact", pb.GetArtifactRequest(run_id=run.run_id, artifact_id=ref)).content
                for ref in refs}

    def seam(self, run: HostRun, iteration: int) -> pb.GetTranscriptWindowResponse:
        window = self.call("GetTranscriptWindow", pb.GetTranscriptWindowRequest(run_id=run.run_id, iteration=iteration))
        window.run_id = ""  # the one field in which a fork's seam differs from its source's
        return window

    def pick(self, index: int) -> HostRun:
        return self.runs[index % len(self.runs)]

    def new_model(self) -> RunModel:
        config = self.config
        return RunModel(config.token_counter, config.budget, config.transcript_window, config.window_policy,
                        config.trim_to_fraction, config.clearing)

    # The example's sidecars, and its first run.

    @initialize(config=configs)
    def start(self, config: Config) -> None:
        self.config = config
        urls = type(self).shared_urls() if type(self).shared_urls else None
        self.trio = Trio(config, type(self).counters, urls)
        run = HostRun("run-0", self.new_model())
        self.call("OpenRun", pb.OpenRunRequest(
            run_id=run.run_id, token_counter=config.token_counter, transcript_token_budget=config.budget,
            keep_last_turns=config.keep_last_turns, transcript_window=config.transcript_window,
            summarization_supported=config.summarization, summarization_strategy=config.strategy))
        self.runs.append(run)

    def teardown(self) -> None:
        if self.trio is not None:
            self.trio.close()

    @invariant()
    def count_steps(self) -> None:
        type(self).steps += 1

    # Turns.

    def events_for(self, run: HostRun, iteration: int, shape: dict) -> list[pb.Event]:
        rng = random.Random(shape["seed"])
        say = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
        run.serial += 1
        prefix = f"{run.run_id}-i{iteration}-{run.serial}"
        events = []
        for call_id, _tool in run.open_calls:  # results of calls made last turn (cross-turn calls)
            events.append(pb.Event(event_id=f"{prefix}-late-{call_id}", iteration=iteration, role="tool",
                                   type="tool_result", call_id=call_id, content=f"Late result: {say(8)}"))
        if shape["user_words"]:
            events.append(pb.Event(event_id=f"{prefix}-u", iteration=iteration, role="user",
                                   untrusted=shape["untrusted"],
                                   content=f"Turn {iteration}: {say(shape['user_words'])}?"))
        calls = [(f"{prefix}-k{n}", TOOLS[n % len(TOOLS)], size) for n, size in enumerate(shape["calls"])]
        for call_id, tool, _ in calls:  # parallel calls, then their results
            events.append(pb.Event(event_id=f"{call_id}-call", iteration=iteration, role="assistant",
                                   type="tool_call", call_id=call_id, tool_name=tool,
                                   content=json.dumps({"q": say(3)})))
        leave_open = calls[-1:] if shape["cross_turn"] else []
        for call_id, _, size in calls:
            if (call_id, _, size) not in leave_open:
                low, high = RESULT_WORDS[size]
                events.append(pb.Event(event_id=f"{call_id}-result", iteration=iteration, role="tool",
                                       type="tool_result", call_id=call_id, content=say(rng.randrange(low, high))))
        if shape["reply_words"] or not events:
            events.append(pb.Event(event_id=f"{prefix}-a", iteration=iteration, role="assistant",
                                   content=f"Answer {iteration}: {say(shape['reply_words'] or 2)}."))
        run.open_calls = [(call_id, tool) for call_id, tool, _ in leave_open]
        return events

    @rule(index=st.integers(0, 7), shape=turn_shapes)
    def turn(self, index: int, shape: dict) -> None:
        run = self.pick(index)
        replaying = run.replay is not None and run.replay.done < len(run.replay.turns)
        if replaying:
            assert run.replay is not None
            iteration, events = run.replay.turns[run.replay.done]
            if run.replay.depart_at == run.replay.done:
                events = [pb.Event(event_id=f"{run.run_id}-departs-{iteration}", iteration=iteration, role="user",
                                   content="A different question."), *events]
                run.replay.departed = True
            shape = {**shape, "via_append": False, "max_tokens": run.replay.tightened.get(iteration)}
        else:
            iteration = run.iteration + 1
            saved_calls = list(run.open_calls)
            events = self.events_for(run, iteration, shape)
        before = len(self.log(run))
        try:
            answer = self.assemble(run, iteration, events, shape)
        except Refused as refused:
            self.after_refusal(run, before, refused)
            if replaying:
                assert run.replay is not None
                # (a departing turn brings an event of its own: the source's answer says nothing of it)
                assert run.replay.departed or iteration not in run.replay.source_windows, \
                    f"a replay turn its source was answered was refused: {refused.args}"
                run.replay.departed, run.replay.done = True, len(run.replay.turns)  # the source was refused too
                return
            run.open_calls = saved_calls
            return
        if shape["render"]:  # a rendering carries the entries in its body: read them back plainly
            assert answer.rendered and not answer.entries
            answer = self.reassembled(run, iteration, shape["max_tokens"])
        for event in events:
            run.originals.setdefault(event.event_id, event)
        run.iteration = max(run.iteration, iteration)
        if iteration not in run.answers:
            run.answers[iteration] = answer
            if shape["max_tokens"] is not None:
                run.tightened[iteration] = shape["max_tokens"]
            else:
                run.tightened.pop(iteration, None)
        if replaying:
            assert run.replay is not None
            run.replay.done += 1
        self.check_answer(run, answer, shape["max_tokens"])
        self.summarise_if_due(run, answer)

    def assemble(self, run: HostRun, iteration: int, events: list[pb.Event], shape: dict) -> pb.AssembleContextResponse:
        if shape["via_append"] and events:
            self.call("AppendEvents", pb.AppendEventsRequest(run_id=run.run_id, events=events))
            for event in events:  # in the log now, whatever the assembly answers
                run.originals.setdefault(event.event_id, event)
            events = []
        request = pb.AssembleContextRequest(run_id=run.run_id, iteration=iteration, append_events=events,
                                            render=shape["render"])
        if shape["max_tokens"] is not None:
            request.max_transcript_tokens = shape["max_tokens"]
        return self.call("AssembleContext", request)

    def reassembled(self, run: HostRun, iteration: int, max_tokens: int | None) -> pb.AssembleContextResponse:
        """AssembleContext without events, under the budget the iteration was first assembled with."""
        request = pb.AssembleContextRequest(run_id=run.run_id, iteration=iteration)
        if max_tokens is not None:
            request.max_transcript_tokens = max_tokens
        return self.call("AssembleContext", request)

    def after_refusal(self, run: HostRun, log_length: int, refused: Refused) -> None:
        """A refused call writes nothing (AppendEvents before it did, as a host would see)."""
        assert refused.reason, f"a refusal carries a reason: {refused.args}"
        assert len(self.log(run)) >= log_length

    def check_answer(self, run: HostRun, answer: pb.AssembleContextResponse, max_tokens: int | None) -> None:
        log = self.log(run)
        run.summary_refs = [json.loads(e.content)["summaryRef"] for e in log if e.type == "context.summarized"]
        refs = [entry.event_id for entry in answer.entries if entry.type == SUMMARY_TYPE]
        check_window(answer, log, self.config.token_counter, self.config.transcript_window, self.artifacts(run, refs))
        check_seam(answer, self.seam(run, answer.iteration))
        self.check_model(run, answer, log, max_tokens)
        self.check_replay(run, answer)
        if run.asked is not None and run.asked[0] == answer.iteration:
            # compaction.due is said only when a summary of the candidates would be fed in the next
            # window, foreseen under the same budget with the summary weighing the room a move leaves
            # (docs/transcript.md): so it is fed when the host kept its summary and the turn's events
            # within that room, in tokens and in entries, and did not tighten the budget.
            _, ref, budget, summary_tokens = run.asked
            room = budget - int(self.config.trim_to_fraction * budget)
            turn = [entry for entry in answer.entries
                    if entry.type != SUMMARY_TYPE and entry.iteration == answer.iteration]
            turn_tokens = sum(entry.tokens for entry in turn)
            window = self.config.transcript_window
            entries_room = window - int(self.config.trim_to_fraction * window) if window else len(turn) + 1
            if answer.token_budget == budget and summary_tokens + turn_tokens <= room and \
                    1 + len(turn) <= entries_room:
                assert ref in refs, f"the summary asked for and recorded ({ref}, {summary_tokens} tokens, the " \
                                    f"turn's {len(turn)} events {turn_tokens}, room {room} tokens and " \
                                    f"{entries_room} entries) is fed at iteration {answer.iteration}"
                type(self).summaries_fed += 1
            run.asked = None

    def check_model(self, run: HostRun, answer: pb.AssembleContextResponse, log: list[pb.StoredEvent],
                    max_tokens: int | None) -> None:
        records = [{"seq": e.seq, "event_id": e.event_id, "iteration": e.iteration, "role": e.role, "type": e.type,
                    "content": e.content, "call_id": e.call_id, "tool_name": e.tool_name} for e in log]
        expected = run.model.window(records, answer.iteration, max_tokens)
        entries = list(answer.entries)
        if isinstance(expected, Window):
            assert [e.event_id for e in entries] == [e.event_id for e in expected.entries], (
                "the model chose another window", [e.event_id for e in expected.entries],
                [e.event_id for e in entries])
            for got, want in zip(entries, expected.entries):
                if want.clipped is not None:
                    assert bool(got.clipped_from_tokens) == want.clipped, ("clipped or not", got.event_id)
                if want.text is not None:
                    assert got.text == want.text, ("the model feeds another text", got.event_id)
                else:
                    assert got.tokens <= want.cap, ("a clip within the common cap", got.event_id, got.tokens, want.cap)
            assert answer.omitted_events == expected.omitted_events, ("omitted_events", answer.omitted_events,
                                                                      expected.omitted_events)
        elif isinstance(expected, Refusal):
            raise AssertionError(f"the model refuses ({expected.reason}) where the sidecar answered "
                                 f"{[e.event_id for e in entries]}")
        verbatim = [e for e in entries if e.type != SUMMARY_TYPE]
        if verbatim:
            run.model.remember(answer.iteration, verbatim[0].seq,
                               [(e.event_id, e.text, e.tokens, e.clipped_from_tokens) for e in verbatim], records)

    def check_replay(self, run: HostRun, answer: pb.AssembleContextResponse) -> None:
        """A replay fork is fed, at every iteration it replays, the window its source was fed."""
        replay = run.replay
        if replay is None or replay.departed or answer.iteration not in replay.source_windows:
            return
        assert self.seam(run, answer.iteration) == replay.source_windows[answer.iteration], \
            f"the replay fork {run.run_id} is not fed its source's window at iteration {answer.iteration}"

    def summarise_if_due(self, run: HostRun, answer: pb.AssembleContextResponse) -> None:
        """The host summarises whenever compaction is due, with the candidates it is given."""
        if not self.config.summaries.startswith("host") or not answer.compaction.due:
            return
        rewritten = "REWRITTEN " if run.replay is not None else ""
        candidates = list(answer.compaction.candidate_event_ids)
        # Short, as a host asked for a summary within the room a move leaves would write it.
        text = f"Summary {rewritten}of {len(candidates)} entries."
        try:
            recorded = self.call("RecordSummary", pb.RecordSummaryRequest(
                run_id=run.run_id, iteration=answer.iteration + 1, replaced_event_ids=candidates, summary_text=text))
        except Refused as refused:
            raise AssertionError(f"RecordSummary of the candidates compaction asked for was refused: "
                                 f"{refused.args}") from None
        run.asked = (answer.iteration + 1, recorded.summary_ref, answer.token_budget, recorded.tokens_after)
        type(self).summaries_asked += 1
        run.summary_refs.append(recorded.summary_ref)

    # Between turns.

    @precondition(lambda self: any(run.answers for run in self.runs))
    @rule(index=st.integers(0, 7), back=st.integers(0, 50))
    def reassemble(self, index: int, back: int) -> None:
        """Re-assembling an assembled iteration feeds the window it fed (nothing was added to it)."""
        run = self.pick(index)
        if not run.answers:
            return
        iteration = sorted(run.answers)[-1 - back % len(run.answers)]
        try:
            again = self.reassembled(run, iteration, run.tightened.get(iteration))
        except Refused as refused:
            first = run.answers[iteration]
            needed = {e.event_id for e in first.entries if e.type == SUMMARY_TYPE}
            assert refused.reason == "replay_context_summary_unavailable" and needed & run.deleted, \
                f"re-assembling iteration {iteration} was refused: {refused.args}"
            return
        assert same_window(run.answers[iteration], again), \
            f"re-assembling iteration {iteration} of {run.run_id} fed another window"

    @rule()
    def restart(self) -> None:
        assert self.trio is not None
        self.trio.restarted.restart()

    @precondition(lambda self: len(self.runs) < 6)
    @rule(index=st.integers(0, 7), where=st.floats(0, 1), mode=st.sampled_from(["replay", "replay", "branch"]),
          depart=st.one_of(st.none(), st.integers(0, 4)))
    def fork(self, index: int, where: float, mode: str, depart: int | None) -> None:
        source = self.pick(index)
        log = self.log(source)
        from_seq = round(where * len(log))
        fork = HostRun(f"{source.run_id}.f{len(self.runs)}", self.new_model())
        try:
            self.call("ForkRun", pb.ForkRunRequest(source_run_id=source.run_id, from_seq=from_seq, mode=mode,
                                                   new_run_id=fork.run_id))
        except Refused as refused:
            assert refused.reason == "replay_context_summary_unavailable" and source.deleted, \
                f"ForkRun from {from_seq} was refused: {refused.args}"
            return
        carried = [event for event in log[:from_seq] if event.type not in ("context.summarized", "context.cleared")]
        fork.originals = dict(source.originals)
        fork.iteration = max((event.iteration for event in log[:from_seq]), default=0)
        fork.answers = {i: a for i, a in source.answers.items() if i < fork.iteration or
                        all(event.seq < from_seq for event in log if event.iteration == i)}
        fork.answers = {i: a for i, a in fork.answers.items() if all(e.seq < from_seq for e in a.entries
                                                                      if e.type != SUMMARY_TYPE)}
        # Only the iterations the fork carries keep the budget they were assembled under: a later
        # iteration of the fork is the fork's own turn.
        fork.tightened = {i: tokens for i, tokens in source.tightened.items() if i in fork.answers}
        # The fork carries the windows of the iterations entirely below from_seq, and with them
        # where a cache-stable start stands and which events were clipped.
        fork.model.starts = {i: start for i, start in source.model.starts.items() if i in fork.answers}
        # A clip is the fork's when it carries the window that made it (its re-cut on the next
        # turn, at half the run's budget, the fork makes alike); else the fork never clipped the
        # event: it feeds it whole, or clips it in its own turn of that iteration. The re-cut's
        # bytes are the fork's only when it carries the window that fed them: a later window of
        # the source may have clipped the re-cut again to fit its own turn, which the fork's own
        # turn need not.
        carried_ids = {event.event_id for event in carried}
        fork.model.clips = {event_id: dataclasses.replace(clip) if clip.recut_seen in fork.answers else
                            dataclasses.replace(clip, recut=None, recut_seen=None)
                            for event_id, clip in source.model.clips.items()
                            if event_id in carried_ids and clip.made in fork.answers}
        fork_log = self.log(fork)
        assert carried == [e for e in fork_log if e.type not in ("context.summarized", "context.cleared")], \
            "a fork carries its source's log below from_seq"
        fork.summary_refs = [json.loads(e.content)["summaryRef"] for e in fork_log if e.type == "context.summarized"]
        if mode == "replay":
            rest: dict[int, list[pb.Event]] = {}
            for event in log[from_seq:]:
                if event.type not in ("context.summarized", "context.cleared"):
                    rest.setdefault(event.iteration, []).append(source.originals[event.event_id])
            turns = sorted(rest.items())
            windows = {i: self.seam(source, i) for i, _ in turns if i in source.answers}
            fork.replay = Replay(turns, windows, depart, dict(source.tightened))
        self.runs.append(fork)

    @precondition(lambda self: any(set(run.summary_refs) - run.deleted for run in self.runs))
    @rule(index=st.integers(0, 7), which=st.integers(0, 20))
    def delete_artifact(self, index: int, which: int) -> None:
        with_summaries = [run for run in self.runs if set(run.summary_refs) - run.deleted]
        run = with_summaries[index % len(with_summaries)]
        live = [ref for ref in run.summary_refs if ref not in run.deleted]
        ref = live[which % len(live)]
        self.call("DeleteArtifact", pb.DeleteArtifactRequest(run_id=run.run_id, artifact_id=ref))
        run.deleted.add(ref)

    @precondition(lambda self: bool(self.runs))
    @rule(index=st.integers(0, 7), kind=st.sampled_from(["backwards", "bad_arguments", "too_tight", "summary_gap",
                                                         "active_summary", "unknown_run", "too_many"]))
    def refusal(self, index: int, kind: str) -> None:
        """Requests that must be refused, each writing nothing."""
        run = self.pick(index)
        before = self.log(run)
        iteration = run.iteration + 1
        user = pb.Event(event_id=f"{run.run_id}-refused-{kind}", iteration=iteration, role="user",
                        content="hello " * 30)
        if kind == "backwards" and run.iteration > 1:
            request = pb.AssembleContextRequest(run_id=run.run_id, iteration=run.iteration - 1, append_events=[
                pb.Event(event_id=user.event_id, iteration=run.iteration - 1, role="user", content="late")])
        elif kind == "bad_arguments":
            request = pb.AssembleContextRequest(run_id=run.run_id, iteration=iteration, append_events=[
                pb.Event(event_id=user.event_id, iteration=iteration, role="assistant", type="tool_call",
                         call_id="bad", tool_name="search", content="{not json")])
        elif kind == "too_tight":
            request = pb.AssembleContextRequest(run_id=run.run_id, iteration=iteration, append_events=[user],
                                                max_transcript_tokens=1)
        elif kind == "summary_gap" and len(unsummarised(before)) > 1:
            # The newest event alone, leaving out the older unsummarised ones: a gap.
            request = pb.RecordSummaryRequest(run_id=run.run_id, iteration=iteration,
                                              replaced_event_ids=[unsummarised(before)[-1].event_id],
                                              summary_text="gap")
        elif kind == "active_summary" and before:
            request = pb.RecordSummaryRequest(run_id=run.run_id, iteration=run.iteration,
                                              replaced_event_ids=[e.event_id for e in before], summary_text="all")
        elif kind == "too_many" and self.config.transcript_window:
            request = pb.AssembleContextRequest(run_id=run.run_id, iteration=iteration, append_events=[
                pb.Event(event_id=f"{user.event_id}-{n}", iteration=iteration, role="user", content="x")
                for n in range(self.config.transcript_window + 1)])
        elif kind == "unknown_run":
            request = pb.GetTranscriptWindowRequest(run_id="no-such-run", iteration=1)
        else:
            return
        method = type(request).__name__.removesuffix("Request")
        try:
            self.call(method, request)
        except Refused:
            assert self.log(run) == before, f"a refused {kind} wrote something"
            return
        raise AssertionError(f"{kind} was not refused")
