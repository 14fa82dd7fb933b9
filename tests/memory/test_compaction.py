"""Memory compaction (RFC 0012) over a real server: both triggers, atomicity, the event,
provenance, SR-1 carry-forward, tenant isolation, determinism."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import grpc
import jsonschema
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.errors import WatchFellBehind
from sidecar.memory.api import Memories
from sidecar.memory.compaction import Compactor, distil
from sidecar.settings import MemoryCompactionSettings, MemorySettings
from sidecar.storage.environment import Store
from sidecar.tenant_events.log import TenantEventLog
from sidecar.text.redaction import Redactor
from tests.helpers import DETECTED, SCHEMAS, TOKENS, Tenant, call_error, rich_error

EVENT_SCHEMA = json.loads((SCHEMAS / "memory-compacted.schema.json").read_text())
REF = "mem:agent-7"
TOPICS = ["refund", "shipping", "invoice", "warranty", "login", "export"]


def note(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return (f"Customer {i} asked about the {topic} policy. The agent explained the {topic} rules and "
            f"logged case {i * 7}. Follow-up scheduled for next week.")


@pytest.fixture
def sidecar(start_server):
    return start_server(tenants=TOKENS, memory={"token_counter": "chars"},
                        compaction={"enabled": True, "interval_seconds": 3600, "min_entries": 5, "keep_recent": 3,
                                    "max_input_entries": 50, "token_budget": 600})


@pytest.fixture
def acme(sidecar) -> Tenant:
    return Tenant(sidecar.channel, TOKENS["acme"])


def fill(tenant: Tenant, count: int, ref: str = REF) -> list[str]:
    for i in range(count):
        tenant.PutMemory(pb.PutMemoryRequest(memory_ref=ref, content=note(i), entry_id=f"n{i}",
                                             tags=[f"topic-{TOPICS[i % len(TOPICS)]}"]))
    return [f"n{i}" for i in range(count)]


def live_ids(tenant: Tenant, ref: str = REF) -> list[str]:
    return [e.id for e in tenant.ListMemory(pb.ListMemoryRequest(memory_ref=ref)).entries]


def test_client_requested_compaction_with_the_built_in_distiller(acme) -> None:
    fill(acme, 10)
    done = acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF, source_ids=[f"n{i}" for i in range(6)]))
    assert done.created and done.source_count == 6
    event = json.loads(done.event.json)
    jsonschema.validate(event, EVENT_SCHEMA)
    assert (event["trigger"], event["sourceIds"], event["outputId"]) == (
        "client-requested", [f"n{i}" for i in range(6)], done.output_id)
    output = acme.GetMemory(pb.GetMemoryRequest(memory_ref=REF, entry_id=done.output_id))
    assert event["byteSize"] == len(output.content.encode()) and event["distillation"]["tokensUsed"] == output.tokens
    assert output.tokens <= 600 and output.content.startswith("Distilled from 6 memory entries")
    assert f"compacted-from:{done.compaction_id}" in output.tags
    assert [t for t in output.tags if t.startswith("compacted-from")] == [f"compacted-from:{done.compaction_id}"]
    assert re.match(r"^compacted-from:[^\s:][^\s]*$", f"compacted-from:{done.compaction_id}")
    assert {f"topic-{t}" for t in TOPICS} <= set(output.tags), "the union of the sources' tags"
    for i in range(6):  # the sources are gone
        assert call_error(acme.GetMemory, pb.GetMemoryRequest(memory_ref=REF, entry_id=f"n{i}"))[0] == \
            grpc.StatusCode.NOT_FOUND
    assert set(live_ids(acme)) == {done.output_id, "n6", "n7", "n8", "n9"}
    # Relevance finds the distilled entry, never a source.
    found = acme.ListMemory(pb.ListMemoryRequest(memory_ref=REF, rank="relevance", query="warranty policy"))
    assert done.output_id in [e.id for e in found.entries]
    assert not {f"n{i}" for i in range(6)} & {e.id for e in found.entries}
    listed = acme.ListMemoryEvents(pb.ListMemoryEventsRequest(memory_ref=REF))
    assert [json.loads(e.json) for e in listed.events] == [event]


def test_a_retry_does_not_distil_twice(acme) -> None:
    fill(acme, 6)
    first = acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF, source_ids=["n0", "n1", "n2"]))
    again = acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF, source_ids=["n2", "n0", "n1"]))
    assert (again.created, again.compaction_id, again.output_id) == (False, first.compaction_id, first.output_id)
    assert len(acme.ListMemoryEvents(pb.ListMemoryEventsRequest()).events) == 1


def test_without_sources_it_takes_the_background_jobs_candidates(acme) -> None:
    fill(acme, 9)
    done = acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF))
    assert done.source_count == 6  # all but the newest keep_recent = 3
    assert set(live_ids(acme)) == {done.output_id, "n6", "n7", "n8"}


def test_the_hosts_summary_and_a_budget_it_cannot_fit(acme) -> None:
    fill(acme, 6)
    code, reason, _ = call_error(acme.CompactMemory, pb.CompactMemoryRequest(
        memory_ref=REF, source_ids=["n0", "n1"], summary_text="x" * 100, token_budget=50))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "token_budget_exceeded")
    code, reason, _ = call_error(acme.CompactMemory, pb.CompactMemoryRequest(memory_ref=REF, source_ids=["n0", "n1"],
                                                                            token_budget=10))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "token_budget_exceeded")
    assert len(live_ids(acme)) == 6 and not acme.ListMemoryEvents(pb.ListMemoryEventsRequest()).events
    done = acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF, source_ids=["n0", "n1"],
                                                      summary_text="Two customers asked about refunds and shipping."))
    output = acme.GetMemory(pb.GetMemoryRequest(memory_ref=REF, entry_id=done.output_id))
    assert output.content == "Two customers asked about refunds and shipping."


@pytest.mark.parametrize("fields, field", [
    (dict(source_ids=["n0"]), "source_ids"), (dict(source_ids=["n0", "n0"]), "source_ids"),
    (dict(source_ids=["n0", "missing"]), "source_ids[1]"),
    (dict(source_ids=["n0", "n1"], token_budget=0), "token_budget"),
])
def test_bad_requests_write_nothing(acme, fields, field) -> None:
    fill(acme, 4)
    assert call_error(acme.CompactMemory, pb.CompactMemoryRequest(memory_ref=REF, **fields)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", [field])
    assert len(live_ids(acme)) == 4 and not acme.ListMemoryEvents(pb.ListMemoryEventsRequest()).events


SECRET = "carried-forward-secret-77"
# Sources with a registered secret, a detected credential and the leaked forms RFC 0012 §D names.
PLANTED = [f"uses {SECRET} to log in", f"key {DETECTED['openai_api_key']} in the config",
           "a leaked [BYOK:sk-live-xyz] form", "an old <REDACTED:stripe> marker", "plain note five"]
LEAKS = (SECRET, DETECTED["openai_api_key"], DETECTED["jwt"], "[BYOK:", "<REDACTED:")


def plant(tenant: Tenant) -> list[str]:
    tenant.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id="cf", value=SECRET)]))
    for i, content in enumerate(PLANTED):
        tenant.PutMemory(pb.PutMemoryRequest(memory_ref=REF, content=content, entry_id=f"s{i}"))
    return [f"s{i}" for i in range(len(PLANTED))]


def assert_nothing_leaked(sidecar, texts: list[str], events: list[str]) -> None:
    """No plaintext secret or leaked form in the distilled entries, their events, or the store's file."""
    stored = (Path(sidecar.services.store.env.path()) / "data.mdb").read_bytes()
    for leaked in LEAKS:
        assert all(leaked not in text for text in texts + events), leaked
        assert leaked.encode() not in stored, leaked


