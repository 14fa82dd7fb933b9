"""Memory over a real server with two tenants: budgets (RFC 0113), ranking, TTL, CTI-1, SR-1."""

from __future__ import annotations

import json
import time

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.errors import NotFound
from sidecar.memory.api import ListRequest, Memories
from sidecar.settings import MemorySettings
from sidecar.text.redaction import Redactor
from tests.helpers import TOKENS, Tenant, call_error


@pytest.fixture
def server(start_server):
    return start_server(tenants=TOKENS, memory={"token_counter": "chars"})


@pytest.fixture
def acme(server) -> Tenant:
    return Tenant(server.channel, TOKENS["acme"])


@pytest.fixture
def globex(server) -> Tenant:
    return Tenant(server.channel, TOKENS["globex"])


def put(tenant: Tenant, content: str, ref: str = "mem:agent-7", **fields) -> pb.PutMemoryResponse:
    return tenant.PutMemory(pb.PutMemoryRequest(memory_ref=ref, content=content, **fields))


def listed(tenant: Tenant, ref: str = "mem:agent-7", **fields) -> pb.ListMemoryResponse:
    return tenant.ListMemory(pb.ListMemoryRequest(memory_ref=ref, **fields))


# -- tenancy ----------------------------------------------------------------------------------

def test_calls_without_a_known_token_are_unauthenticated(server) -> None:
    for token in (None, "not-a-token"):
        anonymous = Tenant(server.channel, token)
        code, reason, _ = call_error(anonymous.ListMemory, pb.ListMemoryRequest(memory_ref="mem:a"))
        assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "unauthenticated")
        assert call_error(anonymous.OpenRun, pb.OpenRunRequest(run_id="r"))[0] == grpc.StatusCode.UNAUTHENTICATED


def test_another_tenants_memory_and_runs_answer_as_if_absent(acme, globex) -> None:
    entry = put(acme, "acme's own note about the refund policy", entry_id="shared-id")
    acme.OpenRun(pb.OpenRunRequest(run_id="run-1"))
    acme.AppendEvents(pb.AppendEventsRequest(run_id="run-1", events=[pb.Event(event_id="e", iteration=1, role="user",
                                                                             content="acme's event")]))
    assert list(listed(globex).entries) == []
    assert list(listed(globex, rank="relevance", query="refund policy").entries) == []
    for method, request_ in [
            (globex.GetMemory, pb.GetMemoryRequest(memory_ref="mem:agent-7", entry_id=entry.entry_id)),
            (globex.DeleteMemory, pb.DeleteMemoryRequest(memory_ref="mem:agent-7", entry_id=entry.entry_id)),
            (globex.ListRunEvents, pb.ListRunEventsRequest(run_id="run-1")),
            (globex.GetTranscriptWindow, pb.GetTranscriptWindowRequest(run_id="run-1", iteration=1))]:
        code, reason, _ = call_error(method, request_)
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "not_found")
    # The same ids in the other tenant are other things.
    put(globex, "globex's note", entry_id="shared-id")
    assert acme.GetMemory(pb.GetMemoryRequest(memory_ref="mem:agent-7",
                                              entry_id="shared-id")).content.startswith("acme")
    assert globex.OpenRun(pb.OpenRunRequest(run_id="run-1")).created


# -- put, get, delete -------------------------------------------------------------------------

def test_put_get_replace_delete(acme) -> None:
    first = put(acme, "first version", tags=["a", "b"], entry_id="m1")
    assert (first.entry_id, first.tokens, first.replaced) == ("m1", len("first version"), False)
    got = acme.GetMemory(pb.GetMemoryRequest(memory_ref="mem:agent-7", entry_id="m1"))
    assert (got.id, got.content, list(got.tags), got.tokens) == ("m1", "first version", ["a", "b"], 13)
    assert abs(got.created_at.ToMilliseconds() - time.time() * 1000) < 60_000 and not got.HasField("expires_at")
    assert put(acme, "second", entry_id="m1").replaced
    assert acme.GetMemory(pb.GetMemoryRequest(memory_ref="mem:agent-7", entry_id="m1")).content == "second"
    generated = put(acme, "no id given")
    assert generated.entry_id.startswith("mem_")
    acme.DeleteMemory(pb.DeleteMemoryRequest(memory_ref="mem:agent-7", entry_id="m1"))
    assert call_error(acme.GetMemory, pb.GetMemoryRequest(memory_ref="mem:agent-7", entry_id="m1"))[0] == \
        grpc.StatusCode.NOT_FOUND
    assert [e.id for e in listed(acme).entries] == [generated.entry_id]


