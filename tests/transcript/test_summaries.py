"""Summaries in the domain, over real LMDB: recording, validating, standing in, compaction."""

from __future__ import annotations

import json

import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.errors import Conflict, ValidationError
from sidecar.text.fencing import fence
from sidecar.transcript import summaries
from sidecar.transcript.schema import run_key, summary_record
from sidecar.transcript.transcripts import NewEvent, Summary, SummaryRequest
from tests.helpers import TENANT, Sidecar, all_events, assemble, ev


def event(event_id: str, iteration: int, content: str = "x" * 10, role: str = "user", type: str = "message",
          call_id: str = "") -> NewEvent:
    return NewEvent(event_id, iteration, role, type, content, call_id)


def log_ids(transcripts, run_id: str = "run") -> list[str]:
    return [e.event_id for e in transcripts.list_events(TENANT, run_id, 0, 1000)[0]]


@pytest.fixture
def run(make_transcripts):
    """A chars run with summarization on, 10 turns of two 10-char events (u<i>, a<i>), assembled."""
    transcripts = make_transcripts(transcript_token_budget=1000, keep_last_turns=2)
    transcripts.open_run(TENANT, "run", token_counter="chars", summarization=True)
    for turn in range(1, 11):
        assemble(transcripts, TENANT, "run", turn, [event(f"u{turn}", turn), event(f"a{turn}", turn, role="assistant")])
    return transcripts


def summarise(transcripts, ids, iteration=11, text="the summary", strategy=""):
    return transcripts.record_summary(TENANT, "run", SummaryRequest(iteration, tuple(ids), text, strategy))


def test_a_summary_is_recorded_announced_and_stands_in(run) -> None:
    summary, entry, created = summarise(run, ["u1", "a1", "u2", "a2"], text="Turns 1-2: greetings.")
    assert created and summary.tokens_before == 40 and summary.tokens_after == len("Turns 1-2: greetings.")
    # The log announces it, after the host's events, with RFC 0111's payload and no text.
    assert log_ids(run)[-1] == entry.event_id and entry.type == "context.summarized"
    assert json.loads(entry.content) == {
        "iteration": 11, "replacedTurns": ["u1", "a1", "u2", "a2"], "summaryRef": summary.ref,
        "tokenCounter": "chars", "tokensBefore": 40, "tokensAfter": 21}
    assert "greetings" not in entry.content
    assert run.get_artifact(TENANT, "run", summary.ref).content == "Turns 1-2: greetings."
    # From iteration 11 on it stands in for the turns it replaced, as the oldest entry.
    window, _ = assemble(run, TENANT, "run", 11, [event("u11", 11)])
    assert window.event_ids == [summary.ref] + [f"{p}{t}" for t in range(3, 11) for p in "ua"] + ["u11"]
    first = window.entries()[0]
    assert (first.event.type, first.text, first.tokens, first.event.role) == (
        "context.summary", "Turns 1-2: greetings.", 21, "system")
    assert window.token_count == sum(e.tokens for e in window.entries())
    # Iterations assembled before it never change.
    assert run.transcript_window(TENANT, "run", 10).event_ids[:2] == ["u1", "a1"]


def test_a_retry_returns_the_same_summary_and_writes_nothing(run) -> None:
    first, _, _ = summarise(run, ["u1", "a1"])
    length = len(log_ids(run))
    again, entry, created = summarise(run, ["u1", "a1"])
    assert (again.ref, created, entry.event_id) == (first.ref, False, log_ids(run)[-1])
    assert len(log_ids(run)) == length
    with pytest.raises(Conflict) as raised:
        summarise(run, ["u1", "a1"], text="another text")
    assert raised.value.violations[0].field == "summary_text"


