"""The shared store on the deployment PostgreSQL users run for availability: a primary with a
synchronous streaming standby, two ``context-sidecar serve`` processes whose URL lists both hosts
with ``target_session_attrs=read-write``, each with its own LMDB folder. The primary is killed
with SIGKILL while clients write, the standby promoted; then the old primary comes back."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from grpc_health.v1 import health_pb2

from tests.helpers import Postgres, Sidecar, all_events, rich_error

REFUSED = ("UNAVAILABLE", "shared_store_unavailable")
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
CALL_SECONDS = 20  # a hang detector: a call during the failover waits [storage] shared_timeout at most


@pytest.fixture
def cluster() -> Iterator[tuple[Postgres, Postgres, str]]:
    """A primary, its synchronous standby, and the URL that lists both (primary first)."""
    with contextlib.ExitStack() as closing:
        primary = Postgres(replication_slot="standby")
        closing.callback(primary.close)
        standby = Postgres.standby_of(primary)
        closing.callback(standby.close)
        database = primary.database().rsplit("/", 1)[1]
        yield primary, standby, (f"postgresql://postgres@{primary.host},{standby.host}/{database}"
                                 "?target_session_attrs=read-write")


@pytest.fixture
def pair(tmp_path: Path, cluster: tuple[Postgres, Postgres, str]) -> Iterator[tuple[Sidecar, Sidecar]]:
    """Sidecars A and B on the cluster, each with its own LMDB folder."""
    with contextlib.ExitStack() as stopping:  # each one stopped, also when stopping another fails
        started = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            started.append(Sidecar(tmp_path / name, "--shared", cluster[2], "--shared-timeout", "2"))
            stopping.callback(started[-1].stop)
        yield started[0], started[1]


def health(sidecar: Sidecar) -> int:
    return sidecar.health.Check(health_pb2.HealthCheckRequest(), timeout=5).status


def wait_for(condition: Callable[[], bool], seconds: float, what: str | Callable[[], str]) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what if isinstance(what, str) else what()}"
        time.sleep(0.05)


def refusal(error: grpc.RpcError) -> tuple[str, str]:
    """(status code, ErrorInfo reason) of a refused call."""
    code, reason, _ = rich_error(error) if error.trailing_metadata() else (error.code(), "", [])
    return code.name, reason


@dataclass
class Ledger:
    """The test's own record of every write it made: acknowledged (with when), refused (with how)."""

    # kind, writer, number, and when the call was made and when it was answered
    acknowledged: list[tuple[str, str, int, float, float]] = field(default_factory=list)
    refused: list[tuple[str, str, int, tuple[str, str]]] = field(default_factory=list)  # kind, writer, number, why
    refs: dict[tuple[str, int], str] = field(default_factory=dict)  # a summary's ref, by (writer, number)
    refusals: list[tuple[str, str]] = field(default_factory=list)  # of the other calls
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, kind: str, writer: str, number: int, rpc: Callable[..., object], request: object) -> object | None:
        """``rpc(request)``, noted as acknowledged or refused; its answer, None if refused."""
        made = time.monotonic()
        try:
            answer = rpc(request, timeout=CALL_SECONDS)
        except grpc.RpcError as error:
            with self.lock:
                self.refused.append((kind, writer, number, refusal(error)))
            return None
        with self.lock:
            self.acknowledged.append((kind, writer, number, made, time.monotonic()))
        return answer

    def note(self, error: grpc.RpcError) -> None:
        """A refusal of a call that is not a write the ledger follows (a run opened, a turn
        appended before its summary): only how it was refused counts."""
        with self.lock:
            self.refusals.append(refusal(error))

    def count(self, writer: str, after: float = 0.0) -> int:
        """How many writes of ``writer`` (or of its runs, ``writer.N``) were acknowledged after ``after``."""
        with self.lock:
            return sum(1 for _, who, _, made, _ in self.acknowledged if who.split(".")[0] == writer and made > after)


