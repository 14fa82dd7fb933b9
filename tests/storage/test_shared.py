"""The shared store ([storage] shared) with a real PostgreSQL and two sidecar processes, A and B,
each with its own LMDB: what one acknowledges the other reads, a run continues across them, and a
database or a sidecar that goes away loses nothing acknowledged."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from grpc_health.v1 import health_pb2

from sidecar.errors import WriteConflict
from sidecar.storage.environment import CONFLICT_ATTEMPTS, Store
from sidecar.storage.shared import SharedStore, VersionConflict
from tests.helpers import Postgres, Sidecar, all_events, rich_error, seam

BUDGET = 600
TURNS = 40


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    server = Postgres()
    yield server
    server.close()


@pytest.fixture
def pair(tmp_path: Path, postgres: Postgres) -> Iterator[tuple[Sidecar, Sidecar, str]]:
    """Sidecars A and B on one new database, each with its own LMDB folder."""
    url = postgres.database()
    started = [start(tmp_path / name, url) for name in ("a", "b")]
    yield started[0], started[1], url
    for sidecar in started:
        if sidecar.process.poll() is None:
            sidecar.stop()


def start(folder: Path, url: str, *flags: str) -> Sidecar:
    folder.mkdir(exist_ok=True)
    return Sidecar(folder, "--shared", url, "--shared-timeout", "2", *flags)


def turn_events(turn: int) -> list[pb.Event]:
    rng = random.Random(turn)
    words = ["refund", "policy", "order", "shipping", "invoice", "customer", "agent", "tool", "result", "status"]
    say = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
    return [pb.Event(event_id=f"u{turn}", role="user", content=f"Turn {turn}: {say(rng.randrange(8, 30))}?"),
            pb.Event(event_id=f"c{turn}", role="assistant", type="tool_call", call_id=f"k{turn}",
                     content=json.dumps({"tool": "search", "q": say(3)})),
            pb.Event(event_id=f"r{turn}", role="tool", type="tool_result", call_id=f"k{turn}",
                     content="Result: " + say(rng.randrange(20, 90))),
            pb.Event(event_id=f"a{turn}", role="assistant", content=f"Answer {turn}: {say(rng.randrange(5, 25))}.")]


def drive(stub, run_id: str, turns: range, attempt: str) -> dict[int, pb.AssembleContextResponse]:
    """The host's loop: a turn, then a summary whenever the sidecar says compaction is due."""
    answers = {}
    for turn in turns:
        answer = stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=turn,
                                                                append_events=turn_events(turn)))
        answers[turn] = answer
        candidates = list(answer.compaction.candidate_event_ids)
        if answer.compaction.due and candidates:
            stub.RecordSummary(pb.RecordSummaryRequest(
                run_id=run_id, iteration=turn + 1, replaced_event_ids=candidates,
                summary_text=f"Summary ({attempt}) of {len(candidates)} entries: {', '.join(candidates[:6])}."))
    return answers


def open_run(stub, run_id: str) -> None:
    stub.OpenRun(pb.OpenRunRequest(run_id=run_id, token_counter="o200k_base", transcript_token_budget=BUDGET,
                                   keep_last_turns=1, summarization_supported=True))


def fed(answer: pb.AssembleContextResponse) -> tuple:
    """What an answer feeds: the window's events, their count and the compaction advice."""
    return (list(answer.event_ids), answer.token_count, answer.compaction.due,
            list(answer.compaction.candidate_event_ids))