@pytest.mark.parametrize("ids, iteration, field, words", [
    (["u1", "nope"], 11, "replaced_event_ids[1]", "not an event"),
    (["a1", "u2"], 11, "replaced_event_ids[0]", "not the next unsummarised"),
    (["u1", "u2"], 11, "replaced_event_ids[1]", "not the next unsummarised"),
    ([f"{p}{t}" for t in range(1, 11) for p in "ua"], 11, "replaced_event_ids[18]", "floor"),
    (["u1"], 10, "iteration", "not yet assembled"),
    (["sidecar:summary:0:abc", "u1"], 11, "replaced_event_ids[0]", "only recursive"),
])
def test_invalid_ranges_name_the_offending_ids_and_write_nothing(run, ids, iteration, field, words) -> None:
    length = len(log_ids(run))
    with pytest.raises(ValidationError) as raised:
        summarise(run, ids, iteration=iteration)
    fields = [v.field for v in raised.value.violations]
    assert field in fields, fields
    assert words in raised.value.message
    assert len(log_ids(run)) == length


def test_the_verbatim_floor_is_the_larger_of_turns_and_tokens(make_transcripts) -> None:
    transcripts = make_transcripts(transcript_token_budget=1000, keep_last_turns=1, keep_last_tokens=35)
    transcripts.open_run(TENANT, "run", token_counter="chars", summarization=True)
    for turn in range(1, 5):
        assemble(transcripts, TENANT, "run", turn, [event(f"u{turn}", turn), event(f"a{turn}", turn)])
    # keep_last_turns=1 protects turn 5 (empty); 35 tokens protect a4, u4, a3 and u3 (40 >= 35).
    with pytest.raises(ValidationError) as raised:
        summarise(transcripts, ["u1", "a1", "u2", "a2", "u3"], iteration=5)
    assert [v.field for v in raised.value.violations] == ["replaced_event_ids[4]"]
    assert summarise(transcripts, ["u1", "a1", "u2", "a2"], iteration=5)[2]


def test_a_tool_call_is_never_split_from_its_result(make_transcripts) -> None:
    transcripts = make_transcripts(transcript_token_budget=1000, keep_last_turns=1)
    transcripts.open_run(TENANT, "run", token_counter="chars", summarization=True)
    assemble(transcripts, TENANT, "run", 1, [event("u1", 1), event("c1", 1, call_id="k", type="tool_call"),
                                            event("r1", 1, role="tool", call_id="k", type="tool_result")])
    assemble(transcripts, TENANT, "run", 2, [event("u2", 2)])
    with pytest.raises(ValidationError) as raised:
        summarise(transcripts, ["u1", "c1"], iteration=3)
    assert "'r1'" in raised.value.message
    assert summarise(transcripts, ["u1", "c1", "r1"], iteration=3)[2]


def test_a_run_without_summarization_refuses_summaries(make_transcripts) -> None:
    transcripts = make_transcripts(token_counter="chars")
    assemble(transcripts, TENANT, "plain", 1, [event("u1", 1)])
    with pytest.raises(ValidationError) as raised:
        transcripts.record_summary(TENANT, "plain", SummaryRequest(2, ("u1",), "s", ""))
    assert raised.value.violations[0].field == "run_id"


def test_summaries_stack_and_recursive_ones_fold_the_previous_in(run) -> None:
    first, _, _ = summarise(run, ["u1", "a1"], text="one")
    second, _, _ = summarise(run, ["u2", "a2"], text="two")
    window, _ = assemble(run, TENANT, "run", 11)
    assert window.event_ids[:3] == [first.ref, second.ref, "u3"]
    with pytest.raises(ValidationError):  # a sliding-window summary cannot replace summaries
        summarise(run, [second.ref, "u3", "a3"], iteration=12, text="three")
    with pytest.raises(ValidationError):  # only the newest summaries, in order
        summarise(run, [first.ref, "u3", "a3"], iteration=12, text="three", strategy="recursive")
    third, _, _ = summarise(run, [second.ref, "u3", "a3"], iteration=12, text="one two three", strategy="recursive")
    assert third.replaced_turns == (second.ref, "u3", "a3") and third.tokens_before == 3 + 20
    window, _ = assemble(run, TENANT, "run", 12)
    assert window.event_ids[:3] == [first.ref, third.ref, "u4"]
    ranges = run.transcript_window(TENANT, "run", 12).summarized_ranges
    assert [(r.summary_ref, r.replaced_turns) for r in ranges] == [
        (first.ref, ("u1", "a1")), (third.ref, (second.ref, "u3", "a3"))]
    # The window of iteration 11 still has what it had.
    assert run.transcript_window(TENANT, "run", 11).event_ids[:3] == [first.ref, second.ref, "u3"]


