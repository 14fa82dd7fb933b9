"""Limits that keep one caller from hurting the others, through a real server: caps per
request, deadlines that stop work, pages bounded by bytes, and a log that bad requests cannot
flood."""

from __future__ import annotations

import logging
import re
import threading

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc

from sidecar.errors import ValidationError
from sidecar.settings import ContextSettings
from sidecar.text.encodings import load_encoding
from sidecar.validation import MAX_PAGE_BYTES, MAX_UNBROKEN_RUN
from tests.helpers import Sidecar, call_error, ev, rich_error

TOKEN = "tenant-a-token"


# -- caps per request ---------------------------------------------------------------------------

def test_appends_beyond_the_event_cap_are_refused_naming_the_field(start_server) -> None:
    sidecar = start_server(max_request_events=3)
    four = [ev(f"e{i}", 1) for i in range(4)]
    assert call_error(sidecar.stub.AppendEvents, pb.AppendEventsRequest(run_id="r", events=four)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["events"])
    assert call_error(sidecar.stub.AssembleContext, pb.AssembleContextRequest(
        run_id="r", iteration=1, append_events=four)) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error",
                                                           ["append_events"])
    # Nothing was written: the run does not exist.
    assert call_error(sidecar.stub.ListRunEvents, pb.ListRunEventsRequest(run_id="r"))[0] == grpc.StatusCode.NOT_FOUND
    sidecar.stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=four[:3]))  # at the cap: accepted


def test_appends_beyond_the_byte_cap_are_refused_naming_the_field(start_server) -> None:
    sidecar = start_server(max_request_bytes=2048, max_event_bytes=1024)
    # Each event is under max_event_bytes; together they are one byte over max_request_bytes.
    events = [ev("a", 1, content="x" * 1024), ev("b", 1, content="é" * 512), ev("c", 1, content="y")]
    code = call_error(sidecar.stub.AppendEvents, pb.AppendEventsRequest(run_id="r", events=events))
    assert code == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["events"])
    code = call_error(sidecar.stub.AssembleContext, pb.AssembleContextRequest(run_id="r", iteration=1,
                                                                              append_events=events))
    assert code == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["append_events"])
    assert call_error(sidecar.stub.ListRunEvents, pb.ListRunEventsRequest(run_id="r"))[0] == grpc.StatusCode.NOT_FOUND
    sidecar.stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=events[:2]))  # 2048 bytes: accepted


def test_count_tokens_is_capped_in_texts_and_bytes(start_server) -> None:
    sidecar = start_server(max_request_events=3, max_request_bytes=100, max_event_bytes=50)
    assert call_error(sidecar.stub.CountTokens, pb.CountTokensRequest(texts=["a"] * 4)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["texts"])
    assert call_error(sidecar.stub.CountTokens, pb.CountTokensRequest(texts=["a" * 60, "b" * 41])) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["texts"])
    assert list(sidecar.stub.CountTokens(pb.CountTokensRequest(texts=["a" * 60, "b" * 40], token_counter="chars"))
                .counts) == [60, 40]


def test_default_caps_refuse_what_no_host_sends_in_one_call(start_server) -> None:
    sidecar = start_server()
    defaults = ContextSettings()
    too_many = ["" for _ in range(defaults.max_request_events + 1)]
    assert call_error(sidecar.stub.CountTokens, pb.CountTokensRequest(texts=too_many))[:2] == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error")


# -- deadlines ------------------------------------------------------------------------------------