def test_sr1_is_carried_forward_into_distilled_entries(sidecar, acme) -> None:
    plant(acme)
    built_in = acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF, source_ids=["s0", "s1", "s2"]))
    hosts = acme.CompactMemory(pb.CompactMemoryRequest(
        memory_ref=REF, source_ids=["s3", "s4"],
        summary_text=f"Summary: log in with {SECRET}, {DETECTED['jwt']}, [BYOK:abc] and <REDACTED:x>."))
    texts = [acme.GetMemory(pb.GetMemoryRequest(memory_ref=REF, entry_id=o.output_id)).content
             for o in (built_in, hosts)]
    assert "[REDACTED:cf]" in texts[0] and "[REDACTED:openai_api_key]" in texts[0]
    assert texts[1] == "Summary: log in with [REDACTED:cf], [REDACTED:jwt], [REDACTED:byok] and [REDACTED:x]."
    assert_nothing_leaked(sidecar, texts, [o.event.json for o in (built_in, hosts)])


def test_distilled_text_is_redacted_even_when_its_sources_were_not(tmp_path, counters) -> None:
    """Sources stored before a secret was registered hold it in plaintext; the distilled entry
    still must not (RFC 0012 §D: that the sources passed SR-1 once is no reason to skip it)."""
    store = Store(str(tmp_path / "db"), 16 << 20)
    redactor = Redactor()
    memories = Memories(store, counters, MemorySettings(token_counter="chars"), redactor)
    compactor = Compactor(memories, TenantEventLog(store, max_watches=4), MemoryCompactionSettings(enabled=True))
    for i in range(3):
        memories.put("t", REF, f"the vault code is late-secret-{i:04d}. More text.", entry_id=f"x{i}")
    redactor.register("t", "", [(f"late{i}", f"late-secret-{i:04d}") for i in range(3)])
    outcome = compactor.compact("t", REF, ["x0", "x1", "x2"])
    content = memories.get("t", REF, outcome.output_id).decode("utf-8", "replace")
    assert "late-secret" not in content and "[REDACTED:late0]" in content
    store.close()


