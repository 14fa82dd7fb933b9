"""LMDB store: the map grows by itself, a store that cannot grow says so, and writes are atomic."""

from __future__ import annotations

import contextvars
import threading
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from sidecar.errors import StoreFull, ValidationError
from sidecar.settings import ContextSettings
from sidecar.storage.environment import Store, after_commit
from sidecar.storage.keys import scope
from sidecar.telemetry import metrics
from sidecar.telemetry.metrics import Metrics
from sidecar.transcript.transcripts import NewEvent, Transcripts
from sidecar.validation import check_id
from tests.helpers import TENANT, CommitsSeen, rich_error


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
        transcripts.append_events(TENANT, "run", [NewEvent(f"big{i}", 1, "user", "", ("y" * 99 + " ") * 1000)
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


def _answered(store: Store, key: bytes, then) -> object:
    handle = store.db["runs"]

    def work(txn) -> bytes:
        txn.put(key, b"value", db=handle)
        return key

    return store.write(work, then=then)


def _stored(store: Store, key: bytes) -> bytes | None:
    with store.read() as txn:
        return txn.get(key, db=store.db["runs"])


@pytest.mark.parametrize("sync", [True, False])
def test_a_writes_answer_is_made_from_its_result_while_a_synced_commit_waits(tmp_path: Path, sync: bool) -> None:
    """With sync on, ``then`` runs on the store's own thread (during the commit, which lets go of
    the GIL), in the caller's context; without sync, after the commit on the caller's thread.
    Either way the call gives its answer with the write committed."""
    store = Store(str(tmp_path / "db"), map_size=1 << 20, sync=sync)
    request = contextvars.ContextVar("request")
    request.set("the caller's")
    seen = []

    def then(key: bytes) -> str:
        seen.append((threading.current_thread() is threading.main_thread(), request.get(None)))
        return f"answer for {key.decode()}"

    assert _answered(store, b"k", then) == "answer for k"
    assert _stored(store, b"k") == b"value"
    assert seen == [(not sync, "the caller's")]
    store.close()


def test_an_answer_that_fails_leaves_its_write_committed_and_says_why(tmp_path: Path) -> None:
    """The answer is made after the write's work (and while it commits): failing, it cannot undo
    the write, so the write stays, and the caller gets the error instead of an answer."""
    store = Store(str(tmp_path / "db"), map_size=1 << 20, sync=True)

    def then(key: bytes) -> str:
        raise ValueError(f"no answer for {key.decode()}")

    with pytest.raises(ValueError, match="no answer for k"):
        _answered(store, b"k", then)
    assert _stored(store, b"k") == b"value"
    answered = []
    assert _answered(store, b"k2", lambda key: answered.append(key) or "next") == "next"
    assert answered == [b"k2"]  # the store's thread is still there for the next write
    store.close()


def test_a_write_run_again_as_the_map_grows_is_answered_once_from_its_last_run(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"), map_size=1 << 20, sync=True)
    handle, runs, answers = store.db["runs"], [], []

    def work(txn) -> int:
        runs.append(len(runs))
        txn.put(b"big", b"x" * (3 << 20), db=handle)  # past the whole map: MDB_MAP_FULL, grown, run again
        return runs[-1]

    last = store.write(work, then=lambda run: answers.append(run) or run)
    assert len(runs) >= 2 and answers == [last] == [runs[-1]]
    store.close()


def _commit_filling(tmp_path: Path) -> tuple[Store, CommitsSeen, int]:
    """A fresh store of a 1 MiB map, watched, and the size of the one value whose write fills its
    map exactly at the commit (every put fitted): the smallest that does not fit at once."""
    trials = iter(range(1_000))

    def first_end(size: int) -> tuple[Store, CommitsSeen, str]:
        store = Store(str(tmp_path / f"trial{next(trials)}"), map_size=1 << 20, sync=True)
        seen = store.env = CommitsSeen(store.env)
        store.write(lambda txn: txn.put(b"big", b"x" * size, db=store.db["runs"]))
        return store, seen, seen.ends[0]

    fits, fills = 1, 1 << 20
    while fills - fits > 1:
        middle = (fits + fills) // 2
        store, _, end = first_end(middle)
        store.close()
        if end == "committed":
            fits = middle
        else:
            fills = middle
    store = Store(str(tmp_path / "filled"), map_size=1 << 20, sync=True)  # fresh, as each trial's was
    seen = store.env = CommitsSeen(store.env)
    return store, seen, fills


def test_a_write_whose_commit_fills_the_map_is_answered_and_counted_from_the_attempt_that_committed(
        tmp_path: Path) -> None:
    """``then`` is made while the commit syncs; when the commit finds the map full the store grows
    it and runs the work again: the answer is the one made from the attempt that committed, and
    what ``then`` recorded (figures, fills of caches) counts for that attempt alone, once."""
    store, seen, size = _commit_filling(tmp_path)
    m, attempts, kept = Metrics(), [], []

    def work(txn) -> int:
        attempts.append(len(attempts))
        txn.put(b"big", b"x" * size, db=store.db["runs"])
        return attempts[-1]

    def then(attempt: int) -> str:
        metrics.summary_recorded("host")
        after_commit(kept.append, attempt)
        return f"made from attempt {attempt}"

    try:
        with m.bound():
            answer = store.write(work, then=then)
        assert seen.ends == ["full at commit", "committed"]
        assert answer == "made from attempt 1" and kept == [1]
        exposition = generate_latest(m.registry).decode()
        assert 'context_sidecar_summaries_total{by="host"} 1.0' in exposition
    finally:
        store.close()


def test_a_write_puts_aside_for_its_commit_only_what_a_committed_attempt_put(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"), map_size=1 << 20, sync=True)
    kept: list[str] = []

    def refused(txn) -> None:
        after_commit(kept.append, "refused")
        raise ValidationError.field("x", "refused after it put something aside")

    try:
        with pytest.raises(ValidationError):
            store.write(refused)
        store.write(lambda txn: after_commit(kept.append, "written"))
        after_commit(kept.append, "outside a write")
        assert kept == ["written", "outside a write"]
    finally:
        store.close()


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
    from context_sidecar_client.v1 import sidecar_pb2 as pb

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