def test_a_recorded_summary_reads_back_as_its_record_parsed_afresh(run) -> None:
    """What the call recorded is kept as its record's parse (so the next call of the run does not
    parse it): it must be what parsing the stored bytes gives."""
    first, _, _ = summarise(run, ["u1", "a1"], text="one")
    second, _, _ = summarise(run, [first.ref, "u2", "a2"], text="one two", strategy="recursive")
    with run._store.read() as txn:
        for recorded in (first, second):
            stored = summary_record(txn, run._db, run_key(TENANT, "run"), recorded.index)
            assert Summary.parse(stored) == summaries._parse(stored) == recorded


def test_a_run_opened_again_walks_its_own_summaries(make_transcripts) -> None:
    """The summaries met walking down a stack are kept by run incarnation: a run deleted and
    opened again under its id, with other summaries at the same places, feeds its own."""
    transcripts = make_transcripts(transcript_token_budget=1000, keep_last_turns=1)

    def life(name: str) -> list[str]:
        transcripts.open_run(TENANT, "run", token_counter="chars", summarization=True)
        for turn in range(1, 7):
            assemble(transcripts, TENANT, "run", turn, [event(f"u{turn}", turn), event(f"a{turn}", turn)])
        refs = [summarise(transcripts, [f"u{turn}", f"a{turn}"], iteration=7, text=f"{name} {turn}")[0].ref
                for turn in (1, 2, 3)]
        window, _ = assemble(transcripts, TENANT, "run", 7, [event("u7", 7)])
        assert window.event_ids[:3] == refs
        return [entry.text for entry in window.entries()[:3]]

    assert life("first") == ["first 1", "first 2", "first 3"]
    transcripts.delete_run(TENANT, "run")
    assert life("second") == ["second 1", "second 2", "second 3"]


def test_compaction_is_signalled_and_its_candidates_are_accepted(make_transcripts) -> None:
    # A turn is u (10 chars), c (10) and r, a tool result: fed inside the untrusted-data block.
    turn_tokens = 20 + len(fence("x" * 10))
    budget = turn_tokens * 20 // 3  # compaction is due past 0.75 of it: 5 turns
    transcripts = make_transcripts(transcript_token_budget=budget, keep_last_turns=2, compaction_fraction=0.75)
    transcripts.open_run(TENANT, "run", token_counter="chars", summarization=True)
    signals = []
    for turn in range(1, 9):
        window, _ = assemble(transcripts, TENANT, "run", turn, [
            event(f"u{turn}", turn), event(f"c{turn}", turn, type="tool_call", call_id=f"k{turn}"),
            event(f"r{turn}", turn, role="tool", type="tool_result", call_id=f"k{turn}")])
        signals.append(window.compaction)
    assert not signals[0].due and signals[-1].due  # 8 turns > 5 turns' worth
    due = signals[-1]
    # All that lies before the recent turns, in one step, groups whole: turns 7-8 are the verbatim
    # floor, and turns 5-6 fit with them in trim_to_fraction (0.6) of the budget, 4 turns' worth.
    assert due.candidate_ids == tuple(f"{kind}{turn}" for turn in range(1, 5) for kind in "ucr")
    assert due.tokens_before == 4 * turn_tokens
    summary, _, _ = transcripts.record_summary(TENANT, "run", SummaryRequest(9, due.candidate_ids, "s" * 20, ""))
    assert summary.tokens_before == 4 * turn_tokens
    window, _ = assemble(transcripts, TENANT, "run", 9, [event("u9", 9)])
    assert window.event_ids[0] == summary.ref and window.token_count == 20 + 4 * turn_tokens + 10
    # Not due again until a trigger's worth (5 turns) of transcript came after the summary; then
    # the candidates start where the summary ended.
    assert not window.compaction.due
    for turn in range(10, 15):
        window, _ = assemble(transcripts, TENANT, "run", turn, [
            event(f"u{turn}", turn), event(f"c{turn}", turn, type="tool_call", call_id=f"k{turn}"),
            event(f"r{turn}", turn, role="tool", type="tool_result", call_id=f"k{turn}")])
        assert window.compaction.due == (turn == 14), turn  # u9 and turns 10-14 pass 5 turns' worth
    assert window.compaction.candidate_ids[:4] == ("u5", "c5", "r5", "u6")


