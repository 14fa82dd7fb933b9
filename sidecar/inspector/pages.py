"""The inspector's pages, as HTML strings: plain markup over the domain's values, no script."""

from __future__ import annotations

import datetime
from html import escape
from urllib.parse import quote

from sidecar.text.fencing import is_fenced
from sidecar.transcript.transcripts import RunOverview, TurnOverview
from sidecar.transcript.window import TranscriptWindow

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: .25em .5em; vertical-align: top; }
th { background: #f3f3f3; text-align: left; } td.number { text-align: right; }
td.text { white-space: pre-wrap; font-family: ui-monospace, monospace; max-width: 60em; }
tr.untrusted td.text { background: #fff4e0; } .tag { font-size: 12px; padding: 0 .3em; border-radius: 3px; }
.untrusted-tag { background: #f0a030; color: #000; } .form-tag { background: #ddd; }
"""


def run_path(run_id: str) -> str:
    return f"/runs/{quote(run_id, safe='')}"


def turn_path(run_id: str, iteration: int) -> str:
    return f"{run_path(run_id)}/turns/{iteration}"


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><nav><a href=\"/\">Runs</a></nav><h1>{escape(title)}</h1>"
            f"{body}</body></html>")


def when(ms: int) -> str:
    """An instant as UTC, to the second; never assembled: an empty cell."""
    if not ms:
        return ""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def runs_page(runs: list[RunOverview], query: str) -> str:
    rows = "".join(
        f"<tr class=run><td class=run-id><a href=\"{run_path(r.run_id)}\">{escape(r.run_id)}</a></td>"
        f"<td class=number>{r.turns}</td><td class=number>{r.tokens}</td><td class=number>{r.summaries}</td>"
        f"<td>{when(r.last_turn_ms)}</td></tr>" for r in runs)
    search = (f"<form method=get action=\"/\"><input name=q value=\"{escape(query)}\" "
              "placeholder=\"run id contains\"> <button>Search</button></form>")
    return page("Runs", f"{search}<table id=runs><tr><th>Run</th><th>Turns</th><th>Tokens fed (newest turn)</th>"
                        f"<th>Summaries</th><th>Last activity</th></tr>{rows}</table>"
                        + ("" if runs else "<p>No runs.</p>"))


def run_page(run_id: str, turns: list[TurnOverview]) -> str:
    rows = "".join(
        f"<tr class=turn><td><a href=\"{turn_path(run_id, t.iteration)}\">{t.iteration}</a></td>"
        f"<td class=number>{t.fed_tokens}</td><td class=number>{t.transcript_tokens}</td>"
        f"<td class=number>{t.budget}</td><td class=number>{t.summaries}</td></tr>" for t in turns)
    return page(f"Run {run_id}", f"<table id=turns><tr><th>Iteration</th><th>Tokens fed</th><th>Transcript tokens</th>"
                                 f"<th>Transcript budget</th><th>Summaries fed</th></tr>{rows}</table>")


def turn_page(window: TranscriptWindow) -> str:
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
                + "".join(rows) + "</table>")


def message_page(title: str, message: str) -> str:
    return page(title, f"<p>{escape(message)}</p>")


def token_page(wrong: bool) -> str:
    """The sign-in form: a tenant's bearer token, kept in a cookie for the session."""
    return page("Tenant token", ("<p>That token names no tenant.</p>" if wrong else "")
                + "<form method=get action=\"/\"><input name=token type=password placeholder=\"bearer token\"> "
                  "<button>Open</button></form>")