def test_distillation_is_deterministic(counters) -> None:
    from collections import Counter

    from sidecar.memory.api import Source
    from sidecar.memory.index import terms
    sources = [Source(f"n{i}", i, note(i), (), Counter(terms(note(i)))) for i in range(40)]
    counter = counters.get("o200k_base")
    first, second = distil(counter, sources, 300, 16384), distil(counter, list(sources), 300, 16384)
    assert first == second and counter.count(first) <= 300
    assert first != distil(counter, sources, 200, 16384)


def test_the_background_job_compacts_by_itself_with_sr1_carried_forward(start_server) -> None:
    sidecar = start_server(tenants=TOKENS, memory={"token_counter": "chars"},
                           compaction={"enabled": True, "interval_seconds": 0.1, "min_entries": 5, "keep_recent": 2})
    acme = Tenant(sidecar.channel, TOKENS["acme"])
    # The server fixture runs no job loop (serve() does); run it here as serve() would.
    from sidecar.memory.compaction import BackgroundJob
    job = BackgroundJob(sidecar.services.compactor, 0.1)
    job.start()
    try:
        planted = plant(acme)  # the oldest entries: the job takes them
        fill(acme, 3)
        deadline = time.monotonic() + 10
        while not (events := acme.ListMemoryEvents(pb.ListMemoryEventsRequest(memory_ref=REF)).events):
            assert time.monotonic() < deadline, "the job never compacted"
            time.sleep(0.05)
    finally:
        job.stop()
    event = json.loads(events[0].json)
    jsonschema.validate(event, EVENT_SCHEMA)
    assert event["trigger"] == "host-managed"
    # The job may have run between two puts: it took the oldest entries beyond the newest 2 then.
    assert event["sourceIds"] == (planted + ["n0", "n1", "n2"])[:event["sourceCount"]]
    assert event["sourceCount"] >= 4
    text = acme.GetMemory(pb.GetMemoryRequest(memory_ref=REF, entry_id=event["outputId"])).content
    assert "[REDACTED:cf]" in text and "[REDACTED:openai_api_key]" in text and "[REDACTED:byok]" in text
    assert_nothing_leaked(sidecar, [text], [e.json for e in events])