class Gate:
    """Holds the server inside token counting until the test opens it (the caller has given up by
    then), and tells when the server's handler has returned."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, sidecar, method: str) -> None:
        self.counting, self.open, self.finished = threading.Event(), threading.Event(), threading.Event()
        self.counted = 0
        counters, real_get = sidecar.services.counters, sidecar.services.counters.get
        gate = self

        class HeldCounter:
            def __init__(self, counter) -> None:
                self.counter = counter

            def __getattr__(self, name: str):
                return getattr(self.counter, name)

            def count(self, text: str) -> int:
                gate.counting.set()
                assert gate.open.wait(30)
                gate.counted += 1
                return self.counter.count(text)

        monkeypatch.setattr(counters, "get", lambda name: HeldCounter(real_get(name)))
        owner = sidecar.services.transcripts
        real_method = getattr(owner, method)

        def observed(*args: object, **kwargs: object):
            try:
                return real_method(*args, **kwargs)
            finally:
                self.finished.set()
        monkeypatch.setattr(owner, method, observed)


@pytest.mark.parametrize("call", ["AppendEvents", "AssembleContext"])
def test_a_call_past_its_deadline_stops_and_writes_nothing(start_server, monkeypatch, call) -> None:
    sidecar = start_server()
    gate = Gate(monkeypatch, sidecar, "append_events" if call == "AppendEvents" else "assemble")
    events = [ev(f"e{i}", 1, content=f"event {i} " * 50) for i in range(1000)]
    request = pb.AppendEventsRequest(run_id="r", events=events) if call == "AppendEvents" else \
        pb.AssembleContextRequest(run_id="r", iteration=1, append_events=events)
    with pytest.raises(grpc.RpcError) as raised:
        getattr(sidecar.stub, call)(request, timeout=0.5)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert gate.counting.is_set()  # the server was at work when the caller gave up
    gate.open.set()
    assert gate.finished.wait(30)
    assert call_error(sidecar.stub.ListRunEvents, pb.ListRunEventsRequest(run_id="r"))[0] == grpc.StatusCode.NOT_FOUND


def test_count_tokens_stops_counting_once_its_deadline_passed(start_server, monkeypatch) -> None:
    sidecar = start_server()
    gate = Gate(monkeypatch, sidecar, "list_events")  # CountTokens calls no transcript method
    texts = [f"text {i}" for i in range(1000)]
    with pytest.raises(grpc.RpcError) as raised:
        sidecar.stub.CountTokens(pb.CountTokensRequest(texts=texts, token_counter="o200k_base"), timeout=0.5)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    gate.open.set()
    # The server counts the text it was holding, then stops: the rest is never counted. Waiting
    # for a second call to be served proves the first handler had time to go on (one worker).
    sidecar.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert gate.counted <= 1


# -- pages bounded by bytes -----------------------------------------------------------------------

def test_a_page_of_large_events_is_bounded_by_bytes_and_none_is_lost(start_server) -> None:
    sidecar = start_server(token_counter="chars", transcript_token_budget=100_000_000)
    event_bytes = 1000 * 1024
    sent = [f"big{i}" for i in range(14)]  # ~14 MB: over three times the page bound
    for first in range(0, len(sent), 7):
        sidecar.stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[
            ev(event_id, 1, content=(chr(ord("a") + i % 26) * 1023 + " ") * 1000)
            for i, event_id in enumerate(sent[first:first + 7], first)]))
    received: list[str] = []
    pages, from_seq = 0, 0
    while True:
        page = sidecar.stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r", from_seq=from_seq, limit=1000))
        pages += 1
        assert page.ByteSize() <= MAX_PAGE_BYTES  # which a client with gRPC's default limits reads
        assert page.events, "every page holds at least one event"
        received += [e.event_id for e in page.events]
        if not page.HasField("next_from_seq"):
            break
        from_seq = page.next_from_seq
    assert received == sent
    assert pages >= -(-len(sent) * event_bytes // MAX_PAGE_BYTES)


def test_an_event_larger_than_the_page_bound_still_comes_back_alone(start_server) -> None:
    sidecar = start_server(token_counter="chars", max_event_bytes=MAX_PAGE_BYTES + 1024)
    sidecar.stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[
        ev("huge", 1, content=("h" * 999 + " ") * (MAX_PAGE_BYTES // 1000 + 1)), ev("small", 1)]))
    # A client that takes larger messages than gRPC's default 4 MiB reads it.
    stub = pb_grpc.ContextSidecarStub(grpc.insecure_channel(
        sidecar.address, options=[("grpc.max_receive_message_length", 2 * MAX_PAGE_BYTES)]))
    first = stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r"))
    assert [e.event_id for e in first.events] == ["huge"] and first.next_from_seq == 1
    second = stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r", from_seq=1))
    assert [e.event_id for e in second.events] == ["small"] and not second.HasField("next_from_seq")


def test_list_memory_with_no_bound_answers_at_most_a_page_and_says_what_it_left_out(start_server) -> None:
    """limit 0 and no token_budget: the walk would take the whole ref; the answer stops at the
    page's bytes, names how many chosen entries it left out, and counts only what it holds."""
    sidecar = start_server(memory={"token_counter": "chars"})
    for i in range(80):  # 80 x 60 KB: ~4.8 MB, past the page bound
        sidecar.stub.PutMemory(pb.PutMemoryRequest(memory_ref="big", entry_id=f"m{i:02}",
                                                   content=chr(ord("a") + i % 26) * 60_000))
    listed = sidecar.stub.ListMemory(pb.ListMemoryRequest(memory_ref="big"))
    assert listed.ByteSize() <= MAX_PAGE_BYTES
    assert len(listed.entries) + listed.left_out_for_size == 80 and listed.left_out_for_size > 0
    # Newest first; what is left out is the oldest tail; tokens_used recounts the answer.
    assert [e.id for e in listed.entries] == [f"m{i:02}" for i in range(79, 79 - len(listed.entries), -1)]
    assert listed.tokens_used == sum(len(e.content) for e in listed.entries)
    small = sidecar.stub.ListMemory(pb.ListMemoryRequest(memory_ref="big", limit=3))
    assert len(small.entries) == 3 and small.left_out_for_size == 0