def test_a_run_started_through_a_continues_through_b_with_identical_windows(pair, tmp_path) -> None:
    a, b, _ = pair
    (tmp_path / "alone").mkdir()
    alone = Sidecar(tmp_path / "alone")  # LMDB alone: what the same turns give on one sidecar
    try:
        for stub in (a.stub, alone.stub):
            open_run(stub, "run")
        through_a = drive(a.stub, "run", range(1, 21), "original")
        through_b = drive(b.stub, "run", range(21, TURNS + 1), "original")
        reference = drive(alone.stub, "run", range(1, TURNS + 1), "original")
        summaries = [e for e in all_events(a.stub, "run") if e.type == "context.summarized"]
        assert len(summaries) >= 3, "the run needed summaries, some recorded through A and some through B"
        for turn in range(1, TURNS + 1):
            assert fed((through_a | through_b)[turn]) == fed(reference[turn]), f"turn {turn}"
            assert seam(a.stub, "run", turn) == seam(b.stub, "run", turn) == seam(alone.stub, "run", turn)

        # A replay fork made through B, of the whole run: every window as the source's, and the
        # summaries recorded through A (and B) reused, not written again by the replaying host.
        b.stub.ForkRun(pb.ForkRunRequest(source_run_id="run", from_seq=0, mode="replay", new_run_id="replay"))
        drive(b.stub, "replay", range(1, TURNS + 1), "re-summarised")
        for turn in range(1, TURNS + 1):
            assert seam(b.stub, "replay", turn) == seam(a.stub, "run", turn), f"iteration {turn} differs"
        replayed = all_events(a.stub, "replay")  # and A finds the fork B made
        assert [(e.event_id, e.content) for e in replayed] == [(e.event_id, e.content)
                                                               for e in all_events(b.stub, "run")]
        assert not any("re-summarised" in e.content for e in replayed)
    finally:
        alone.stop()


def test_memory_put_through_a_is_listed_through_b_on_the_very_next_call(pair) -> None:
    a, b, _ = pair
    for i in range(30):
        writer, reader = (a, b) if i % 2 == 0 else (b, a)
        put = writer.stub.PutMemory(pb.PutMemoryRequest(memory_ref="team", content=f"fact number {i}",
                                                        tags=[f"t{i % 3}"]))
        listed = reader.stub.ListMemory(pb.ListMemoryRequest(memory_ref="team", limit=100))
        assert [e.id for e in listed.entries][:1] == [put.entry_id], f"put {i}"
        assert len(listed.entries) == i + 1
        assert reader.stub.GetMemory(pb.GetMemoryRequest(memory_ref="team", entry_id=put.entry_id)).content \
            == f"fact number {i}"
    gone = listed.entries[0].id
    b.stub.DeleteMemory(pb.DeleteMemoryRequest(memory_ref="team", entry_id=gone))
    assert gone not in [e.id for e in a.stub.ListMemory(pb.ListMemoryRequest(memory_ref="team",
                                                                                    limit=100)).entries]


def appender(stub, run_id: str, prefix: str, acknowledged: list[str], refused: list[tuple[str, str]],
             stop: threading.Event, pause: float = 0.0) -> None:
    """Append one event per call until ``stop``, keeping the ids acknowledged and the refusals."""
    i = 0
    while not stop.is_set():
        event_id = f"{prefix}{i}"
        try:
            stub.AppendEvents(pb.AppendEventsRequest(run_id=run_id, events=[
                pb.Event(event_id=event_id, iteration=1, role="user", content=f"{event_id} " + "word " * (i % 40))]),
                timeout=10)
            acknowledged.append(event_id)
        except grpc.RpcError as error:
            if error.trailing_metadata() is None or not any(
                    key == "grpc-status-details-bin" for key, _ in error.trailing_metadata()):
                return  # no answer of the sidecar's: it is gone
            code, reason, _ = rich_error(error)
            refused.append((code.name, reason))
        i += 1
        time.sleep(pause)


def assert_whole_log(stub, run_id: str, acknowledged: list[str], attempted: set[str]) -> list[str]:
    """The log holds every acknowledged event, nothing not attempted, no gap and no duplicate."""
    log = all_events(stub, run_id)
    ids = [e.event_id for e in log]
    assert [e.seq for e in log] == list(range(len(log))), "a gap in the log"
    assert len(ids) == len(set(ids)), "an event twice"
    assert set(acknowledged) <= set(ids), f"lost: {sorted(set(acknowledged) - set(ids))[:5]}"
    assert set(ids) <= attempted
    for event in log:
        number = int(event.event_id.lstrip("ab"))
        assert event.content == f"{event.event_id} " + "word " * (number % 40)
    return ids