def test_the_built_in_summariser_keeps_a_long_run_in_budget(make_transcripts, counters) -> None:
    transcripts = make_transcripts(transcript_token_budget=300, keep_last_turns=2, summariser="extractive",
                                   window_policy="max_fill")
    transcripts.open_run(TENANT, "run", token_counter="o200k_base", summarization=True)
    count = counters.get("o200k_base").count
    summaries = []
    for turn in range(1, 41):
        window, _ = assemble(transcripts, TENANT, "run", turn, [
            event(f"u{turn}", turn, f"Question {turn}: how should the agent handle case {turn * 13}?"),
            event(f"a{turn}", turn, f"Answer {turn}: it follows policy {turn % 7} and logs the outcome.",
                  role="assistant")])
        assert window.token_count == sum(count(e.text) for e in window.entries()) <= 300
        assert f"u{turn}" in window.event_ids and f"a{turn - 1}" in window.event_ids[1:] if turn > 1 else True
        summaries += [e for e in window.entries() if e.event.type == "context.summary"]
    assert summaries, "the sidecar summarised by itself, and its summaries were fed"
    assert summaries[0].text.startswith("Summary of ")
    assert transcripts.get_artifact(TENANT, "run", summaries[0].event.event_id).content == summaries[0].text
    assert any(e.type == "context.summarized" for e in transcripts.list_events(TENANT, "run", 0, 1000)[0])


# The log's per-chunk arrays (``counts``, ``id_chunks``): every entry appended rewrites its chunk's,
# whatever it is, and a chunk holds at most CHUNK_EVENTS entries, so their size follows the entry's
# place in its chunk, never how many summaries came before.
LOG_CHUNKS = ("counts", "id_chunks")


def store_records(store) -> dict[tuple[str, bytes], bytes]:
    with store.read() as txn:
        return {(name, key): value for name, handle in store.db.items() if name not in LOG_CHUNKS
                for key, value in txn.cursor(db=handle)}


def test_the_records_a_summary_writes_do_not_grow_with_the_summaries_before_it(start_server) -> None:
    """200 sliding-window summaries in force: what the 200th RecordSummary wrote (every record it
    added or changed, recounted by reading the whole store before and after it) is no larger than
    what the 10th wrote, give or take the digits of the longer index."""
    sidecar = start_server(token_counter="chars", transcript_token_budget=100_000, keep_last_turns=1,
                           summarization=True)
    stub = sidecar.stub
    stub.AppendEvents(pb.AppendEventsRequest(run_id="long", events=[
        pb.Event(event_id=f"e{i}", iteration=1, role="user", content=f"Question {i:04d} about the order.")
        for i in range(210)]))
    stub.AssembleContext(pb.AssembleContextRequest(run_id="long", iteration=1))
    written = {}
    for index in range(200):
        before = store_records(sidecar.services.store) if index + 1 in (10, 200) else None
        recorded = stub.RecordSummary(pb.RecordSummaryRequest(
            run_id="long", iteration=index + 2, replaced_event_ids=[f"e{index}"],
            summary_text=f"Summary {index:04d}: the customer asked about an order."))
        assert recorded.created
        if before is not None:
            after = store_records(sidecar.services.store)
            changed = {at: value for at, value in after.items() if before.get(at) != value}
            assert ("artifacts", b"default\0long\0" + recorded.summary_ref.encode()) in changed
            written[index + 1] = sum(len(key) + len(value) for (_, key), value in changed.items())
    assert written[200] <= written[10] * 1.2, written
    # Every summary is still in force and fed, oldest first, after the last one's.
    window = stub.AssembleContext(pb.AssembleContextRequest(run_id="long", iteration=202))
    fed = [e.text for e in window.entries if e.type == "context.summary"]
    assert fed == [f"Summary {index:04d}: the customer asked about an order." for index in range(200)]
    assert list(window.event_ids[200:]) == [f"e{i}" for i in range(200, 210)]