def test_get_state_history_is_bounded_by_bytes_and_keeps_the_newest(start_server) -> None:
    sidecar = start_server(token_counter="chars", transcript_token_budget=100_000_000)
    for i in range(6):  # 6 x 1 MB: past the page bound
        sidecar.stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[
            ev(f"e{i}", 1, content=(chr(ord("a") + i) * 999 + " ") * 1000)]))
    state = sidecar.stub.GetState(pb.GetStateRequest(run_id="r"))
    assert state.history_total == 6 and 1 <= len(state.history) < 6
    assert [e.event_id for e in state.history] == [f"e{i}" for i in range(6 - len(state.history), 6)]
    assert sum(len(e.content) for e in state.history) <= MAX_PAGE_BYTES


def test_memory_events_page_by_count_and_say_where_the_next_page_starts(start_server) -> None:
    sidecar = start_server(compaction={"enabled": True, "interval_seconds": 3600, "keep_recent": 0})
    for round_ in range(3):
        ids = [f"r{round_}a", f"r{round_}b"]
        for entry_id in ids:
            sidecar.stub.PutMemory(pb.PutMemoryRequest(memory_ref="ref", entry_id=entry_id,
                                                       content=f"note {entry_id} about refunds."))
        sidecar.stub.CompactMemory(pb.CompactMemoryRequest(memory_ref="ref", source_ids=ids))
    seen, since, pages = [], 0, 0
    while True:
        page = sidecar.stub.ListMemoryEvents(pb.ListMemoryEventsRequest(since_seq=since, limit=2))
        pages += 1
        seen += [event.seq for event in page.events]
        if not page.HasField("next_since_seq"):
            break
        since = page.next_since_seq
        assert since == page.events[-1].seq
    assert pages == 2 and seen == sorted(set(seen)) and len(seen) == 3


# -- a log that bad requests cannot flood -----------------------------------------------------------

def test_malformed_requests_log_short_rate_limited_lines(start_server, caplog) -> None:
    sidecar = start_server(tenants={"a": TOKEN})
    raw = sidecar.channel.unary_unary("/contextsidecar.v1.ContextSidecar/AppendEvents")  # bytes in, bytes out
    caplog.set_level(logging.INFO)
    codes = set()
    for _ in range(2000):
        with pytest.raises(grpc.RpcError) as raised:
            raw(b"\xff")
        codes.add(raised.value.code())
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT}  # never INTERNAL
    text = caplog.text
    assert len(text) < 4000, f"{len(text)} bytes of log for 2,000 malformed requests"
    assert "Traceback" not in text
    suppressed = [(int(total), int(left)) for total, left in
                  re.findall(r"(\d+) bad requests in the last \d+ s; (\d+) of them not logged", text)]
    assert (1000, 990) in suppressed, text


# -- one unbroken run ---------------------------------------------------------------------------