def test_events_are_the_tenants_own_and_arrive_live(sidecar, acme) -> None:
    globex = Tenant(sidecar.channel, TOKENS["globex"])
    received: dict[str, list] = {"acme": [], "globex": []}
    streams = {name: tenant.WatchEvents(pb.WatchEventsRequest(types=["memory.compacted"]))
               for name, tenant in (("acme", acme), ("globex", globex))}

    def follow(name: str) -> None:
        try:
            for notice in streams[name]:
                received[name].append(json.loads(notice.json))
        except grpc.RpcError:
            pass  # cancelled at the end of the test

    for stream in streams.values():
        stream.initial_metadata()  # the headers come once the watch is registered
    threads = [threading.Thread(target=follow, args=(name,), daemon=True) for name in streams]
    for thread in threads:
        thread.start()
    fill(acme, 4)
    done = acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF, source_ids=["n0", "n1"]))
    deadline = time.monotonic() + 5
    while not received["acme"] and time.monotonic() < deadline:
        time.sleep(0.05)
    for stream in streams.values():
        stream.cancel()
    assert [e["outputId"] for e in received["acme"]] == [done.output_id]
    assert received["globex"] == []
    assert not globex.ListMemoryEvents(pb.ListMemoryEventsRequest()).events
    assert call_error(globex.GetMemory, pb.GetMemoryRequest(memory_ref=REF, entry_id=done.output_id))[0] == \
        grpc.StatusCode.NOT_FOUND


def test_compaction_off_refuses_and_is_not_advertised(start_server) -> None:
    sidecar = start_server(tenants=TOKENS)
    acme = Tenant(sidecar.channel, TOKENS["acme"])
    with pytest.raises(grpc.RpcError) as raised:
        acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF))
    assert rich_error(raised.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "compaction_disabled")
    assert "compaction" not in json.loads(acme.GetCapabilities(pb.GetCapabilitiesRequest()).capabilities_json)["memory"]


def test_the_capability_when_on(acme) -> None:
    document = json.loads(acme.GetCapabilities(pb.GetCapabilitiesRequest()).capabilities_json)
    jsonschema.validate(document, json.loads((SCHEMAS / "capabilities.schema.json").read_text()))
    assert document["memory"]["compaction"] == {"supported": True, "trigger": "both", "maxInputEntries": 50,
                                                "maxOutputBytes": 16384}


def _keep(store: Store, events: TenantEventLog, count: int, tenant: str = "acme") -> list:
    def write(txn):
        return [events.append(txn, tenant, {"type": "memory.compacted", "memoryRef": REF, "n": i})
                for i in range(count)]
    return store.write(write)


def test_a_watch_that_falls_behind_gets_its_backlog_then_an_error_naming_where_to_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sidecar.tenant_events.log.MAX_WATCH_BACKLOG", 3)
    store = Store(str(tmp_path / "db"), map_size=1 << 24)
    events = TenantEventLog(store, max_watches=4)
    slow, other = events.watch("acme", ["memory.compacted"]), events.watch("globex", [])
    kept = _keep(store, events, 5)
    events.publish("acme", kept)
    delivered = []
    with pytest.raises(WatchFellBehind) as raised:
        for event in slow.events(lambda: True):
            delivered.append(event)
    assert [e.seq for e in delivered] == [1, 2, 3]
    assert raised.value.metadata == {"last_seq": "3"}
    assert [e.seq for e in events.list("acme", since=3)[0]] == [4, 5], "what it missed is in the log"
    assert other.queue.empty() and not other.closed, "another tenant's watch heard nothing"
    store.close()


def test_closing_the_watches_delivers_what_was_queued_then_ends_without_error(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"), map_size=1 << 24)
    events = TenantEventLog(store, max_watches=4)
    watch = events.watch("acme", [])
    events.publish("acme", _keep(store, events, 2))
    events.close_watches()
    assert [e.seq for e in watch.events(lambda: True)] == [1, 2]
    events.publish("acme", _keep(store, events, 1))
    assert list(watch.events(lambda: True)) == [], "a closed watch hears nothing more"
    store.close()