def test_every_write_a_acknowledged_before_kill_9_is_read_through_b(pair) -> None:
    a, b, _ = pair
    a.stub.OpenRun(pb.OpenRunRequest(run_id="run", token_counter="o200k_base"))
    acknowledged: list[str] = []
    refused: list[tuple[str, str]] = []
    stop = threading.Event()
    writer = threading.Thread(target=appender, args=(a.stub, "run", "a", acknowledged, refused, stop))
    writer.start()
    deadline = time.monotonic() + 30
    while len(acknowledged) < 150 and time.monotonic() < deadline:
        time.sleep(0.01)
    a.process.send_signal(signal.SIGKILL)  # mid-stream: a call is in flight
    a.process.wait()
    stop.set()
    writer.join()
    assert len(acknowledged) >= 150
    attempted = {f"a{i}" for i in range(len(acknowledged) + len(refused) + 1)}
    found = assert_whole_log(b.stub, "run", acknowledged, attempted)
    print(f"kill -9: {len(acknowledged)} writes acknowledged by A, {len(found)} found through B")
    assert refused == []


def test_a_and_b_writing_the_same_run_at_once_land_whole_or_are_refused(pair) -> None:
    a, b, _ = pair
    a.stub.OpenRun(pb.OpenRunRequest(run_id="run", token_counter="o200k_base"))
    stop = threading.Event()
    results: dict[str, tuple[list[str], list[tuple[str, str]]]] = {"a": ([], []), "b": ([], [])}
    writers = [threading.Thread(target=appender, args=(sidecar.stub, "run", name, *results[name], stop))
               for name, sidecar in (("a", a), ("b", b))]
    for writer in writers:
        writer.start()
    time.sleep(6)
    stop.set()
    for writer in writers:
        writer.join()
    acknowledged = results["a"][0] + results["b"][0]
    refused = results["a"][1] + results["b"][1]
    # A write that lost the run to the other sidecar runs again holding it: neither starves.
    assert min(len(results["a"][0]), len(results["b"][0])) > len(acknowledged) / 4, "both sidecars wrote"
    assert set(refused) <= {("ABORTED", "conflict")}
    attempted = {f"{name}{i}" for name, (ok, no) in results.items() for i in range(len(ok) + len(no))}
    through_a = assert_whole_log(a.stub, "run", acknowledged, attempted)
    assert through_a == assert_whole_log(b.stub, "run", acknowledged, attempted)
    assert sorted(through_a) == sorted(acknowledged), "a refused call wrote something"
    print(f"concurrent: {len(acknowledged)} acknowledged (A {len(results['a'][0])}, B {len(results['b'][0])}), "
          f"{len(refused)} refused, {len(through_a)} in the log")


def serving(sidecar: Sidecar) -> int:
    return sidecar.health.Check(health_pb2.HealthCheckRequest(), timeout=5).status


