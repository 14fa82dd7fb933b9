"""The inspector's pages, as HTML strings: plain markup over the domain's values, no script."""

from __future__ import annotations

import datetime
from html import escape
from urllib.parse import quote, urlencode

from sidecar.inspector.costs import REPORTED, InputCost, input_cost
from sidecar.settings import InspectorSettings
from sidecar.text.fencing import is_fenced
from sidecar.transcript.transcripts import RunOverview, RunSettings, TurnOverview
from sidecar.transcript.window import TranscriptWindow

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: .25em .5em; vertical-align: top; }
th { background: #f3f3f3; text-align: left; } td.number { text-align: right; }
td.text { white-space: pre-wrap; font-family: ui-monospace, monospace; max-width: 60em; }
tr.untrusted td.text { background: #fff4e0; } .tag { font-size: 12px; padding: 0 .3em; border-radius: 3px; }
.untrusted-tag { background: #f0a030; color: #000; } .form-tag { background: #ddd; }
td.timeline { padding: 0 .25em; } .static { fill: #5a6b80; } .sections { fill: #8a9bb0; } .verbatim { fill: #3f7fd0; }
.clipped { fill: #f0a030; } .cleared { fill: #b0b0b0; }
.budget { fill: none; stroke: #222; stroke-dasharray: 3 2; } .predicted { fill: #4caf50; } .reported { fill: #1b5e20; }
.cache-break path, .cache-key { fill: #d32f2f; color: #d32f2f; }
.key { display: inline-block; width: 1em; height: .7em; } span.sections { background: #8a9bb0; }
span.static { background: #5a6b80; }
span.verbatim { background: #3f7fd0; } span.clipped { background: #f0a030; }
span.cleared { background: #b0b0b0; } span.budget { border: 1px dashed #222; }
span.predicted { background: #4caf50; } span.reported { background: #1b5e20; }
.summaries { fill: #8e44ad; } span.summaries { background: #8e44ad; }
.marker.summaries path { fill: #8e44ad; } .marker.cleared path { fill: #707070; } .marker.start path { fill: #3f7fd0; }
.change { display: block; white-space: nowrap; } .change[data-kind=summaries] { color: #8e44ad; }
.change[data-kind=start] { color: #3f7fd0; } .change[data-kind=cleared] { color: #505050; }
td.cost small { color: #666; }
"""


def run_path(run_id: str) -> str:
    return f"/runs/{quote(run_id, safe='')}"


def turn_path(run_id: str, iteration: int) -> str:
    return f"{run_path(run_id)}/turns/{iteration}"


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><nav><a href=\"/\">Runs</a> <a href=\"/memory\">Memory</a></nav>"
            f"<h1>{escape(title)}</h1>"
            f"{body}</body></html>")


def when(ms: int) -> str:
    """An instant as UTC, to the second; never assembled: an empty cell."""
    if not ms:
        return ""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def policy(settings: RunSettings) -> str:
    """A run's window policy as it was opened: the policy, the budget in its counter, summaries."""
    told = [settings.window_policy, f"{settings.transcript_token_budget} tokens ({settings.token_counter})"]
    if settings.transcript_window:
        told.append(f"at most {settings.transcript_window} entries")
    if settings.summarization:
        told.append(f"summaries: {settings.summarization_strategy}, keeping {settings.keep_last_turns} turns"
                    + (f" and {settings.keep_last_tokens} tokens" if settings.keep_last_tokens else ""))
    return ", ".join(told)


def runs_page(runs: list[RunOverview], query: str, page_number: int, pages: int, total: int) -> str:
    rows = "".join(
        f"<tr class=run><td class=run-id><a href=\"{run_path(r.run_id)}\">{escape(r.run_id)}</a></td>"
        f"<td class=number>{r.turns}</td><td class=number>{r.tokens}</td><td class=number>{r.summaries}</td>"
        f"<td>{when(r.last_turn_ms)}</td><td class=policy>{escape(policy(r.settings))}</td></tr>" for r in runs)
    search = (f"<form method=get action=\"/\"><input name=q value=\"{escape(query)}\" "
              "placeholder=\"run id contains\"> <button>Search</button></form>")
    nav = pages_nav("/", {"q": query} if query else {}, page_number, pages, f"{total} runs")
    return page("Runs", f"{search}{nav}<table id=runs><tr><th>Run</th><th>Turns</th><th>Tokens fed (newest turn)</th>"
                        f"<th>Summaries</th><th>Last activity</th><th>Policy</th></tr>{rows}</table>"
                        + ("" if runs else "<p>No runs.</p>") + nav)


BAR_WIDTH = 320  # px: the widest bar of a page; every bar of the page is on its scale
# Each part of a turn's bar: its CSS class, its legend, the tokens it stands for.
BAR_PARTS = (("static", "static sections and tools", lambda t: t.static_tokens or 0),
             ("sections", "per-task and per-turn sections (with the static ones and the tools where the window's "
              "record does not keep those apart)",
              lambda t: t.fed_tokens - t.transcript_tokens - (t.static_tokens or 0)),
             ("summaries", "summaries", lambda t: t.summary_tokens),
             ("verbatim", "transcript as stored",
              lambda t: t.transcript_tokens - t.summary_tokens - t.clipped_tokens - t.cleared_tokens),
             ("clipped", "events fed clipped", lambda t: t.clipped_tokens),
             ("cleared", "tool results fed as their cleared placeholder", lambda t: t.cleared_tokens))
MARKER = "M{x} 30 L{left} 36 L{right} 36 Z"  # a small triangle under the bar, pointing up at what changed


def changes(turn: TurnOverview) -> list[tuple[str, str, str]]:
    """What the turn's window changed against the one fed before it: (kind, short text, title) of
    each marker, kind "summaries", "cleared" or "start"."""
    found = []
    change = turn.changes
    if change.summaries_entered or change.summaries_left:
        said = [f"summary {s.ref} entered the window (recorded for iteration {s.iteration}, standing in for "
                f"{len(s.replaced_turns)} entries of {s.tokens_before} tokens with {s.tokens_after})"
                for s in change.summaries_entered]
        said += [f"summary {ref} left the window" for ref in change.summaries_left]
        short = " ".join(filter(None, (f"+{len(change.summaries_entered)}" if change.summaries_entered else "",
                                       f"-{len(change.summaries_left)}" if change.summaries_left else "")))
        found.append(("summaries", f"summaries {short}", "; ".join(said)))
    if change.cleared:
        original = sum(form.original_tokens for form in change.cleared)
        placeholders = sum(form.tokens for form in change.cleared)
        found.append(("cleared", f"{len(change.cleared)} cleared",
                      f"{len(change.cleared)} tool result(s) cleared: {original} tokens now fed as "
                      f"{placeholders} tokens of placeholders"))
    if change.start_moved:
        was, now = change.start_moved
        found.append(("start", "start moved", f"the window's start moved: its first event fed verbatim was "
                                              f"{was or '(none)'}, now {now or '(none)'}"))
    return found


def _bar(turn: TurnOverview, scale: float) -> str:
    """The turn's timeline row as inline SVG: what was fed, stacked, against the transcript's
    budget (the dashed box after the sections); under it the cached share the cache report
    predicted and the one the provider reported; a red mark where the cache broke; under those,
    a mark where summaries entered (or left), where tool results were cleared and where the
    window's start moved, each at its part of the bar."""
    def x(tokens: int) -> float:
        return round(tokens * scale, 1)

    fixed = turn.fed_tokens - turn.transcript_tokens
    shapes, at, starts = [], 0, {}
    for css, legend, tokens_of in BAR_PARTS:
        tokens = tokens_of(turn)
        starts[css] = at
        shapes.append(f'<rect class="part {css}" x="{x(at)}" y="2" width="{x(tokens)}" height="14" '
                      f'data-tokens="{tokens}"><title>{legend}: {tokens} tokens</title></rect>')
        at += tokens
    shapes.append(f'<rect class=budget x="{x(fixed)}" y="1" width="{x(turn.budget)}" height="16" '
                  f'data-tokens="{turn.budget}"><title>transcript budget: {turn.budget} tokens</title></rect>')
    shapes.append(f'<rect class="cached predicted" x="0" y="19" width="{x(turn.predicted_cached_tokens)}" height="4" '
                  f'data-tokens="{turn.predicted_cached_tokens}"><title>predicted cached: '
                  f'{turn.predicted_cached_tokens} tokens</title></rect>')
    if turn.reported_cached_tokens is not None:
        shapes.append(f'<rect class="cached reported" x="0" y="24" width="{x(turn.reported_cached_tokens)}" '
                      f'height="4" data-tokens="{turn.reported_cached_tokens}"><title>reported cached: '
                      f'{turn.reported_cached_tokens} tokens</title></rect>')
    if turn.break_reason:
        where = x(turn.predicted_cached_tokens)
        shapes.append(f'<g class=cache-break data-break-reason="{escape(turn.break_reason)}"><title>cache broke: '
                      f'{escape(turn.break_reason)}</title><path d="M{where - 4} 18 L{where + 4} 18 L{where} 29 Z"/>'
                      f'</g>')
    last = -10.0
    for kind, _, title in changes(turn):
        # At its part of the bar; beside the one before where they would overlap (a small summary).
        where = last = max(x(starts["verbatim" if kind == "start" else kind]), last + 9)
        shapes.append(f'<g class="marker {kind}" data-kind="{kind}"><title>{escape(title)}</title>'
                      f'<path d="{MARKER.format(x=where, left=where - 4, right=where + 4)}"/></g>')
    label = (f"turn {turn.iteration}: {turn.fed_tokens} tokens fed, {fixed} of sections and tools, "
             f"{turn.transcript_tokens} of transcript against a budget of {turn.budget}")
    return (f'<svg class=bar role=img aria-label="{escape(label)}" width="{BAR_WIDTH + 10}" height="37" '
            f'viewBox="-5 0 {BAR_WIDTH + 10} 37">{"".join(shapes)}</svg>')


def pages_nav(path: str, kept: dict[str, str], page_number: int, last: int, where: str) -> str:
    """A paginated view's "Page N of M" line, and Previous and Next links that keep the ``kept``
    parameters (a search, a form's fields) beside ``page``."""
    def link(rel: str, to: int, text: str) -> str:
        return f'<a rel={rel} href="{escape(path)}?{escape(urlencode({**kept, "page": to}))}">{text}</a>'

    links = ([link("prev", page_number - 1, "Previous")] if page_number > 1 else []) + (
        [link("next", page_number + 1, "Next")] if page_number < last else [])
    return f"<p class=pages>Page {page_number} of {last} ({where}) {' '.join(links)}</p>"


def _pages_nav(run_id: str, page_number: int, pages: int, shown: list[TurnOverview], total: int) -> str:
    where = (f"turns {shown[0].iteration}-{shown[-1].iteration}, " if shown else "") + f"{total} in all"
    return pages_nav(run_path(run_id), {}, page_number, pages, where)


def usd(amount: float) -> str:
    return f"${amount:.6f}"


def _cost_cells(cost: InputCost, prices: InspectorSettings) -> str:
    source = "reported" if cost.source == REPORTED else "predicted"
    title = (f"{cost.uncached_tokens} uncached tokens at ${prices.input_usd_per_mtok}/M, {cost.cached_tokens} "
             f"cached ({cost.source}) at ${prices.cached_input_usd_per_mtok}/M, {cost.written_tokens} written to "
             f"the cache at ${prices.cache_write_usd_per_mtok}/M")
    return (f'<td class="number cost" data-source="{source}" data-uncached="{cost.uncached_tokens}" '
            f'data-cached="{cost.cached_tokens}" data-written="{cost.written_tokens}" title="{escape(title)}">'
            f'<span class=usd>{usd(cost.usd)}</span> <small>{source}</small></td>'
            f'<td class="number without-caching" title="{cost.tokens} tokens at ${prices.input_usd_per_mtok}/M">'
            f'{usd(cost.without_caching_usd)}</td>')


def run_page(run_id: str, turns: list[TurnOverview], total: int, page_number: int, pages: int,
             prices: InspectorSettings) -> str:
    widest = max((max(t.fed_tokens, t.fed_tokens - t.transcript_tokens + t.budget, t.predicted_cached_tokens,
                      t.reported_cached_tokens or 0) for t in turns), default=1)
    scale = BAR_WIDTH / max(widest, 1)
    costs = [input_cost(t, prices) for t in turns]
    rows = "".join(
        f"<tr class=turn data-iteration={t.iteration}><td><a href=\"{turn_path(run_id, t.iteration)}\">"
        f"{t.iteration}</a></td><td class=timeline>{_bar(t, scale)}</td>"
        + "".join(f"<td class=\"number {css}\">{'' if value is None else value}</td>" for css, value in (
            ("sections", t.fed_tokens - t.transcript_tokens), ("static", t.static_tokens),
            ("transcript", t.transcript_tokens),
            ("summary-tokens", t.summary_tokens), ("clipped", t.clipped_tokens), ("cleared", t.cleared_tokens),
            ("budget", t.budget), ("fed", t.fed_tokens), ("summaries", t.summaries),
            ("predicted", t.predicted_cached_tokens), ("reported", t.reported_cached_tokens)))
        + f"<td class=break-reason>{escape(t.break_reason)}</td><td class=changes>"
        + "".join(f'<span class=change data-kind="{kind}" title="{escape(title)}">{escape(short)}</span>'
                  for kind, short, title in changes(t))
        + f"</td>{_cost_cells(cost, prices)}</tr>" for t, cost in zip(turns, costs))
    legend = ("<p class=legend><span class=\"key static\"></span> static sections and tools "
              "<span class=\"key sections\"></span> per-task and per-turn sections "
              "<span class=\"key summaries\"></span> summaries <span class=\"key verbatim\"></span> transcript "
              "<span class=\"key clipped\"></span> clipped <span class=\"key cleared\"></span> cleared "
              "<span class=\"key budget\"></span> transcript budget; under the bar: "
              "<span class=\"key predicted\"></span> cached, predicted "
              "<span class=\"key reported\"></span> cached, reported by the provider; "
              "<span class=cache-key>&#9660;</span> the cache broke there (why: its column); "
              "&#9650; summaries entered or left the window, tool results were cleared, the window's start "
              "moved (its column)</p>")
    spent, without = sum(c.usd for c in costs), sum(c.without_caching_usd for c in costs)
    saved = f", {100 * (without - spent) / without:.0f}%" if without else ""
    cost = (f"<p class=costs>Modelled input cost of the turns on this page: <span id=page-cost>{usd(spent)}</span>; "
            f"without caching: <span id=page-cost-without-caching>{usd(without)}</span> (saved "
            f"{usd(without - spent)}{saved}). Prices per million tokens: input ${prices.input_usd_per_mtok}, "
            f"cached input ${prices.cached_input_usd_per_mtok}, cache writes ${prices.cache_write_usd_per_mtok} "
            f"([inspector] settings).</p>")
    nav = _pages_nav(run_id, page_number, pages, turns, total)
    return page(f"Run {run_id}", f"{nav}{legend}{cost}<table id=turns><tr><th>Iteration</th><th>Timeline</th>"
                                 "<th>Sections and tools</th><th>Of which static</th><th>Transcript tokens</th>"
                                 "<th>Of which summaries</th>"
                                 "<th>Of which clipped</th><th>Of which cleared</th>"
                                 "<th>Transcript budget</th><th>Tokens fed</th><th>Summaries fed</th>"
                                 "<th>Cached, predicted</th><th>Cached, reported</th><th>Cache broke</th>"
                                 "<th>Changed</th><th>Input cost</th><th>Without caching</th></tr>"
                                 f"{rows}</table>{nav}")


def turn_page(window: TranscriptWindow, more: str = "") -> str:
    """The turn's entries as fed, then ``more`` (the request view's parts: turn_view)."""
    rows = []
    for position, entry in enumerate(window.entries(), 1):
        untrusted = is_fenced(entry.text)
        tags = ('<span class="tag untrusted-tag">untrusted</span> ' if untrusted else "") + (
            f'<span class="tag form-tag">{entry.fed_as} from {entry.clipped_from_tokens} tokens</span>'
            if entry.fed_as else "")
        rows.append(
            f"<tr class=\"entry{' untrusted' if untrusted else ''}\" data-event-id=\"{escape(entry.event.event_id)}\">"
            f"<td class=number>{position}</td><td class=role>{escape(entry.event.role)}</td>"
            f"<td class=type>{escape(entry.event.type)}</td><td class=\"number tokens\">{entry.tokens}</td>"
            f"<td class=form>{tags}</td><td class=text>{escape(entry.text)}</td></tr>")
    summary = (f"<p>Transcript: {window.token_count} of {window.token_budget} tokens ({escape(window.token_counter)}); "
               f"everything fed: {window.window_tokens} tokens; host events omitted: {window.omitted_events}; "
               f"summarized: {window.summarized_events}.</p>")
    return page(f"Run {window.run_id}, turn {window.iteration}",
                f"<p><a href=\"{run_path(window.run_id)}\">All turns</a></p>{summary}"
                "<table id=entries><tr><th>#</th><th>Role</th><th>Type</th><th>Tokens</th><th>Fed as</th>"
                "<th>Text</th></tr>"
                + "".join(rows) + "</table>" + more)


def message_page(title: str, message: str) -> str:
    return page(title, f"<p>{escape(message)}</p>")


def token_page(wrong: bool) -> str:
    """The sign-in form: a tenant's bearer token, kept in a cookie for the session."""
    return page("Tenant token", ("<p>That token names no tenant.</p>" if wrong else "")
                + "<form method=get action=\"/\"><input name=token type=password placeholder=\"bearer token\"> "
                  "<button>Open</button></form>")