def open_run(stub, run: str) -> None:
    stub.OpenRun(pb.OpenRunRequest(run_id=run, token_counter="o200k_base", summarization_supported=True,
                                   keep_last_turns=1), timeout=CALL_SECONDS)


def event_ids(writer: str, number: int) -> list[str]:
    return [f"{writer}-{number}-{part}" for part in range(3)]


def write_events(stub, ledger: Ledger, writer: str, stop: threading.Event) -> None:
    """AppendEvents of three events a call to the run ``writer``."""
    number = 0
    while not stop.is_set():
        events = [pb.Event(event_id=event_id, iteration=1, role="user", content=f"{event_id}: " + "word " * 20)
                  for event_id in event_ids(writer, number)]
        ledger.call("events", writer, number, stub.AppendEvents, pb.AppendEventsRequest(run_id=writer, events=events))
        number += 1


def write_summaries(stub, ledger: Ledger, writer: str, stop: threading.Event) -> None:
    """A turn of two events, then a RecordSummary replacing them, in a run of ``writer``'s. After a
    refusal it goes on in a new run: a summary replaces the turns after the last one, and whether
    the refused call's turn or summary landed is for the check at the end to find out."""
    number, generation = 0, 0
    run = f"{writer}.{generation}"
    while not stop.is_set():
        turn = [pb.Event(event_id=f"{run}-{number}-u", iteration=number + 1, role="user", content=f"ask {number}"),
                pb.Event(event_id=f"{run}-{number}-a", iteration=number + 1, role="assistant",
                         content=f"answer {number}")]
        answer = None
        try:
            stub.AppendEvents(pb.AppendEventsRequest(run_id=run, events=turn), timeout=CALL_SECONDS)
        except grpc.RpcError as error:
            ledger.note(error)
        else:
            answer = ledger.call("summary", run, number, stub.RecordSummary, pb.RecordSummaryRequest(
                run_id=run, iteration=number + 2, replaced_event_ids=[event.event_id for event in turn],
                summary_text=f"summary {run} {number}"))
        number += 1
        if answer is not None:
            ledger.refs[(run, number - 1)] = answer.summary_ref  # type: ignore[attr-defined]
            continue
        generation += 1
        run, number = f"{writer}.{generation}", 0
        while not stop.is_set():
            try:
                open_run(stub, run)
                break
            except grpc.RpcError as error:
                ledger.note(error)


def write_memory(stub, ledger: Ledger, writer: str, stop: threading.Event) -> None:
    """PutMemory of one entry a call to the memory ref ``writer``."""
    number = 0
    while not stop.is_set():
        ledger.call("memory", writer, number, stub.PutMemory, pb.PutMemoryRequest(
            memory_ref=writer, entry_id=f"e{number}", content=f"fact {writer} {number}", tags=["failover"]))
        number += 1


WRITERS = {"events": write_events, "summary": write_summaries, "memory": write_memory}


def landed(stub, ledger: Ledger) -> dict[tuple[str, str, int], bool]:
    """For each write the ledger holds, whether it is in the store as read through ``stub``; a
    write found in part fails the test (a call lands whole or not at all)."""
    found: dict[tuple[str, str, int], bool] = {}
    writes = {(kind, writer, number) for kind, writer, number, _, _ in ledger.acknowledged} | \
             {(kind, writer, number) for kind, writer, number, _ in ledger.refused}
    logs = {writer: all_events(stub, writer) for kind, writer, _ in writes if kind != "memory"}
    for writer, log in logs.items():
        ids = [event.event_id for event in log]
        assert [event.seq for event in log] == list(range(len(log))), f"a gap in {writer}'s log"
        assert len(ids) == len(set(ids)), f"an event twice in {writer}'s log"
    listed = {writer: {entry.id: entry.content for entry in stub.ListMemory(
        pb.ListMemoryRequest(memory_ref=writer, limit=1000)).entries} for kind, writer, _ in writes if kind == "memory"}
    for kind, writer, number in sorted(writes):
        if kind == "events":
            present = {event.event_id for event in logs[writer]} & set(event_ids(writer, number))
            assert len(present) in (0, 3), f"{writer} {number}: {len(present)} of its 3 events landed"
            found[kind, writer, number] = bool(present)
        elif kind == "summary":
            summaries = [json.loads(event.content) for event in logs[writer] if event.type == "context.summarized"]
            refs = [summary["summaryRef"] for summary in summaries if summary["iteration"] == number + 2]
            if refs:  # the entry landed: so did its artifact, with the whole text
                artifact = stub.GetArtifact(pb.GetArtifactRequest(run_id=writer, artifact_id=refs[0]))
                assert artifact.content == f"summary {writer} {number}"
                assert ledger.refs.get((writer, number), refs[0]) == refs[0]
            found[kind, writer, number] = bool(refs)
        else:
            entry_id = f"e{number}"
            try:
                content = stub.GetMemory(pb.GetMemoryRequest(memory_ref=writer, entry_id=entry_id)).content
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.NOT_FOUND, error
                content = None
            assert listed[writer].get(entry_id) == content, f"{writer} {entry_id}: listed and got differ"
            assert content in (None, f"fact {writer} {number}")
            found[kind, writer, number] = content is not None
    return found