def test_a_run_recorded_with_the_first_summary_layout_reads_back_the_same(start_server) -> None:
    """Two identical runs; one's summary records are rewritten as the first layout wrote them (a
    JSON object holding the whole stack in force). Both then feed the same windows, show the same
    running summary, and take a new summary on top of the old records alike."""
    sidecar = start_server(token_counter="chars", transcript_token_budget=100_000, keep_last_turns=1,
                           summarization=True)
    stub = sidecar.stub
    texts = [f"Summary {index}: what was said." for index in range(6)]
    refs: dict[str, list[str]] = {}
    for run_id in ("current", "first-layout"):
        stub.AppendEvents(pb.AppendEventsRequest(run_id=run_id, events=[
            pb.Event(event_id=f"e{i}", iteration=1, role="user", content=f"Question {i}.") for i in range(20)]))
        stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=1))
        refs[run_id] = [stub.RecordSummary(pb.RecordSummaryRequest(
            run_id=run_id, iteration=index + 2, replaced_event_ids=[f"e{index}"],
            summary_text=texts[index])).summary_ref
            for index in range(5)]
        refs[run_id].append(stub.RecordSummary(pb.RecordSummaryRequest(
            run_id=run_id, iteration=7, strategy="recursive", replaced_event_ids=[refs[run_id][4], "e5"],
            summary_text=texts[5])).summary_ref)
    # The stacks in force once each was recorded: 0; 0 1; ... 0 1 2 3 4; then 5 replaces 4.
    stacks = [list(range(index + 1)) for index in range(5)] + [[0, 1, 2, 3, 5]]
    store = sidecar.services.store
    key = b"default\0first-layout\0"

    def first_layout(txn) -> None:
        for index, stack in enumerate(stacks):
            stored = txn.get(key + index.to_bytes(4, "big"), db=store.db["summaries"])
            fields = json.loads(stored[stored.index(b"{"):])
            del fields["below"], fields["depth"]
            fields.update(stack=stack, stack_tokens=[len(texts[i]) for i in stack],
                          stack_refs=[refs["first-layout"][i] for i in stack])
            txn.put(key + index.to_bytes(4, "big"), json.dumps(fields).encode(), db=store.db["summaries"])

    store.write(first_layout)
    with store.read() as txn:
        assert txn.get(key + (5).to_bytes(4, "big"), db=store.db["summaries"]).startswith(b"{")

    def fed(run_id: str, iteration: int, budget: int | None = None) -> list[tuple[str, str]]:
        answer = stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=iteration,
                                                                max_transcript_tokens=budget))
        return [(e.event_id, e.text) for e in answer.entries]

    assert fed("first-layout", 8) == fed("current", 8)
    assert fed("first-layout", 8)[:5] == [(refs["first-layout"][i], texts[i]) for i in (0, 1, 2, 3, 5)]
    state = {run_id: [s.text for s in stub.GetState(pb.GetStateRequest(run_id=run_id)).running_summary]
             for run_id in refs}
    assert state["first-layout"] == state["current"] == [texts[i] for i in (0, 1, 2, 3, 5)]
    for run_id in refs:  # a recursive summary folding the newest two, recorded over the old records
        stub.RecordSummary(pb.RecordSummaryRequest(
            run_id=run_id, iteration=9, strategy="recursive",
            replaced_event_ids=[refs[run_id][3], refs[run_id][5], "e6"],
            summary_text="Summary 6: folded."))
    assert fed("first-layout", 9) == fed("current", 9)
    assert [text for _, text in fed("first-layout", 9)[:4]] == [texts[0], texts[1], texts[2], "Summary 6: folded."]
    # Under budgets that hold only the newest summaries, the counts read from the old records
    # decide where the window stops, to the token.
    for budget in range(1, 260):
        assert fed("first-layout", 9, budget) == fed("current", 9, budget), budget