def wait_for(condition, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_database_stopped_and_started_mid_stream(tmp_path) -> None:
    postgres = Postgres()  # its own server: this test stops it
    sidecars: list[Sidecar] = []
    stop = threading.Event()
    writer = None
    try:
        url = postgres.database()
        a, b = sidecars[:] = [start(tmp_path / "a", url), start(tmp_path / "b", url)]
        a.stub.OpenRun(pb.OpenRunRequest(run_id="run", token_counter="o200k_base"))
        acknowledged: list[str] = []
        refused: list[tuple[str, str]] = []
        writer = threading.Thread(target=appender, args=(a.stub, "run", "a", acknowledged, refused, stop, 0.01))
        writer.start()
        wait_for(lambda: len(acknowledged) >= 50)
        postgres.stop()
        wait_for(lambda: len(refused) >= 5)
        wait_for(lambda: serving(a) == health_pb2.HealthCheckResponse.NOT_SERVING)
        before_restart = len(acknowledged)
        postgres.start()
        restarted = time.monotonic()
        wait_for(lambda: serving(a) == health_pb2.HealthCheckResponse.SERVING)
        wait_for(lambda: len(acknowledged) >= before_restart + 50)
        recovered = time.monotonic() - restarted
        stop.set()
        writer.join()
        assert set(refused) == {("UNAVAILABLE", "shared_store_unavailable")}
        attempted = {f"a{i}" for i in range(len(acknowledged) + len(refused))}
        found = assert_whole_log(b.stub, "run", acknowledged, attempted)
        print(f"database restart: {len(acknowledged)} acknowledged, {len(refused)} refused, {len(found)} found; "
              f"SERVING and 50 more writes {recovered:.1f} s after the database started again")
    finally:
        stop.set()
        if writer:
            writer.join()
        for sidecar in sidecars:
            sidecar.stop()
        postgres.close()


def test_a_lost_local_folder_loses_nothing(pair, tmp_path) -> None:
    a, _, url = pair
    open_run(a.stub, "run")
    drive(a.stub, "run", range(1, 11), "original")
    put = a.stub.PutMemory(pb.PutMemoryRequest(memory_ref="notes", content="kept elsewhere"))
    windows = [seam(a.stub, "run", turn) for turn in range(1, 11)]
    a.stop()
    fresh = start(tmp_path / "new-disk", url)  # a rescheduled host: an empty LMDB folder
    try:
        assert [seam(fresh.stub, "run", turn) for turn in range(1, 11)] == windows
        assert fresh.stub.GetMemory(pb.GetMemoryRequest(memory_ref="notes", entry_id=put.entry_id)).content \
            == "kept elsewhere"
    finally:
        fresh.stop()


def test_a_schema_newer_than_the_sidecar_is_refused(tmp_path, postgres) -> None:
    url = postgres.database()
    first = start(tmp_path / "first", url)
    first.stop()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE context_sidecar_meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(AssertionError, match="schema is version 99; this sidecar knows versions up to 1"):
        start(tmp_path / "second", url)


def test_a_local_folder_of_another_shared_store_is_refused(tmp_path, postgres) -> None:
    start(tmp_path / "a", postgres.database()).stop()
    with pytest.raises(AssertionError, match="local index of another shared store"):
        start(tmp_path / "a", postgres.database())


def test_an_unreachable_database_at_start_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(AssertionError, match=r"\[storage\] shared: the shared store did not answer"):
        start(tmp_path / "a", "postgresql://postgres@127.0.0.1:1/none")


# In one process: every write path reaches the shared store, and the optimistic lock.

COMPACTION = {"enabled": True, "interval_seconds": 3600, "min_entries": 4, "keep_recent": 2}


def snapshot(store: Store) -> dict[tuple[str, bytes], bytes]:
    """Every record of every area's database, keyed by (database, key)."""
    with store.read() as txn:
        return {(name, key): value for name, handle in store.db.items() for key, value in txn.cursor(db=handle)}


def every_kind_of_write(stub) -> None:
    """Each RPC that writes, on runs, their context, memory and the tenant's events."""
    stub.OpenRun(pb.OpenRunRequest(run_id="run", token_counter="o200k_base", transcript_token_budget=300,
                                   keep_last_turns=1, summarization_supported=True))
    for turn in range(1, 9):
        stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn, append_events=turn_events(turn)))
    summary = stub.RecordSummary(pb.RecordSummaryRequest(
        run_id="run", iteration=9, replaced_event_ids=["u1", "c1", "r1"], summary_text="the first turn"))
    stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=9, append_events=turn_events(9)))
    stub.RecordUsage(pb.RecordUsageRequest(run_id="run", iteration=9, input_tokens=500, output_tokens=20))
    stub.PutStateData(pb.PutStateDataRequest(run_id="run", subset="plan", json='{"step": 2}'))
    stub.ForkRun(pb.ForkRunRequest(source_run_id="run", from_seq=10, mode="branch", new_run_id="branch"))
    stub.ForkRun(pb.ForkRunRequest(source_run_id="run", from_seq=0, mode="replay", new_run_id="gone"))
    stub.DeleteRun(pb.DeleteRunRequest(run_id="gone"))
    stub.DeleteArtifact(pb.DeleteArtifactRequest(run_id="run", artifact_id=summary.summary_ref))
    for index in range(8):
        stub.PutMemory(pb.PutMemoryRequest(memory_ref="notes", entry_id=f"m{index}", tags=["policy"],
                                           content=f"remember fact number {index} about the refund policy",
                                           ttl_seconds=3600 if index % 2 else 0))
    stub.DeleteMemory(pb.DeleteMemoryRequest(memory_ref="notes", entry_id="m7"))
    stub.CompactMemory(pb.CompactMemoryRequest(memory_ref="notes"))