def test_the_primary_killed_mid_write_and_the_standby_promoted_loses_nothing_acknowledged(
        cluster: tuple[Postgres, Postgres, str], pair: tuple[Sidecar, Sidecar]) -> None:
    primary, standby, _ = cluster
    a, b = pair
    writers = {f"{kind}-{name}": (kind, sidecar) for name, sidecar in (("a", a), ("b", b)) for kind in WRITERS}
    for writer, (kind, sidecar) in writers.items():
        if kind != "memory":
            open_run(sidecar.stub, f"{writer}.0" if kind == "summary" else writer)
    ledger, stop = Ledger(), threading.Event()
    threads = [threading.Thread(target=WRITERS[kind], args=(sidecar.stub, ledger, writer, stop))
               for writer, (kind, sidecar) in writers.items()]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: all(ledger.count(writer) >= 10 for writer in writers), 60, "writes before the kill")
        primary.kill_9()  # mid-write: each writer has a call in flight
        killed = time.monotonic()  # after: finding the postmaster's processes takes a while
        wait_for(lambda: health(a) == health(b) == NOT_SERVING, 30, "NOT_SERVING while no primary answers")
        before_promotion = len(ledger.refused)
        promoted = time.monotonic()
        standby.promote()
        wait_for(lambda: health(a) == health(b) == SERVING, 30, "SERVING after the promotion")
        wait_for(lambda: all(ledger.count(writer, after=promoted) >= 5 for writer in writers), 60,
                 lambda: f"every writer's writes accepted through the new primary: {ledger.refused[-12:]}")
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    reasons = {why for _, _, _, why in ledger.refused} | set(ledger.refusals)
    assert reasons == {REFUSED}, f"refusals other than UNAVAILABLE shared_store_unavailable: {reasons}"
    assert before_promotion > 0, "writes in flight at the kill, and those made with no primary, are refused"
    acknowledged = {(kind, writer, number) for kind, writer, number, _, _ in ledger.acknowledged}
    before_kill = {(kind, writer, number) for kind, writer, number, _, answered in ledger.acknowledged
                   if answered < killed}
    through = {name: landed(sidecar.stub, ledger) for name, sidecar in (("A", a), ("B", b))}
    found_a, found_b = ({write for write, present in through[name].items() if present} for name in ("A", "B"))
    assert acknowledged <= found_a, f"acknowledged, not found through A: {sorted(acknowledged - found_a)[:5]}"
    assert acknowledged <= found_b, f"acknowledged, not found through B: {sorted(acknowledged - found_b)[:5]}"
    assert found_a == found_b, "A and B read the same store"
    refused = {(kind, writer, number) for kind, writer, number, _ in ledger.refused}
    # The first write made after the kill that was accepted (a call in flight at the kill may
    # still be acknowledged: the standby had confirmed its commit).
    first_accepted = min(answered for _, _, _, made, answered in ledger.acknowledged if made > killed)
    print(f"failover: {len(acknowledged)} writes acknowledged ({len(before_kill)} before the kill), "
          f"found {len(acknowledged & found_a)} through A and {len(acknowledged & found_b)} through B; "
          f"{len(refused)} refused UNAVAILABLE shared_store_unavailable ({len(refused & found_a)} landed whole, "
          f"{len(refused - found_a)} not at all; {len(ledger.refusals)} other calls refused so); first accepted "
          f"write {first_accepted - killed:.1f} s after the kill ({first_accepted - promoted:.1f} s after the "
          f"promotion, made {promoted - killed:.1f} s after the kill)")