def test_each_compaction_record_names_the_task_in_force_when_it_was_recorded(start_server) -> None:
    """A run's compaction records carry its task's id as it was at each summary (UpdateTask
    between them, back to the first task at the end), and a run without a task its own id."""
    stub = start_server(token_counter="chars", transcript_token_budget=100_000, keep_last_turns=1,
                        summarization=True).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="tasked", task=pb.Task(task_id="task-1", goal="Refunds.")))
    for run_id in ("tasked", "untasked"):
        stub.AppendEvents(pb.AppendEventsRequest(run_id=run_id, events=[
            pb.Event(event_id=f"e{i}", iteration=1, role="user", content=f"Question {i}.") for i in range(6)]))
        stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=1))

    def summarise(run_id: str, index: int) -> None:
        stub.RecordSummary(pb.RecordSummaryRequest(run_id=run_id, iteration=index + 2,
                                                   replaced_event_ids=[f"e{index}"], summary_text=f"Summary {index}."))

    for index, new_task in enumerate((None, "task-2", None, "task-1")):
        if new_task:
            stub.UpdateTask(pb.UpdateTaskRequest(run_id="tasked", task=pb.Task(task_id=new_task, goal="Refunds.")))
        summarise("tasked", index)
    summarise("untasked", 0)

    def task_ids(run_id: str) -> list[str]:
        return [r.task_id for r in stub.ListCompactionRecords(pb.ListCompactionRecordsRequest(run_id=run_id)).records]

    assert task_ids("tasked") == ["task-1", "task-2", "task-2", "task-1"]
    assert task_ids("untasked") == ["untasked"]


def words(tokens: int) -> str:
    """A text of exactly ``tokens`` o200k_base tokens."""
    return "word" + " word" * (tokens - 1)


@pytest.mark.parametrize("own_entry", ["context.summarized", "context.cleared"])
def test_the_sidecars_own_log_entries_weigh_nothing_in_the_compaction_signal(start_server, counters,
                                                                              own_entry: str) -> None:
    """The log entries the sidecar appends itself (a summary's ``context.summarized``, a
    clearing's ``context.cleared``) are not transcript: the protected turns' tokens that the
    compaction signal reports, and compares with the trigger, are their host events' alone, as
    fed, even with such an entry among them. Budget 1,000, trigger 750, keep_last_turns 2."""
    clearing = {"clear_at_least_tokens": 50, "keep_recent": 0} if own_entry == "context.cleared" else \
        {"enabled": False}
    stub = start_server(token_counter="o200k_base", transcript_token_budget=1000, keep_last_turns=2,
                        summarization=True, clearing=clearing).stub
    count = counters.get("o200k_base").count
    if own_entry == "context.summarized":
        # Turn 3 passes the trigger (900); turn 1 is summarised for turn 4, the summary's entry
        # then lying between turns 3 and 4: inside turn 4's protected turns.
        turns = {1: [ev("u1", content=words(300))], 2: [ev("u2", content=words(300))],
                 3: [ev("u3", content=words(300))], 4: [ev("u4", content=words(800))]}
    else:
        # Turn 3 passes the clearing trigger (800) and clears turn 1's result: the clearing's
        # entry lies after turn 3's events, inside turn 4's protected turns.
        turns = {1: [ev("u1", content=words(20)), ev("c1", role="assistant", type="tool_call", call_id="k1",
                                                     tool_name="search", content='{"q": "refunds"}'),
                     ev("r1", role="tool", type="tool_result", call_id="k1", content=words(300))],
                 2: [ev("u2", content=words(20))], 3: [ev("u3", content=words(500))], 4: [ev("u4", content=words(400))]}
    answers = {}
    for turn, events in turns.items():
        answers[turn] = stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn,
                                                                       append_events=events))
        if answers[turn].compaction.due:
            stub.RecordSummary(pb.RecordSummaryRequest(
                run_id="run", iteration=turn + 1, replaced_event_ids=answers[turn].compaction.candidate_event_ids,
                summary_text="Turn 1: a long question."))
    log = all_events(stub, "run")
    own = [e for e in log if e.type == own_entry]
    assert len(own) == 1 and own[0].iteration in (3, 4), [(e.event_id, e.iteration) for e in log]
    # Turn 4's protected turns (3 and 4) hold the sidecar's entry and the host's u3 and u4.
    assert [e.event_id for e in log if e.iteration >= 3] == ["u3", own[0].event_id, "u4"]
    protected = count(turns[3][0].content) + count(turns[4][0].content)
    assert protected > 750
    reason = answers[4].compaction.reason
    assert not answers[4].compaction.due
    assert reason.startswith("protected_turns_exceed_trigger: "), reason
    assert f"hold {protected} tokens, over the compaction trigger of 750" in reason, reason


