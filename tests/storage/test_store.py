"""LMDB store: the map grows by itself, a store that cannot grow says so, and writes are atomic."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.errors import StoreFull, ValidationError
from sidecar.settings import ContextSettings
from sidecar.storage.environment import Store
from sidecar.storage.keys import scope
from sidecar.transcript.transcripts import NewEvent, Transcripts
from sidecar.validation import check_id
from tests.helpers import TENANT, rich_error


def test_the_map_grows_before_and_when_it_is_full(tmp_path: Path, counters) -> None:
    store = Store(str(tmp_path / "db"), map_size=1 << 20)
    transcripts = Transcripts(store, counters, ContextSettings(token_counter="chars"))
    text = "x" * 20_000
    for batch in range(40):  # ~800 KB of events per run of the loop body: far past 1 MiB
        transcripts.append_events(TENANT, "run", [NewEvent(f"e{batch}-{i}", batch + 1, "user", "", text)
                                                  for i in range(4)])
    used, size = store.map_usage()
    assert size > 1 << 20 and used <= size
    events, _ = transcripts.list_events(TENANT, "run", 0, 1000)
    assert len(events) == 160 and all(e.content == text for e in events)
    store.close()


def test_a_store_at_its_ceiling_is_full_and_keeps_nothing_of_the_failed_write(tmp_path: Path, counters) -> None:
    store = Store(str(tmp_path / "db"), map_size=1 << 20, max_map_size=1 << 20)
    transcripts = Transcripts(store, counters, ContextSettings(token_counter="chars"))
    transcripts.append_events(TENANT, "run", [NewEvent("first", 1, "user", "", "kept")])
    with pytest.raises(StoreFull):
        transcripts.append_events(TENANT, "run", [NewEvent(f"big{i}", 1, "user", "", "y" * 100_000)
                                                  for i in range(20)])
    events, _ = transcripts.list_events(TENANT, "run", 0, 1000)
    assert [e.event_id for e in events] == ["first"]
    store.close()


def test_the_headroom_a_delete_grew_into_is_given_back_before_the_next_write(tmp_path: Path) -> None:
    """Only deletes may use the last part of max_map_size: once one grew the map into it, the
    next write shrinks the map back to the other writes' ceiling first."""
    store = Store(str(tmp_path / "db"), map_size=1 << 20, max_map_size=2 << 20)
    handle = store.db["runs"]
    filled = 0
    while store.map_usage()[0] < store.map_usage()[1] * 0.8:  # to where the next write would grow the map
        filled += 1
        key = b"fill%d" % filled
        store.write(lambda txn, key=key: txn.put(key, b"x" * 50_000, db=handle))
    writes_ceiling = store.map_usage()[1]
    assert writes_ceiling < 2 << 20
    store.write(lambda txn: txn.delete(b"fill1", db=handle), frees_space=True)
    assert store.map_usage()[1] == 2 << 20  # the delete may use the headroom
    store.write(lambda txn: txn.put(b"after", b"y", db=handle))
    assert store.map_usage()[1] == writes_ceiling
    store.close()


def test_reopening_keeps_what_was_committed(tmp_path: Path, counters) -> None:
    path = str(tmp_path / "db")
    store = Store(path, map_size=1 << 20)
    Transcripts(store, counters, ContextSettings(token_counter="chars")).append_events(
        TENANT, "run", [NewEvent("a", 1, "user", "", "persisted")])
    store.close()
    reopened = Store(path, map_size=1 << 20)
    events, _ = Transcripts(reopened, counters, ContextSettings()).list_events(TENANT, "run")
    assert [e.content for e in events] == ["persisted"]
    reopened.close()


def test_tenant_scopes_are_disjoint() -> None:
    # NUL ends every part and ids never hold NUL, so no scope is a prefix of another tenant's.
    assert not scope("a", b"b").startswith(scope("ab"))
    assert not scope("ab").startswith(scope("a"))
    with pytest.raises(ValidationError):
        check_id("run_id", "a\x00run")  # which is why an id may not hold NUL


def test_a_full_store_still_deletes_and_then_takes_writes_again(start_server) -> None:
    """Writes are refused a little before the ceiling so that a delete, which needs a few pages
    to free many, always has them: a full store can be emptied through the API."""
    import grpc

    from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb

    sidecar = start_server(storage={"map_size": 1 << 20, "max_map_size": 2 << 20})
    stub = sidecar.stub
    text = "z" * 60_000
    full = None
    for run in range(200):  # ~60 KB an event: the 2 MiB ceiling is reached long before this ends
        stub.OpenRun(pb.OpenRunRequest(run_id=f"run{run}", token_counter="chars"))
        try:
            for turn in range(1, 5):
                stub.AppendEvents(pb.AppendEventsRequest(run_id=f"run{run}", events=[
                    pb.Event(event_id=f"e{turn}", iteration=turn, role="user", content=text)]))
        except grpc.RpcError as error:
            full = error
            break
    assert full is not None and full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert rich_error(full)[1] == "store_full"
    # Fill what is left with ever smaller events, so that no page is free at all.
    filler = 0
    for size in (8_000, 1_000, 100, 10):
        try:
            while True:
                filler += 1
                stub.AppendEvents(pb.AppendEventsRequest(run_id="run0", events=[
                    pb.Event(event_id=f"f{filler}", iteration=5, role="user", content="f" * size)]))
        except grpc.RpcError as error:
            assert rich_error(error)[1] == "store_full"
    for deleted in range(run + 1):  # every run, the last (partly written) one included
        stub.DeleteRun(pb.DeleteRunRequest(run_id=f"run{deleted}"))
    stub.OpenRun(pb.OpenRunRequest(run_id="after", token_counter="chars"))
    stub.AppendEvents(pb.AppendEventsRequest(run_id="after", events=[
        pb.Event(event_id="e1", iteration=1, role="user", content=text)]))
    assert [e.event_id for e in stub.ListRunEvents(pb.ListRunEventsRequest(run_id="after")).events] == ["e1"]