def refused_through(sidecar: Sidecar, calls: dict[str, Callable[[grpc.Channel], object]]) -> dict[str, object]:
    """What each call answered through ``sidecar``: its refusal (code, reason, message), or its answer."""
    answers: dict[str, object] = {}
    for name, call in calls.items():
        try:
            answers[name] = call(sidecar.stub)
        except grpc.RpcError as error:
            answers[name] = (*refusal(error), error.details())
    return answers


def answer_of(sidecar: Sidecar, call: Callable[[grpc.Channel], object]) -> object:
    """What ``call`` answers through ``sidecar`` once the connections it pooled to a server that
    went away are found dead (each refuses one call: the sidecar learns of it by using it)."""
    for _ in range(8):
        answer = refused_through(sidecar, {"call": call})["call"]
        if not (isinstance(answer, tuple) and answer[2].startswith("the shared store did not answer")):
            return answer
    raise AssertionError(f"refused 8 times: {answer!r}")


def test_an_old_primary_started_again_is_never_served_as_current(
        cluster: tuple[Postgres, Postgres, str], pair: tuple[Sidecar, Sidecar]) -> None:
    """After the failover B writes through the new primary and A reads it; then the old primary
    is started again as a primary, on its old timeline and first in the URL's host list (a
    supervisor restarting it). It lacks what was written since the promotion: neither sidecar may
    answer from it, or from its local copy, as if current, nor write to it."""
    primary, standby, _ = cluster
    a, b = pair
    open_run(a.stub, "run")
    a.stub.AppendEvents(pb.AppendEventsRequest(run_id="run", events=[
        pb.Event(event_id=f"old{i}", iteration=1, role="user", content=f"before the failover {i}") for i in range(5)]))
    a.stub.PutMemory(pb.PutMemoryRequest(memory_ref="notes", entry_id="old", content="before the failover"))
    assert len(all_events(b.stub, "run")) == 5  # B holds the run too

    primary.kill_9()
    standby.promote()
    wait_for(lambda: health(a) == health(b) == SERVING, 30, "SERVING after the promotion")

    def append_through_b() -> bool:
        try:
            b.stub.AppendEvents(pb.AppendEventsRequest(run_id="run", events=[
                pb.Event(event_id="new0", iteration=2, role="user", content="after the failover 0")]))
            return True
        except grpc.RpcError as error:
            assert refusal(error) == REFUSED  # a connection to the dead primary, found dead
            return False
    wait_for(append_through_b, 30, "a write through B on the new primary")
    b.stub.AppendEvents(pb.AppendEventsRequest(run_id="run", events=[
        pb.Event(event_id=f"new{i}", iteration=2, role="user", content=f"after the failover {i}") for i in (1, 2)]))
    b.stub.PutMemory(pb.PutMemoryRequest(memory_ref="notes", entry_id="new", content="after the failover"))
    b.stub.PutMemory(pb.PutMemoryRequest(memory_ref="later", entry_id="new", content="only on the new primary"))
    assert answer_of(a, lambda stub: [e.event_id for e in all_events(stub, "run")])[5:] == \
        ["new0", "new1", "new2"]  # type: ignore[index]  # A holds them

    current = {"run": [f"old{i}" for i in range(5)] + [f"new{i}" for i in range(3)], "notes": ["new", "old"]}
    primary.start()  # as a primary, on the old timeline
    database = cluster[2].rsplit("/", 1)[1].split("?")[0]
    old_units = primary.query(database, "SELECT unit, version FROM context_sidecar_units ORDER BY unit")
    # Each sidecar's connections to the new primary go (a network blip, a pool recycling them):
    # the next ones go to the first host that takes writes, the old primary.
    standby.execute("postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
    calls: dict[str, Callable[[grpc.Channel], object]] = {
        "ListRunEvents": lambda stub: [e.event_id for e in stub.ListRunEvents(pb.ListRunEventsRequest(
            run_id="run"), timeout=CALL_SECONDS).events],
        "ListMemory": lambda stub: sorted(e.id for e in stub.ListMemory(pb.ListMemoryRequest(
            memory_ref="notes"), timeout=CALL_SECONDS).entries),
        "GetMemory never held": lambda stub: stub.GetMemory(pb.GetMemoryRequest(
            memory_ref="later", entry_id="new"), timeout=CALL_SECONDS).content,
        "AppendEvents": lambda stub: stub.AppendEvents(pb.AppendEventsRequest(run_id="run", events=[
            pb.Event(event_id="stale", iteration=3, role="user", content="written while the old primary is back")]),
            timeout=CALL_SECONDS),
        "PutMemory": lambda stub: stub.PutMemory(pb.PutMemoryRequest(
            memory_ref="elsewhere", entry_id="stale", content="a ref no sidecar held"), timeout=CALL_SECONDS).entry_id,
    }
    for sidecar in (a, b):
        answers = {name: answer_of(sidecar, call) for name, call in calls.items()}
        for name, answer in answers.items():
            assert isinstance(answer, tuple) and answer[:2] == REFUSED, f"{name} answered {answer!r}"
            assert "timeline" in answer[2] or "version" in answer[2], answer
    wait_for(lambda: health(a) == health(b) == NOT_SERVING, 30, "NOT_SERVING while the old primary answers first")
    assert primary.query(database, "SELECT unit, version FROM context_sidecar_units ORDER BY unit") == old_units, \
        "nothing was written to the old primary"

    # A restarted keeps the timeline it reached in its folder: it refuses to start on the old primary.
    a.stop()
    with pytest.raises(AssertionError, match="on timeline 1, behind timeline 2 that this sidecar reached"):
        Sidecar(a.data.parent, "--shared", cluster[2], "--shared-timeout", "2").stop()

    # The documented way back: the old primary is stopped (to rejoin as a standby); service resumes
    # from the new primary with everything written there.
    primary.stop()
    a = Sidecar(a.data.parent, "--shared", cluster[2], "--shared-timeout", "2")
    try:
        wait_for(lambda: health(a) == health(b) == SERVING, 30, "SERVING once the old primary is gone")
        for sidecar in (a, b):
            assert {"run": answer_of(sidecar, calls["ListRunEvents"]),
                    "notes": answer_of(sidecar, calls["ListMemory"])} == current
    finally:
        a.stop()


def test_a_url_naming_the_standby_alone_is_a_clear_error(tmp_path: Path,
                                                          cluster: tuple[Postgres, Postgres, str]) -> None:
    """The standby takes no writes: a sidecar pointed at it alone says so at start."""
    _, standby, url = cluster
    database = url.rsplit("/", 1)[1].split("?")[0]
    with pytest.raises(AssertionError, match="the shared store's server is a standby, which takes no writes"):
        Sidecar(tmp_path, "--shared", f"postgresql://postgres@{standby.host}/{database}").stop()


def refused_in_time(call: Callable[[], object]) -> tuple[tuple[str, str, str], float]:
    """(code, reason, message) of a call expected to be refused, and the seconds it took: called
    with a deadline far past [storage] shared_timeout (a hang detector), so a call that hangs is
    seen as DEADLINE_EXCEEDED, not as a test that never ends."""
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return (*refusal(refused.value), refused.value.details() or ""), time.monotonic() - started


def test_a_write_the_primary_cannot_replicate_is_refused_and_found_whole_or_not_at_all_later(
        cluster: tuple[Postgres, Postgres, str], pair: tuple[Sidecar, Sidecar]) -> None:
    """The synchronous standby is stopped: the primary holds every COMMIT until it is back. A write
    through A is refused within a bound (its COMMIT may have landed on the primary alone), health
    goes NOT_SERVING, A's own copy never shows the write meanwhile; once the standby is back, both
    sidecars find the write whole or not at all, and the next write lands after it."""
    primary, standby, url = cluster
    a, b = pair
    open_run(a.stub, "run")
    for sidecar, run in ((a, "later-a"), (b, "later-b")):
        open_run(sidecar.stub, run)
    a.stub.AppendEvents(pb.AppendEventsRequest(run_id="run", events=[
        pb.Event(event_id="before", iteration=1, role="user", content="acknowledged with the standby there")]))
    assert [e.event_id for e in all_events(b.stub, "run")] == ["before"]

    standby.stop()
    pending = [pb.Event(event_id=f"pending{i}", iteration=2, role="user", content=f"no standby to confirm it {i}")
               for i in range(3)]
    (code, reason, message), seconds = refused_in_time(lambda: a.stub.AppendEvents(
        pb.AppendEventsRequest(run_id="run", events=pending), timeout=CALL_SECONDS))
    print(f"a write with the synchronous standby gone: refused after {seconds:.1f} s (shared_timeout 2)")
    assert (code, reason) == REFUSED, message
    assert "may or may not have landed" in message, message
    wait_for(lambda: health(a) == health(b) == NOT_SERVING, 30, "NOT_SERVING while the primary cannot commit")
    # Neither sidecar serves the refused write as if it had landed: the store has not made it visible.
    assert [e.event_id for e in all_events(a.stub, "run")] == ["before"]
    assert [e.event_id for e in all_events(b.stub, "run")] == ["before"]
    # Once a commit of a sidecar's waits (A's write; B's first write, as its probe found the
    # heartbeat row locked by A's), the writes that follow are refused having sent nothing: they
    # do not leave one more server process waiting on the primary each.
    def write(sidecar: Sidecar, run: str, number: int) -> tuple[str, str, str]:
        request = pb.AppendEventsRequest(run_id=run, events=[
            pb.Event(event_id=f"refused{number}", iteration=1, role="user", content="not sent")])
        return refused_in_time(lambda: sidecar.stub.AppendEvents(request, timeout=CALL_SECONDS))[0]

    assert write(b, "later-b", 0)[:2] == REFUSED
    database = url.rsplit("/", 1)[1].split("?")[0]
    waiting = f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{database}' AND wait_event = 'SyncRep'"
    waiting_before = primary.query("postgres", waiting)[0][0]
    for number in range(1, 4):
        for sidecar, run in ((a, "later-a"), (b, "later-b")):
            code, reason, message = write(sidecar, run, number)
            assert (code, reason) == REFUSED, message
            assert "Nothing of this call was written" in message, message
    assert primary.query("postgres", waiting)[0][0] == waiting_before, "a refused write left waiting on the primary"

    standby.start()
    wait_for(lambda: health(a) == health(b) == SERVING, 60, "SERVING once the standby is back")
    after = pb.Event(event_id="after", iteration=3, role="user", content="with the standby back")
    answer = answer_of(a, lambda stub: stub.AppendEvents(pb.AppendEventsRequest(run_id="run", events=[after]),
                                                         timeout=CALL_SECONDS))
    assert not isinstance(answer, tuple), f"the next write through A, once the standby is back: {answer!r}"
    through = {name: [e.event_id for e in all_events(sidecar.stub, "run")] for name, sidecar in (("A", a), ("B", b))}
    assert through["A"] == through["B"], through
    landed_ids = [event_id for event_id in through["A"] if event_id.startswith("pending")]
    assert landed_ids in ([], [e.event_id for e in pending]), f"the refused write landed in part: {through['A']}"
    assert through["A"] == ["before", *landed_ids, "after"], through["A"]
    assert [e.event_id for e in all_events(a.stub, "later-a")] == [], "a write refused as not sent landed"
    assert [e.event_id for e in all_events(b.stub, "later-b")] in ([], ["refused0"]), "refused as not sent, landed"
    print(f"the refused write {'landed whole' if landed_ids else 'did not land'}")


def write_left_waiting(sidecar: Sidecar, standby: Postgres) -> grpc.Future:
    """A run opened through ``sidecar``, the standby stopped, then a write to the run, whose COMMIT
    the primary holds until the standby is back: the call, still running."""
    open_run(sidecar.stub, "run")
    standby.stop()
    return sidecar.stub.AppendEvents.future(pb.AppendEventsRequest(run_id="run", events=[
        pb.Event(event_id="pending", iteration=1, role="user", content="no standby to confirm it")]),
        timeout=CALL_SECONDS * 3)


def test_sigterm_while_a_write_waits_for_a_gone_standby_exits_within_the_drain(
        tmp_path: Path, cluster: tuple[Postgres, Postgres, str]) -> None:
    """SIGTERM while a write waits on a COMMIT the primary cannot confirm, with shared_timeout
    longer than drain_seconds: the process exits within the drain and a margin (a hang detector),
    and the caller gets an answer, not a call left hanging."""
    _, standby, url = cluster
    drain = 2.0
    sidecar = Sidecar(tmp_path, "--shared", url, "--shared-timeout", "30", "--drain-seconds", str(drain))
    try:
        waiting = write_left_waiting(sidecar, standby)
        time.sleep(1.5)  # the write waits on its COMMIT, and so does a health probe (one a second)
        assert not waiting.done()
        signalled = time.monotonic()
        sidecar.process.send_signal(signal.SIGTERM)
        try:
            sidecar.process.wait(timeout=drain + 10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {time.monotonic() - signalled:.1f} s after SIGTERM "
                                 f"(drain_seconds {drain}): {sidecar.log()[-2000:]}") from None
        print(f"SIGTERM with a write waiting on its COMMIT: exited after {time.monotonic() - signalled:.1f} s")
        assert sidecar.process.returncode == 0, sidecar.log()[-2000:]
        with pytest.raises(grpc.RpcError) as ended:
            waiting.result(timeout=10)
        assert ended.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED, ended.value
    finally:
        if sidecar.process.poll() is None:
            sidecar.process.kill()
            sidecar.process.wait()
        sidecar.channel.close()


def test_a_commit_whose_wait_for_the_standby_is_cancelled_is_not_acknowledged(
        tmp_path: Path, cluster: tuple[Postgres, Postgres, str]) -> None:
    """Someone cancels the server process waiting for the gone standby (pg_cancel_backend, as an
    operator clearing stuck sessions would): PostgreSQL then answers the COMMIT with a warning and
    success, though the standby never got the write. The sidecar must not acknowledge it."""
    primary, standby, url = cluster
    database = url.rsplit("/", 1)[1].split("?")[0]
    sidecar = Sidecar(tmp_path, "--shared", url, "--shared-timeout", "20")
    try:
        waiting = write_left_waiting(sidecar, standby)
        # The write's server process (health's probe waits too: it wrote no record)
        writer = ("SELECT a.pid FROM pg_stat_activity a WHERE a.wait_event = 'SyncRep' AND EXISTS (SELECT 1 "
                  "FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE l.pid = a.pid "
                  "AND c.relname = 'context_sidecar_records')")
        wait_for(lambda: len(primary.query(database, writer)) == 1, 15, "the write's COMMIT waiting for the standby")
        primary.execute(database, f"SELECT pg_cancel_backend(pid) FROM ({writer}) AS waiting")
        with pytest.raises(grpc.RpcError) as refused:
            waiting.result()
        assert refusal(refused.value) == REFUSED, refused.value
        assert "may or may not have landed" in (refused.value.details() or ""), refused.value.details()
        # It did land on the primary (committed locally): the next call finds it, whole.
        standby.start()
        assert [e.event_id for e in all_events(sidecar.stub, "run")] == ["pending"]
    finally:
        sidecar.stop()