def test_every_write_reaches_the_shared_store(start_server, postgres, tmp_path) -> None:
    url = postgres.database()
    sidecar = start_server(storage={"shared": url}, compaction=COMPACTION)
    every_kind_of_write(sidecar.stub)
    written = snapshot(sidecar.services.store)
    assert {name for name, _ in written} >= {"events", "summaries", "windows", "usage", "state_data", "mem_entries",
                                             "mem_df", "mem_compactions", "mem_expiry", "tenant_events"}
    with psycopg.connect(url) as conn:
        units = [bytes(unit) for (unit,) in conn.execute("SELECT unit FROM context_sidecar_units").fetchall()]
    elsewhere = Store(str(tmp_path / "elsewhere"), 16 << 20, shared=SharedStore(url, 1, 5))
    try:
        elsewhere.current(units)  # all of it loaded into an empty local folder
        assert snapshot(elsewhere) == written
    finally:
        elsewhere.close()


def test_a_write_on_a_unit_moved_on_elsewhere_runs_again_on_the_fresh_copy(postgres, tmp_path) -> None:
    url = postgres.database()
    here, there = (Store(str(tmp_path / name), 16 << 20, shared=SharedStore(url, 2, 5)) for name in ("here", "there"))
    key = b"acme\0run\0counter"
    runs: list[str] = []

    def increment(store: Store) -> Callable[[Any], int]:
        db = store.db["state_data"]

        def work(txn) -> int:
            runs.append("ran")
            value = int(txn.get(key, db=db) or b"0") + 1
            txn.put(key, str(value).encode(), db=db)
            return value
        return work

    try:
        assert here.write(increment(here)) == 1
        assert there.write(increment(there)) == 2 and len(runs) == 3  # there held nothing: loaded, ran again
        runs.clear()
        assert here.write(increment(here)) == 3 and len(runs) == 2  # here held version 1, not 2

        # There writes during here's first attempt; here runs again holding the unit, and a write of
        # there's during that attempt waits for it, then runs again on here's result.
        theirs: list[int] = []
        threads: list[threading.Thread] = []
        attempts: list[int] = []

        def moved_on_once(txn) -> int:
            attempts.append(1)
            if len(attempts) == 1:
                there.write(increment(there))  # 4
            elif len(attempts) == 2:  # here's second attempt, holding the unit
                writer = threading.Thread(target=lambda: theirs.append(there.write(increment(there))))
                writer.start()
                writer.join(0.5)
                assert writer.is_alive(), "there's write waits while here holds the unit"
                threads.append(writer)
            return increment(here)(txn)
        assert here.write(moved_on_once) == 5 and len(attempts) == 2
        threads[0].join(10)
        assert theirs == [6]
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version FROM context_sidecar_units").fetchone()[0] == 6
    finally:
        here.close()
        there.close()


def test_a_write_refused_on_every_attempt_writes_nothing(postgres, tmp_path, monkeypatch) -> None:
    """As a serializable engine may refuse every attempt under contention: the call is refused
    ABORTED (WriteConflict) after the last attempt, and no attempt wrote anything."""
    store = Store(str(tmp_path / "here"), 16 << 20, shared=SharedStore(postgres.database(), 1, 5))
    db = store.db["state_data"]
    attempts: list[int] = []

    def refused(held, changes, holding=None):
        attempts.append(1)
        raise VersionConflict(list(changes))
    try:
        store.write(lambda txn: txn.put(b"acme\0run\0x", b"1", db=db))
        monkeypatch.setattr(store.shared, "commit", refused)
        with pytest.raises(WriteConflict):
            store.write(lambda txn: txn.put(b"acme\0run\0x", b"2", db=db))
        assert len(attempts) == CONFLICT_ATTEMPTS
        with store.read() as txn:
            assert txn.get(b"acme\0run\0x", db=db) == b"1"
    finally:
        store.close()


def test_a_write_the_shared_store_would_not_see_is_refused(postgres, tmp_path) -> None:
    store = Store(str(tmp_path / "here"), 16 << 20, shared=SharedStore(postgres.database(), 1, 5))
    db = store.db["state_data"]
    try:
        with pytest.raises(AttributeError, match="not recorded for the shared store"):
            store.write(lambda txn: txn.cursor(db=db).put(b"acme\0run\0x", b"1"))
        with pytest.raises(AttributeError, match="not recorded for the shared store"):
            store.write(lambda txn: txn.replace(b"acme\0run\0x", b"1", db=db))
        assert snapshot(store) == {}
    finally:
        store.close()