def test_an_entry_lives_until_its_expiry(store, counters) -> None:
    now = [1_000_000]
    memories = Memories(store, counters, MemorySettings(token_counter="chars"), Redactor(), clock=lambda: now[0])
    memories.put("t", "mem:a", "fades", entry_id="gone", ttl_seconds=10)
    memories.put("t", "mem:a", "lasts", entry_id="keep")
    now[0] += 9_999
    assert len(memories.list("t", ListRequest("mem:a")).records) == 2 and memories.get("t", "mem:a", "gone")
    now[0] += 1
    assert len(memories.list("t", ListRequest("mem:a")).records) == 1
    with pytest.raises(NotFound):
        memories.get("t", "mem:a", "gone")


def test_an_expired_entry_never_surfaces(acme) -> None:
    put(acme, "lasts", entry_id="keep")
    put(acme, "fades", entry_id="gone", ttl_seconds=1)
    time.sleep(1.2)
    assert [e.id for e in listed(acme).entries] == ["keep"]
    assert [e.id for e in listed(acme, rank="relevance", query="fades").entries] == []
    for method, request_ in [(acme.GetMemory, pb.GetMemoryRequest(memory_ref="mem:agent-7", entry_id="gone")),
                             (acme.DeleteMemory, pb.DeleteMemoryRequest(memory_ref="mem:agent-7", entry_id="gone"))]:
        assert call_error(method, request_)[0] == grpc.StatusCode.NOT_FOUND


BAD_PUTS = [
    (dict(memory_ref=""), "memory_ref"),
    (dict(memory_ref="m" * 257), "memory_ref"),
    (dict(memory_ref="mem:a\x00b"), "memory_ref"),
    (dict(memory_ref="mem/../other"), "memory_ref"),
    (dict(memory_ref="mem:a b"), "memory_ref"),
    (dict(content="x" * 70_000), "content"),
    (dict(ttl_seconds=-1), "ttl_seconds"),
    (dict(tags=["ok", ""]), "tags[1]"),
    (dict(entry_id="a\nb"), "entry_id"),
    (dict(embedding=[0.1, float("nan")]), "embedding"),
]


@pytest.mark.parametrize("fields, field", BAD_PUTS, ids=[f for _, f in BAD_PUTS])
def test_bad_puts_name_the_field_and_write_nothing(acme, fields, field) -> None:
    request_ = pb.PutMemoryRequest(**{"memory_ref": "mem:agent-7", "content": "c", **fields})
    assert call_error(acme.PutMemory, request_) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", [field])
    assert list(listed(acme).entries) == []


def test_one_embedding_dimension_per_ref(acme) -> None:
    put(acme, "one", embedding=[1.0, 0.0, 0.0])
    code, _, fields = call_error(acme.PutMemory, pb.PutMemoryRequest(memory_ref="mem:agent-7", content="two",
                                                                     embedding=[1.0, 0.0]))
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["embedding"])
    assert call_error(acme.ListMemory, pb.ListMemoryRequest(memory_ref="mem:agent-7", rank="relevance", query="one",
                                                             query_embedding=[1.0]))[2] == ["query_embedding"]


# -- the budgeted list (RFC 0113) --------------------------------------------------------------

def test_recency_is_newest_first_and_holds_the_budget(acme) -> None:
    for i, size in enumerate([31, 10, 200, 20, 40]):  # oldest first; chars counter
        put(acme, chr(ord("a") + i) * size, entry_id=f"m{i}")
    everything = listed(acme)
    assert [e.id for e in everything.entries] == ["m4", "m3", "m2", "m1", "m0"]
    assert everything.tokens_used == 301 and everything.rank == "recency" and everything.token_counter == "chars"
    # Budget 100: m4 (40) and m3 (20) fit; m2 (200) is over the budget on its own, so it is left
    # out and the walk goes on; m1 (10) fits; m0 (31) does not fit in the 30 that remain: stop.
    budgeted = listed(acme, token_budget=100)
    assert [e.id for e in budgeted.entries] == ["m4", "m3", "m1"]
    assert (budgeted.tokens_used, budgeted.left_out_for_budget) == (70, 2)
    assert sum(len(e.content) for e in budgeted.entries) == budgeted.tokens_used  # an independent recount
    assert [e.id for e in listed(acme, token_budget=100, limit=2).entries] == ["m4", "m3"]  # fewer wins
    assert [e.id for e in listed(acme, token_budget=1).entries] == []  # nothing fits: empty
    for entry in budgeted.entries:
        stored = acme.GetMemory(pb.GetMemoryRequest(memory_ref="mem:agent-7", entry_id=entry.id))
        assert stored.content == entry.content, "never truncated"


