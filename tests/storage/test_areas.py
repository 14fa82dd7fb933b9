"""Each area of the store (runs, their context, memory, tenant events) owns its databases, and a
delete, fork or compaction touches only its own, even when a run, a memory ref, a memory entry
and a state subset share one name (their keys then have the same shape: tenant NUL name NUL).
"""

from __future__ import annotations

import re
from pathlib import Path

import lmdb
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.storage.databases import AREAS, DATABASES, STORAGE_DATABASES
from sidecar.storage.environment import Store

NAME = "notes"
PREFIX = b"default\0" + NAME.encode() + b"\0"
COMPACTION = {"enabled": True, "interval_seconds": 3600, "min_entries": 4, "keep_recent": 2}


def _snapshot(store: Store) -> dict[tuple[str, bytes], bytes]:
    """Every record of every database, keyed by (database, key)."""
    with store.read() as txn:
        return {(name, key): value for name, handle in store.db.items()
                for key, value in txn.cursor(db=handle)}


def _changed(before: dict, after: dict) -> set[tuple[str, bytes]]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


def _area_of(database: str) -> str:
    return next(area for area, names in AREAS.items() if database.encode() in names)


def _seed(stub) -> str:
    """A run, a memory ref, a memory entry and a state subset all named NAME; the run has a
    summary (an artifact). Returns the summary's ref."""
    stub.OpenRun(pb.OpenRunRequest(run_id=NAME, token_counter="chars", transcript_token_budget=400,
                                   keep_last_turns=1, summarization_supported=True))
    for turn in range(1, 6):
        stub.AppendEvents(pb.AppendEventsRequest(run_id=NAME, events=[
            pb.Event(event_id=f"u{turn}", iteration=turn, role="user", content=f"turn {turn} " * 8)]))
    summary = stub.RecordSummary(pb.RecordSummaryRequest(run_id=NAME, iteration=6, replaced_event_ids=["u1", "u2"],
                                                         summary_text="the first two turns"))
    stub.PutStateData(pb.PutStateDataRequest(run_id=NAME, subset=NAME, json='{"kept": true}'))
    for index in range(8):
        stub.PutMemory(pb.PutMemoryRequest(memory_ref=NAME, entry_id=NAME if index == 0 else f"m{index}",
                                           content=f"remember fact number {index} about the refund policy"))
    return summary.summary_ref


def _memory_ids(stub) -> list[str]:
    return sorted(e.id for e in stub.ListMemory(pb.ListMemoryRequest(memory_ref=NAME, limit=100)).entries)


def test_delete_run_leaves_the_memory_ref_of_the_same_name(start_server) -> None:
    sidecar = start_server(compaction=COMPACTION)
    stub, store = sidecar.stub, sidecar.services.store
    _seed(stub)
    memory_before = _memory_ids(stub)
    assert len(memory_before) == 8
    before = _snapshot(store)

    stub.DeleteRun(pb.DeleteRunRequest(run_id=NAME))

    assert _memory_ids(stub) == memory_before  # the user-visible loss the issue reported
    changed = _changed(before, _snapshot(store))
    assert changed, "the run was not deleted"
    assert {_area_of(database) for database, _ in changed} <= {"runs", "run_context"}
    assert all(key.startswith(PREFIX) for _, key in changed)
    # ... and nothing of the run is left in its own areas.
    assert not [key for (database, key) in _snapshot(store)
                if _area_of(database) in ("runs", "run_context") and key.startswith(PREFIX)]


def test_fork_compaction_and_deletes_touch_only_their_own_area(start_server) -> None:
    sidecar = start_server(compaction=COMPACTION)
    stub, store = sidecar.stub, sidecar.services.store
    summary_ref = _seed(stub)
    fork_prefix = b"default\0" + b"fork\0"

    def only(call, areas: set[str], prefixes: tuple[bytes, ...]) -> None:
        before = _snapshot(store)
        call()
        changed = _changed(before, _snapshot(store))
        assert changed, f"{call} changed nothing"
        outside = [(database, key) for database, key in changed
                   if _area_of(database) not in areas or not key.startswith(prefixes)]
        assert not outside, outside

    only(lambda: stub.ForkRun(pb.ForkRunRequest(source_run_id=NAME, from_seq=3, mode="replay", new_run_id="fork")),
         {"runs", "run_context"}, (fork_prefix,))
    only(lambda: stub.CompactMemory(pb.CompactMemoryRequest(memory_ref=NAME)),
         {"memory", "tenant_events"}, (b"default\0",))
    # The compaction's writes under the tenant's own prefix are memory's and the event log's
    # only: the run of the same name is whole.
    assert len(stub.ListRunEvents(pb.ListRunEventsRequest(run_id=NAME)).events) == 6
    assert stub.GetState(pb.GetStateRequest(run_id=NAME)).data_json
    only(lambda: stub.DeleteMemory(pb.DeleteMemoryRequest(memory_ref=NAME, entry_id=_memory_ids(stub)[0])),
         {"memory"}, (PREFIX,))
    only(lambda: stub.DeleteArtifact(pb.DeleteArtifactRequest(run_id=NAME, artifact_id=summary_ref)),
         {"runs"}, (PREFIX,))
    only(lambda: stub.DeleteRun(pb.DeleteRunRequest(run_id=NAME)), {"runs", "run_context"}, (PREFIX,))
    assert len(stub.ListRunEvents(pb.ListRunEventsRequest(run_id="fork")).events) == 3


def test_every_database_belongs_to_exactly_one_area(start_server) -> None:
    """A database opened anywhere but through AREAS, or named in two areas, fails here."""
    names = [name for area in AREAS.values() for name in area]
    assert len(names) == len(set(names)), "a database is named in two areas"
    assert set(DATABASES) == set(names)
    # What a store really holds: the names in LMDB's main database after every area was written.
    sidecar = start_server(compaction=COMPACTION)
    _seed(sidecar.stub)
    sidecar.stub.CompactMemory(pb.CompactMemoryRequest(memory_ref=NAME))
    with sidecar.services.store.env.begin() as txn:
        held = {key for key, _ in txn.cursor()}
    # (and the storage layer's own bookkeeping, which belongs to no area)
    assert held == set(DATABASES) | set(STORAGE_DATABASES), held ^ set(DATABASES)
    # Only the store opens databases, and every database a module names is one an area owns.
    sources = list(Path(__file__).resolve().parents[2].joinpath("sidecar").rglob("*.py"))
    opened = [path.name for path in sources if "open_db(" in path.read_text()]
    assert opened == ["environment.py"], opened
    named = {match for path in sources for match in re.findall(r'db\["([a-z_]+)"\]', path.read_text())}
    assert named <= {name.decode() for name in DATABASES}, named - {name.decode() for name in DATABASES}


def test_a_store_opened_with_an_unassigned_database_is_refused(tmp_path: Path) -> None:
    """An existing store holding a database no area owns (a newer or older layout) is not
    silently served: the store says which."""
    env = lmdb.open(str(tmp_path / "lmdb"), max_dbs=4)
    env.open_db(b"stray")
    env.close()
    try:
        Store(str(tmp_path / "lmdb"), map_size=16 << 20).close()
    except ValueError as error:
        assert "stray" in str(error)
    else:
        raise AssertionError("a store with an unassigned database opened")