def test_an_unbroken_run_longer_than_the_limit_is_refused_naming_the_field(start_server) -> None:
    """tiktoken never cuts a run of letters, of whitespace or of symbols into pieces, and its cost
    on one piece grows faster than its length (8 MiB of one word took ~10 s of CPU; 1 MiB of
    spaces overflowed its stack and the call never answered): a longer run is refused."""
    stub = start_server(token_counter="o200k_base", memory={"token_counter": "chars"}).stub
    stub.OpenRun(pb.OpenRunRequest(run_id="r"))
    refused = (grpc.StatusCode.INVALID_ARGUMENT, "validation_error")
    runs = {"letters": "a" * (MAX_UNBROKEN_RUN + 1), "spaces": " " * (MAX_UNBROKEN_RUN + 1),
            "symbols": "!" * (MAX_UNBROKEN_RUN + 1), "ideographs": "日" * (MAX_UNBROKEN_RUN + 1),
            "letters and marks": "e\u0301" * (MAX_UNBROKEN_RUN // 2 + 1),
            "symbols and marks": "!\u0301" * (MAX_UNBROKEN_RUN // 2 + 1)}
    for name, run in runs.items():
        text = f"before {run} after"
        calls = {
            "texts[1]": (stub.CountTokens, pb.CountTokensRequest(token_counter="o200k_base", texts=["fine", text])),
            "events[1].content": (stub.AppendEvents, pb.AppendEventsRequest(run_id="r", events=[
                ev("ok", 1), ev("long", 1, text)])),
            "append_events[1].content": (stub.AssembleContext, pb.AssembleContextRequest(
                run_id="r", iteration=1, append_events=[ev("ok", 1), ev("long", 1, text)])),
            "profile.system_prompt": (stub.UpdateProfile, pb.UpdateProfileRequest(
                run_id="r", profile=pb.Profile(system_prompt=text))),
            "content": (stub.PutMemory, pb.PutMemoryRequest(memory_ref="m", entry_id="e", content=text)),
        }
        for field, (method, request) in calls.items():
            code, reason, fields = call_error(method, request)
            assert (code, reason, fields) == (*refused, [field]), (name, field)
    assert stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r")).events == [], "nothing written"
    # At the limit, and in runs that add up to far more, texts are counted as tiktoken counts them.
    encoding = load_encoding("o200k_base")
    texts = ["a" * MAX_UNBROKEN_RUN, " " * MAX_UNBROKEN_RUN + "x", "!" * MAX_UNBROKEN_RUN,
             ("b" * MAX_UNBROKEN_RUN + " ") * 4, ("日" * 1000 + "。") * 300]
    counts = stub.CountTokens(pb.CountTokensRequest(token_counter="o200k_base", texts=texts)).counts
    assert list(counts) == [len(encoding.encode_ordinary(text)) for text in texts]


@pytest.mark.parametrize("limit", [1, 2, 3, 8, 9])
def test_the_run_check_finds_exactly_the_runs_over_the_limit(monkeypatch, limit: int) -> None:
    """The sampled scan against the plain definition: the longest run of each class, character by
    character, on random texts (a small limit, so that runs cross the samples every way)."""
    import random
    import unicodedata

    from sidecar import validation

    monkeypatch.setattr(validation, "MAX_UNBROKEN_RUN", limit)
    monkeypatch.setattr(validation, "_RUN_STEP", max(1, limit // 2))
    classes = {"letters": lambda c: unicodedata.category(c)[0] in "LM", "whitespace": str.isspace,
               "symbols": lambda c: not c.isspace() and unicodedata.category(c)[0] not in "LN"}

    def longest(text: str, member) -> int:
        best = length = 0
        for char in text:
            length = length + 1 if member(char) else 0
            best = max(best, length)
        return best

    rng = random.Random(limit)
    for _ in range(3000):
        text = "".join(rng.choice("ab \n!?\u0301日7") for _ in range(rng.randrange(0, 40)))
        over = any(longest(text, member) > limit for member in classes.values())
        try:
            validation.check_unbroken_runs("t", text)
            refused = False
        except ValidationError:
            refused = True
        assert refused == over, ascii(text)


# -- long-lived streams -------------------------------------------------------------------------

def test_open_watches_leave_threads_for_the_other_calls(tmp_path) -> None:
    """A WatchEvents stream holds one of the server's max_workers threads for as long as it is
    open. Before: as many watches as threads left none, and every other call waited (here
    CountTokens ran out its 5-second deadline). Watches may take at most half of them; one more
    is refused with RESOURCE_EXHAUSTED (too_many_watches), and a watch closed frees its place."""
    sidecar = Sidecar(tmp_path, "--max-workers", "4")
    try:
        watches = [sidecar.stub.WatchEvents(pb.WatchEventsRequest(), timeout=30) for _ in range(4)]
        outcomes = []
        for watch in watches:
            watch.initial_metadata()  # registered, or refused at once
            outcomes.append(watch.code() if watch.done() else "open")
        answer = sidecar.stub.CountTokens(pb.CountTokensRequest(token_counter="chars", texts=["still here"]),
                                          timeout=5)
        assert list(answer.counts) == [10]
        assert outcomes.count("open") == 2, outcomes
        refused = [watch for watch, outcome in zip(watches, outcomes) if outcome != "open"]
        assert rich_error(refused[0])[:2] == (grpc.StatusCode.RESOURCE_EXHAUSTED, "too_many_watches")
        next(watch for watch, outcome in zip(watches, outcomes) if outcome == "open").cancel()
        again = sidecar.stub.WatchEvents(pb.WatchEventsRequest(), timeout=30)
        again.initial_metadata()
        assert not again.done(), f"a closed watch freed its place: {rich_error(again)}"
        again.cancel()
    finally:
        for watch in watches:
            watch.cancel()
        sidecar.stop()