def test_tag_filter_and_limit(acme) -> None:
    put(acme, "x" * 5, tags=["keep"], entry_id="a")
    put(acme, "y" * 5, entry_id="b")
    put(acme, "z" * 5, tags=["keep", "other"], entry_id="c")
    assert [e.id for e in listed(acme, tag="keep").entries] == ["c", "a"]
    assert [e.id for e in listed(acme, tag="keep", limit=1).entries] == ["c"]


@pytest.mark.parametrize("fields, field", [
    (dict(token_budget=0), "token_budget"), (dict(token_budget=-5), "token_budget"), (dict(limit=-1), "limit"),
    (dict(rank="random"), "rank"), (dict(rank="relevance"), "query"),
])
def test_bad_lists_name_the_field(acme, fields, field) -> None:
    code, reason, fields_named = call_error(acme.ListMemory, pb.ListMemoryRequest(memory_ref="mem:agent-7", **fields))
    assert (code, reason, fields_named) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", [field])


def test_a_malformed_or_unknown_ref_is_an_empty_list(acme) -> None:
    put(acme, "something")
    for ref in ("mem:never-used", "mem/../x", "bad ref", "x" * 300):
        assert list(listed(acme, ref=ref).entries) == []


def test_relevance_finds_the_old_relevant_entry_that_recency_does_not(acme) -> None:
    put(acme, "The refund policy: customers may return items within 30 days for a full refund.", entry_id="policy")
    for i in range(20):
        put(acme, f"Unrelated note {i} about shipping schedules and warehouse staffing levels.", entry_id=f"n{i}")
    recency = listed(acme, token_budget=200)
    relevance = listed(acme, token_budget=200, rank="relevance", query="refund policy")
    assert "policy" not in [e.id for e in recency.entries]
    assert relevance.entries[0].id == "policy" and relevance.entries[0].score > 0
    assert [e.id for e in relevance.entries] == ["policy"], "entries without a query term are not relevant"
    assert relevance.tokens_used <= 200


def test_semantic_relevance_is_fused_with_lexical(acme) -> None:
    put(acme, "apples and pears", entry_id="fruit", embedding=[1.0, 0.0, 0.0])
    put(acme, "a report on trucks", entry_id="trucks", embedding=[0.0, 1.0, 0.0])
    put(acme, "trucks carrying apples", entry_id="both", embedding=[0.7, 0.7, 0.0])
    lexical = listed(acme, rank="relevance", query="trucks")
    assert [e.id for e in lexical.entries] == ["both", "trucks"]  # the shorter entry scores higher
    # An embedding close to "fruit" brings in what no query term matches, fused by reciprocal
    # rank: both = 1/61 + 1/62 (lexical 1st, cosine 2nd), trucks = 1/62 + 1/63, fruit = 1/61.
    fused = listed(acme, rank="relevance", query="trucks", query_embedding=[0.9, 0.1, 0.0])
    assert [e.id for e in fused.entries] == ["both", "trucks", "fruit"]
    assert [round(e.score, 6) for e in fused.entries] == [round(1 / 61 + 1 / 62, 6), round(1 / 62 + 1 / 63, 6),
                                                          round(1 / 61, 6)]
    assert fused.entries[0].score > fused.entries[1].score > fused.entries[2].score > 0


# -- capability ---------------------------------------------------------------------------------

def test_the_memory_capability(acme) -> None:
    document = json.loads(acme.GetCapabilities(pb.GetCapabilitiesRequest()).capabilities_json)
    assert document["memory"] == {
        "supported": True, "maxEntrySizeBytes": 65536, "ttlSupported": True,
        "injectionBudget": {"supported": True, "tokenCounter": "chars"},
        "search": {"supported": True, "modes": ["lexical", "semantic"]}}