def test_what_reaches_the_shared_store_is_redacted(pair) -> None:
    a, _, url = pair
    secret, key = "zebra-quokka-4711", "sk-proj-" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6kL9n"
    a.stub.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id="api", value=secret)]))
    text = f"the password is {secret} and the key {key}"
    a.stub.OpenRun(pb.OpenRunRequest(run_id="run", token_counter="o200k_base"))
    a.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1, append_events=[
        pb.Event(event_id="u1", role="user", content=text),
        pb.Event(event_id="c1", role="assistant", type="tool_call", call_id="k1", tool_name="login",
                 content=json.dumps({"password": secret, "key": key}))]))
    a.stub.PutMemory(pb.PutMemoryRequest(memory_ref="notes", content=text, tags=["creds"]))
    a.stub.PutStateData(pb.PutStateDataRequest(run_id="run", subset="plan", json=json.dumps({"note": text})))
    with psycopg.connect(url) as conn:
        values = [bytes(value) for (value,) in conn.execute(
            "SELECT value FROM context_sidecar_records WHERE value IS NOT NULL").fetchall()]
    assert len(values) > 20
    for clear in (secret, key):
        assert not [value for value in values if clear.encode() in value], f"{clear} reached PostgreSQL"


def test_a_kept_re_assembly_sees_a_summary_deleted_through_the_other_sidecar(pair) -> None:
    """A keeps the answer of a settled iteration that feeds a summary; B deletes the summary's
    artifact; A's next re-assembly of it fails as B's does, not with the answer A kept."""
    a, b, _ = pair
    a.stub.OpenRun(pb.OpenRunRequest(run_id="run", token_counter="o200k_base", summarization_supported=True,
                                     keep_last_turns=1))
    for turn in (1, 2, 3):
        a.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn, append_events=turn_events(turn)))
    ref = a.stub.RecordSummary(pb.RecordSummaryRequest(
        run_id="run", iteration=4, summary_text="Turn 1: a search and its result.",
        replaced_event_ids=[f"{kind}1" for kind in "ucra"])).summary_ref
    for turn in (4, 5):
        a.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn, append_events=turn_events(turn)))
    settled = pb.AssembleContextRequest(run_id="run", iteration=4)
    kept = [a.stub.AssembleContext(settled) for _ in range(2)]
    assert kept[0] == kept[1] and ref in kept[0].event_ids
    b.stub.DeleteArtifact(pb.DeleteArtifactRequest(run_id="run", artifact_id=ref))
    for sidecar in (b, a):
        with pytest.raises(grpc.RpcError) as refused:
            sidecar.stub.AssembleContext(settled)
        assert rich_error(refused.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION,
                                                 "replay_context_summary_unavailable")


def test_a_store_restored_behind_what_a_sidecar_saw_is_refused_not_served(pair) -> None:
    """The database restored from a backup taken before some acknowledged writes (on any engine,
    no timelines involved): each unit's version went back. The sidecar that saw the later writes
    must not serve the restored copy as current, nor write on top of it."""
    a, _, url = pair
    open_run(a.stub, "run")
    a.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1, append_events=turn_events(1)))
    tables = ("context_sidecar_units", "context_sidecar_records")
    with psycopg.connect(url) as conn:
        backup = {table: conn.execute(f"SELECT * FROM {table}").fetchall() for table in tables}
    a.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=2, append_events=turn_events(2)))
    held = [e.event_id for e in all_events(a.stub, "run")]
    with psycopg.connect(url) as conn:  # the restore
        for table, rows in backup.items():
            conn.execute(f"DELETE FROM {table}")
            with conn.cursor() as cursor:
                cursor.executemany(f"INSERT INTO {table} VALUES ({', '.join(['%s'] * len(rows[0]))})", rows)
    calls = {"read": lambda: all_events(a.stub, "run"),
             "write": lambda: a.stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=3,
                                                                               append_events=turn_events(3)))}
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as refused:
            pytest.fail(f"{name} answered {call()}")
        assert rich_error(refused.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "shared_store_unavailable")
        assert "holds version 2 of run 'run' of tenant 'default', behind version 3 that this sidecar saw" \
            in refused.value.details()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT max(version) FROM context_sidecar_units").fetchone()[0] == 2, "written on top"
    assert len(held) == 8