SIDECAR_FLAGS = ("--token-counter", "o200k_base", "--transcript-token-budget", "1000", "--keep-last-turns", "1",
                 "--summarization", "--clearing-clear-at-least-tokens", "50", "--clearing-keep-recent", "0")


@pytest.mark.parametrize("restart", [False, True], ids=["one-sidecar", "restarted"])
def test_a_clearing_after_a_summary_does_not_bring_the_next_one_forward(tmp_path, counters, restart: bool) -> None:
    """Once a summary is in force, compaction is due again only once more than the trigger's worth
    of transcript (750 of 1,000) came after it: the host's events, as fed (a cleared result at its
    placeholder's count), recounted here. A clearing's ``context.cleared`` entry among them adds
    nothing: at exactly 750 it is not due, one token more and it is. So too on a replay fork from
    after the summary (its ``context.summarized`` entry copied, the clearing made again), and on a
    sidecar restarted on the same folder before the turn at 750."""
    count = counters.get("o200k_base").count
    sidecar = Sidecar(tmp_path, *SIDECAR_FLAGS)
    try:
        def assemble_turn(run_id: str, turn: int, *events: pb.Event) -> pb.AssembleContextResponse:
            return sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=turn,
                                                                          append_events=events))

        for turn in (1, 2):
            assert not assemble_turn("run", turn, ev(f"u{turn}", content=words(300))).compaction.due
        due = assemble_turn("run", 3, ev("u3", content=words(300))).compaction
        assert due.due and list(due.candidate_event_ids) == ["u1"]
        sidecar.stub.RecordSummary(pb.RecordSummaryRequest(
            run_id="run", iteration=4, replaced_event_ids=due.candidate_event_ids,
            summary_text="Turn 1: a long question."))
        # Turn 5 clears turn 4's result (older than the recent turns, the window past the clearing's trigger).
        turns = {4: [ev("u4", content=words(20)), ev("c4", role="assistant", type="tool_call", call_id="k4",
                                                      tool_name="search", content='{"q": "x"}'),
                     ev("r4", role="tool", type="tool_result", call_id="k4", content=words(300))],
                 5: [ev("u5", content=words(400))]}
        since = ("u4", "c4", "r4", "u5")

        def play(run_id: str) -> tuple[pb.AssembleContextResponse, pb.AssembleContextResponse]:
            nonlocal sidecar
            assemble_turn(run_id, 4, *turns[4])
            fifth = assemble_turn(run_id, 5, *turns[5])
            assert [e.type for e in all_events(sidecar.stub, run_id)][-1] == "context.cleared"
            fed = {e.event_id: e.text for e in fifth.entries}
            assert fed["r4"].startswith("[tool result cleared") and not fifth.compaction.due
            if restart and run_id == "run":
                sidecar.stop()
                sidecar = Sidecar(tmp_path, *SIDECAR_FLAGS)
            turns.setdefault(6, [ev("u6", content=words(750 - sum(count(fed[event_id]) for event_id in since)))])
            sixth = assemble_turn(run_id, 6, *turns[6])
            fed = {e.event_id: e.text for e in sixth.entries}
            assert sum(count(fed[event_id]) for event_id in (*since, "u6")) == 750
            return sixth, assemble_turn(run_id, 7, ev("u7", content=words(1)))

        sixth, seventh = play("run")
        log = all_events(sidecar.stub, "run")
        assert (sixth.compaction.due, sixth.compaction.reason) == (False, "")
        assert seventh.compaction.due
        sidecar.stub.ForkRun(pb.ForkRunRequest(source_run_id="run", new_run_id="fork", mode="replay",
                                               from_seq=next(e.seq for e in log if e.event_id == "u4")))
        assert [e.type for e in all_events(sidecar.stub, "fork")][-1] == "context.summarized"
        replayed = play("fork")
        assert [(a.compaction.due, a.compaction.reason) for a in replayed] == [(False, ""), (True, "")]
        assert [list(a.entries) for a in replayed] == [list(a.entries) for a in (sixth, seventh)]
    finally:
        sidecar.stop()
