"""LMDB store: the map grows by itself, a store that cannot grow says so, and writes are atomic."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.errors import StoreFull, ValidationError
from sidecar.settings import ContextSettings
from sidecar.store import Store, scope
from sidecar.transcript import NewEvent, Transcripts
from sidecar.validation import check_id
from tests.conftest import TENANT


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
