"""context_sidecar_client against a real sidecar process, as a host uses it: a 30-turn host loop with
tool calls (parallel ones too) and several runs at once, every count recounted with CountTokens;
a budgeted ListMemory held to the whole-entry rule; RecordSummary when compaction is due; bad
input decoded into code, reason, fields and metadata; retries of UNAVAILABLE for the calls that
are safe to repeat and for no other; the blocking client and its asyncio twin alike."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import random
import re
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, get_type_hints

import grpc
import pytest
from context_sidecar_client import Client, SidecarCallError, errors
from context_sidecar_client.aio import AsyncClient
from context_sidecar_client.calls import IDEMPOTENT, IDEMPOTENT_WHEN, REQUESTS
from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.helpers import TOKENS, Sidecar

COUNTER = "o200k_base"
BUDGET = 1500
WORDS = ["refund", "policy", "kettle", "order", "shipping", "invoice", "customer", "damaged", "clause", "days",
         "warranty", "receipt", "the", "a", "within", "JSON", "{\"id\": 7}", "naïve", "日本", "🙂"]


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """One sidecar with two tenants, memory compaction on (for the watch), for the module."""
    tmp = tmp_path_factory.mktemp("client")
    config = tmp / "sidecar.toml"
    config.write_text("".join(f'[[auth.tenants]]\nid = "{tenant}"\n'
                              f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
                              for tenant, token in TOKENS.items()), encoding="utf-8")
    process = Sidecar(tmp, "--config", str(config), "--compaction-enabled", "--log-level", "WARNING")
    yield process
    process.stop()


@pytest.fixture
def client(sidecar: Sidecar) -> Iterator[Client]:
    with Client(sidecar.address, token=TOKENS["acme"]) as acme:
        yield acme


def say(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def turn_events(run_id: str, turn: int) -> list[dict[str, Any]]:
    """A user message, then none, one or two tool calls (made in parallel: their results come
    back in the other order), then the answer. Plain dicts, as a host writes them."""
    rng = random.Random(f"{run_id}/{turn}")
    events: list[dict[str, Any]] = [{"event_id": f"u{turn}", "role": "user", "content": say(rng, rng.randrange(5, 40))}]
    calls = [f"k{turn}.{n}" for n in range(turn % 3)]
    for call_id in calls:
        events.append({"event_id": f"c-{call_id}", "role": "assistant", "type": "tool_call", "call_id": call_id,
                       "tool_name": "search", "content": json.dumps({"q": say(rng, 3)})})
    for call_id in reversed(calls):
        events.append({"event_id": f"r-{call_id}", "role": "tool", "type": "tool_result", "call_id": call_id,
                       "content": say(rng, rng.randrange(40, 160))})
    events.append({"event_id": f"a{turn}", "role": "assistant", "content": say(rng, rng.randrange(5, 30))})
    return events


def check_turn(answer: pb.AssembleContextResponse, sent: list[dict[str, Any]], recounted: list[int]) -> None:
    """What a host checks of a window: every entry's tokens recount from its text, the total is
    theirs and within the budget, the window is the log's recent tail with the whole active turn,
    and a tool call comes with all its results."""
    assert [entry.tokens for entry in answer.entries] == recounted
    assert answer.token_count == sum(recounted) <= answer.token_budget == BUDGET
    ids = [entry.event_id for entry in answer.entries]
    assert ids == [event["event_id"] for event in sent][-len(ids):]
    assert answer.omitted_events == len(sent) - len(ids)
    assert {event["event_id"] for event in sent if event.get("iteration", answer.iteration) == answer.iteration} \
        <= set(ids)
    fed = {entry.call_id for entry in answer.entries if entry.call_id}
    assert {entry.event_id for entry in answer.entries if entry.call_id in fed} == {
        event["event_id"] for event in sent if event.get("call_id") in fed}


def host_loop(client: Client, run_id: str, turns: int = 30) -> list[pb.AssembleContextResponse]:
    client.open_run(run_id=run_id, token_counter=COUNTER, transcript_token_budget=BUDGET)
    sent: list[dict[str, Any]] = []
    answers = []
    for turn in range(1, turns + 1):
        events = turn_events(run_id, turn)
        answer = client.assemble_context(run_id=run_id, iteration=turn, append_events=events)
        sent += [{**event, "iteration": turn} for event in events]
        recounted = client.count_tokens(token_counter=COUNTER, texts=[entry.text for entry in answer.entries])
        check_turn(answer, sent, list(recounted.counts))
        assert [result.event_id for result in answer.appended] == [event["event_id"] for event in events]
        answers.append(answer)
    return answers


def test_a_30_turn_host_loop_with_tool_calls_recounts(client: Client) -> None:
    with ThreadPoolExecutor(3) as pool:  # one client, three runs at once
        runs = list(pool.map(lambda run_id: host_loop(client, run_id), ["loop-1", "loop-2", "loop-3"]))
    for answers in runs:
        assert answers[-1].omitted_events > 0  # the budget made the window slide: the checks saw a choice
    # A turn re-sent as a retry would send it: the same events answer already_recorded, the same window.
    last = runs[0][-1]
    again = client.assemble_context(run_id="loop-1", iteration=30, append_events=turn_events("loop-1", 30))
    assert all(result.already_recorded for result in again.appended)
    assert (again.entries, again.token_count) == (last.entries, last.token_count)


def test_the_asyncio_client_runs_the_same_host_loop(sidecar: Sidecar) -> None:
    async def loop(client: AsyncClient, run_id: str) -> pb.AssembleContextResponse:
        await client.open_run(run_id=run_id, token_counter=COUNTER, transcript_token_budget=BUDGET)
        sent: list[dict[str, Any]] = []
        for turn in range(1, 31):
            events = turn_events(run_id, turn)
            answer = await client.assemble_context(run_id=run_id, iteration=turn, append_events=events)
            sent += [{**event, "iteration": turn} for event in events]
            recounted = await client.count_tokens(token_counter=COUNTER, texts=[e.text for e in answer.entries])
            check_turn(answer, sent, list(recounted.counts))
        return answer

    async def main() -> list[pb.AssembleContextResponse]:
        async with AsyncClient(sidecar.address, token=TOKENS["globex"]) as client:
            return await asyncio.gather(*(loop(client, f"aloop-{n}") for n in range(3)))

    for last in asyncio.run(main()):
        assert last.omitted_events > 0


def test_a_budgeted_list_memory_returns_whole_entries_only(client: Client) -> None:
    rng = random.Random(5)
    sizes = [30, 4, 260, 45, 12, 70, 1, 25, 90, 8, 33]  # words; 260 alone is over every budget below
    contents = [say(rng, words) for words in sizes]
    for n, content in enumerate(contents):
        client.put_memory(memory_ref="mem:whole", entry_id=f"m{n}", content=content, tags=["t"])
    everything = client.list_memory(memory_ref="mem:whole")
    newest_first = [(entry.id, entry.content) for entry in everything.entries]
    assert newest_first == [(f"m{n}", content) for n, content in reversed(list(enumerate(contents)))]
    tokens = dict(zip([entry_id for entry_id, _ in newest_first], client.count_tokens(
        token_counter=everything.token_counter, texts=[content for _, content in newest_first]).counts, strict=True))
    assert max(tokens.values()) > 200

    for budget in (1, 20, 60, 100, 150, 200, 400):
        answer = client.list_memory(memory_ref="mem:whole", token_budget=budget)
        # The rule, walked here from the recounts: newest first; an entry over the budget on its
        # own is skipped; the walk stops at the first that does not fit in what is left.
        expected, used, left_out = [], 0, 0
        for entry_id, _ in newest_first:
            if tokens[entry_id] > budget:
                left_out += 1
            elif used + tokens[entry_id] <= budget:
                expected.append(entry_id)
                used += tokens[entry_id]
            else:
                left_out += 1
                assert tokens[entry_id] > budget - used  # the next entry would not fit
                break
        assert [entry.id for entry in answer.entries] == expected, budget
        assert [entry.content for entry in answer.entries] == [dict(newest_first)[i] for i in expected]  # whole
        assert [entry.tokens for entry in answer.entries] == [tokens[i] for i in expected]
        assert answer.tokens_used == used <= budget
        assert answer.left_out_for_budget == left_out


def test_record_summary_when_compaction_is_due(client: Client) -> None:
    client.open_run(run_id="summaries", token_counter=COUNTER, transcript_token_budget=BUDGET,
                    summarization_supported=True, keep_last_turns=2)
    sent: list[str] = []
    summaries: dict[str, str] = {}  # summary_ref -> its text
    replaced: set[str] = set()
    recorded_for = 0  # the iteration the newest summary stands in from
    for turn in range(1, 31):
        events = turn_events("summaries", turn)
        answer = client.assemble_context(run_id="summaries", iteration=turn, append_events=events)
        sent += [event["event_id"] for event in events]
        recounted = client.count_tokens(token_counter=COUNTER, texts=[e.text for e in answer.entries]).counts
        assert [entry.tokens for entry in answer.entries] == list(recounted)
        assert answer.token_count == sum(recounted) <= BUDGET
        # Summaries stand in for what they replaced: the replaced events are never fed again,
        # and a summary recorded for this iteration is in its window.
        fed = [entry for entry in answer.entries if entry.type == "context.summary"]
        assert all(summaries[entry.event_id] in entry.text for entry in fed)
        verbatim = [entry.event_id for entry in answer.entries if entry.type != "context.summary"]
        assert not replaced & set(verbatim)
        assert answer.summarized_events + answer.omitted_events == sent.index(verbatim[0])
        if turn == recorded_for:
            assert list(summaries)[-1] in [entry.event_id for entry in fed]
        if answer.compaction.due:
            candidates = list(answer.compaction.candidate_event_ids)
            text = f"Turns up to {turn - 2}: the customer asked about refunds; searches found clauses."
            summary = client.record_summary(run_id="summaries", iteration=turn + 1, replaced_event_ids=candidates,
                                            summary_text=text)
            assert summary.created and summary.tokens_before == answer.compaction.tokens_before
            assert summary.tokens_after == client.count_tokens(token_counter=COUNTER, texts=[text]).counts[0]
            assert client.get_artifact(run_id="summaries", artifact_id=summary.summary_ref).content == text
            summaries[summary.summary_ref] = text
            recorded_for = turn + 1
            replaced |= set(candidates)
    assert len(summaries) >= 2  # compaction came due, and came due again after a summary
    records = client.list_compaction_records(run_id="summaries").records
    assert [r.summary_ref for r in records if r.kind == "summary"] == list(summaries)


def test_bad_input_comes_back_as_code_reason_and_field(sidecar: Sidecar, client: Client,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    client.open_run(run_id="bad", token_counter=COUNTER, transcript_window=2)
    client.append_events(run_id="bad", events=[{"event_id": "e1", "iteration": 3, "role": "user", "content": "x"}])
    with pytest.raises(SidecarCallError) as raised:
        client.append_events(run_id="bad", events=[{"event_id": "e2", "iteration": 3, "role": "user"},
                                                   {"event_id": "e3", "iteration": 2, "role": "user"}])
    error = raised.value
    assert (error.code, error.reason, error.method) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error",
                                                        "AppendEvents")
    assert [field for field, _ in error.field_violations] == ["events[1].iteration"]
    assert "never decrease" in error.field_violations[0][1] and "events[1].iteration" in str(error)

    with pytest.raises(SidecarCallError) as raised:
        client.assemble_context(run_id="bad", iteration=4, append_events=[
            {"event_id": f"w{n}", "role": "user", "content": "y"} for n in range(3)])
    assert (raised.value.code, raised.value.reason, raised.value.metadata) == (
        grpc.StatusCode.FAILED_PRECONDITION, "transcript_window_exceeded",
        {"events_needed": "3", "transcript_window": "2"})

    with caplog.at_level(logging.WARNING, logger="context_sidecar_client"), pytest.raises(SidecarCallError) as raised:
        client.get_transcript_window(run_id="bad", iteration=9)
    assert (raised.value.code, raised.value.reason) == (grpc.StatusCode.NOT_FOUND, "not_found")
    assert caplog.records == []  # a call safe to repeat is retried on UNAVAILABLE only

    with pytest.raises(ValueError, match="no \"budget\" field"):  # a typo fails here, before any call
        client.open_run(run_id="bad", budget=10)

    with Client(sidecar.address) as anonymous, pytest.raises(SidecarCallError) as raised:
        anonymous.count_tokens(token_counter=COUNTER, texts=["x"])
    assert (raised.value.code, raised.value.reason) == (grpc.StatusCode.UNAUTHENTICATED, "unauthenticated")
    with Client(sidecar.address, token=TOKENS["globex"]) as other, pytest.raises(SidecarCallError) as raised:
        other.get_transcript_window(run_id="loop-1", iteration=1)
    assert raised.value.reason == "not_found"  # another tenant's run answers as if it did not exist


def test_each_refusal_raises_the_subclass_of_its_code(sidecar: Sidecar, client: Client) -> None:
    """The manner of the OpenAI and Anthropic SDKs: one class per gRPC code, under SidecarCallError,
    each carrying what the base does."""
    client.open_run(run_id="classes", token_counter=COUNTER, transcript_window=1)
    refusals = {
        errors.InvalidArgumentError: lambda: client.append_events(run_id="classes", events=[{"role": "user"}]),
        errors.NotFoundError: lambda: client.get_transcript_window(run_id="classes", iteration=7),
        errors.FailedPreconditionError: lambda: client.assemble_context(run_id="classes", iteration=1, append_events=[
            {"event_id": f"f{n}", "role": "user", "content": "z"} for n in range(2)]),
        errors.UnauthenticatedError: lambda: anonymous.count_tokens(token_counter=COUNTER, texts=["x"]),
    }
    with Client(sidecar.address) as anonymous:
        for kind, refused in refusals.items():
            with pytest.raises(SidecarCallError) as raised:
                refused()
            assert type(raised.value) is kind and raised.value.reason, (kind, raised.value)
    assert [field for field, _ in raised.value.field_violations] == []
    # Every status but OK has its class, named after it.
    assert {code: kind.__name__ for code, kind in errors.BY_CODE.items()} == {
        code: "CallCancelledError" if code is grpc.StatusCode.CANCELLED
        else "".join(word.capitalize() for word in code.name.split("_")) + "Error"
        for code in grpc.StatusCode if code is not grpc.StatusCode.OK}


def test_the_asyncio_client_decodes_errors_too(sidecar: Sidecar) -> None:
    async def main() -> SidecarCallError:
        async with AsyncClient(sidecar.address, token=TOKENS["acme"]) as client:
            try:
                await client.assemble_context(run_id="abad", iteration=2, append_events=[
                    {"event_id": "x", "role": "user"}, {"event_id": "y", "role": "user", "iteration": 5}])
            except SidecarCallError as error:
                return error
        raise AssertionError("the call succeeded")

    error = asyncio.run(main())
    assert (error.code, error.reason, [field for field, _ in error.field_violations]) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["append_events[1].iteration"])


def test_a_watch_delivers_what_is_committed_after_it_returns(sidecar: Sidecar, client: Client) -> None:
    for n in range(3):
        client.put_memory(memory_ref="mem:watched", entry_id=f"w{n}", content=f"fact {n} about kettles")
    watch = client.watch_events(types=["memory.compacted"])
    done = client.compact_memory(memory_ref="mem:watched", source_ids=["w0", "w1"], summary_text="Kettle facts.")
    notice = next(watch)
    assert (notice.type, json.loads(notice.json)["compactionId"]) == ("memory.compacted", done.compaction_id)
    watch.cancel()
    assert list(watch) == []

    async def main() -> tuple[pb.EventNotice, list[pb.EventNotice]]:
        async with AsyncClient(sidecar.address, token=TOKENS["acme"]) as aclient:
            awatch = await aclient.watch_events()
            await aclient.compact_memory(memory_ref="mem:watched", source_ids=[done.output_id, "w2"])
            first = await awatch.__anext__()
            awatch.cancel()
            return first, [notice async for notice in awatch]

    first, rest = asyncio.run(main())
    assert first.type == "memory.compacted" and rest == []


# Retries: a real sidecar that comes up on the port only once the client says it will retry.

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class StartOnRetry(logging.Handler):
    """Counts the client's retry lines; at the first, starts a sidecar on the port the client
    calls (before the client pauses and tries again)."""

    def __init__(self, tmp_path: Path, port: int, start: bool = True) -> None:
        super().__init__()
        self.tmp_path, self.port, self.start = tmp_path, port, start
        self.retries: list[str] = []
        self.sidecar: Sidecar | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.retries.append(record.getMessage())
        if self.start and self.sidecar is None:
            self.sidecar = Sidecar(self.tmp_path, "--listen", f"127.0.0.1:{self.port}", "--log-level", "WARNING")


@pytest.fixture
def retries(tmp_path: Path) -> Iterator[StartOnRetry]:
    handler = StartOnRetry(tmp_path, free_port())
    logger = logging.getLogger("context_sidecar_client")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    if handler.sidecar:
        handler.sidecar.stop()


def test_a_call_safe_to_repeat_is_retried_until_the_sidecar_is_up(retries: StartOnRetry) -> None:
    with Client(f"127.0.0.1:{retries.port}", retries=8) as client:
        assert list(client.count_tokens(token_counter="chars", texts=["héllo", ""]).counts) == [5, 0]
    assert retries.sidecar is not None and retries.retries[0].startswith("CountTokens: the sidecar is unavailable")


def test_the_asyncio_client_retries_too(retries: StartOnRetry) -> None:
    async def main() -> pb.OpenRunResponse:
        async with AsyncClient(f"127.0.0.1:{retries.port}", retries=8) as client:
            return await client.open_run(run_id="late", token_counter="chars")
    assert asyncio.run(main()).created
    assert retries.sidecar is not None and retries.retries[0].startswith("OpenRun:")


def test_a_put_without_an_id_is_not_retried_one_with_an_id_is(retries: StartOnRetry) -> None:
    with Client(f"127.0.0.1:{retries.port}", retries=8) as client:
        with pytest.raises(SidecarCallError) as raised:  # a repeat could store the entry twice
            client.put_memory(memory_ref="mem:late", content="no id: the sidecar makes one")
        assert (raised.value.code, raised.value.reason, retries.retries, retries.sidecar) == (
            grpc.StatusCode.UNAVAILABLE, "", [], None)
        put = client.put_memory(memory_ref="mem:late", content="named", entry_id="m1")
        assert (put.entry_id, put.replaced) == ("m1", False)
        assert retries.retries and retries.sidecar is not None


def test_the_deadline_bounds_the_retries(retries: StartOnRetry) -> None:
    retries.start = False  # nothing ever listens
    with Client(f"127.0.0.1:{retries.port}", retries=50, timeout=1.0) as client:
        with pytest.raises(SidecarCallError) as raised:
            client.get_capabilities()
    assert raised.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert 1 <= len(retries.retries) < 50


# The method table: one method per RPC, each calling its own.

def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@pytest.mark.parametrize("client_class", [Client, AsyncClient])
def test_every_rpc_has_its_method(client_class: type) -> None:
    service = pb.DESCRIPTOR.services_by_name["ContextSidecar"]
    for method in service.methods:
        wrapper = getattr(client_class, snake(method.name))
        assert f'"{method.name}"' in inspect.getsource(wrapper), method.name
        if not method.server_streaming:
            assert get_type_hints(wrapper)["return"] is getattr(pb, method.output_type.name), method.name
    public = {name for name, _ in inspect.getmembers(client_class, inspect.isfunction) if not name.startswith("_")}
    assert public == {snake(m.name) for m in service.methods} | {"check_health", "close"}
    assert (IDEMPOTENT - {"Health/Check"}) | set(IDEMPOTENT_WHEN) <= set(REQUESTS)
