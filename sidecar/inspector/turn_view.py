"""The turn view's request parts and the events view: plain markup over the transcript domain's
read-only answers (``Transcripts.recorded_request``, ``Transcripts.list_events``), no script."""

from __future__ import annotations

from html import escape
from urllib.parse import urlencode

from sidecar.context_window.rendering import CACHE_CONTROL
from sidecar.errors import ValidationError
from sidecar.inspector import pages
from sidecar.storage.codec import StoredEvent
from sidecar.text.fencing import is_fenced
from sidecar.transcript.summaries import Summary
from sidecar.transcript.transcripts import Recorded, Transcripts
from sidecar.transcript.turn import RequestPart

FORMS = {"openai_responses": "OpenAI Responses", "anthropic_messages": "Anthropic Messages"}
EVENTS_PER_PAGE = 100  # the events view's rows per page

STYLE = """
pre.body { white-space: pre-wrap; word-break: break-all; font: 12px/1.4 ui-monospace, monospace;
  background: #f8f8f8; border: 1px solid #ccc; padding: .5em; max-width: 100em; }
mark.breakpoint { background: #ffd54f; outline: 1px solid #c79a00; }
span.prefix-end { border-left: 3px solid #d32f2f; } span.prefix-end::before { content: "\\25BC stable prefix ends";
  color: #d32f2f; font-size: 11px; }
.forms a[aria-current] { font-weight: bold; } td.same { color: #1b5e20; } td.differs { color: #d32f2f; }
p.warning { background: #fff4e0; border-left: 4px solid #f0a030; padding: .3em .6em; }
"""


def events_path(run_id: str, from_seq: int, to_seq: int | None = None) -> str:
    query = {"from_seq": from_seq} | ({} if to_seq is None else {"to_seq": to_seq})
    return f"{pages.run_path(run_id)}/events?{urlencode(query)}"


def turn_page(transcripts: Transcripts, tenant: str, run_id: str, iteration: int,
              query: dict[str, list[str]]) -> str:
    """The turn: its entries (GetTranscriptWindow's), its summaries with what they replaced, its
    request body in the form asked for, and where it stopped repeating the previous request."""
    form = query.get("render", ["openai_responses"])[0]
    if form not in FORMS:
        raise ValidationError.field("render", f"must be one of {', '.join(FORMS)}")
    window = transcripts.transcript_window(tenant, run_id, iteration)
    recorded, previous = transcripts.recorded_request(tenant, run_id, iteration, form)
    return pages.turn_page(window, f"<style>{STYLE}</style>" + _summaries(run_id, recorded.summaries)
                           + _request(run_id, iteration, form, recorded) + _difference(form, recorded, previous))


def _summaries(run_id: str, summaries: tuple[Summary, ...]) -> str:
    if not summaries:
        return ""
    rows = "".join(
        f"<tr class=summary data-summary-ref=\"{escape(s.ref)}\"><td>{escape(s.ref)}</td><td class=number>"
        f"{s.iteration}</td><td class=range><a href=\"{events_path(run_id, s.from_seq, s.to_seq)}\">seqs "
        f"{s.from_seq}-{s.to_seq - 1}</a></td><td class=number>{len(s.replaced_turns)}</td>"
        f"<td class=number>{len(s.replaced_summaries)}</td>"
        f"<td class=number>{s.tokens_before}</td><td class=number>{s.tokens_after}</td></tr>" for s in summaries)
    return ("<h2>Summaries fed</h2><table id=summaries><tr><th>Summary</th><th>Fed from iteration</th>"
            "<th>Events it replaced</th><th>Entries replaced</th><th>Summaries it folds in</th>"
            f"<th>Tokens before</th><th>Tokens after</th></tr>{rows}</table>")


def _request(run_id: str, iteration: int, form: str, recorded: Recorded) -> str:
    links = " ".join(f"<a href=\"{pages.turn_path(run_id, iteration)}?render={name}\""
                     + (" aria-current=page" if name == form else "") + f">{label}</a>"
                     for name, label in FORMS.items())
    cache = recorded.answer.cache
    report = (f"<p id=cache-report data-break-at={cache.break_at} data-break-reason=\"{escape(cache.break_reason)}\" "
              f"data-stable-prefix-tokens={cache.stable_prefix_tokens}>Cache report: the first {cache.break_at} "
              f"part(s), {cache.stable_prefix_tokens} of {cache.request_tokens} tokens, repeat the previous request"
              + (f"; it broke: <b class=break-reason>{escape(cache.break_reason)}</b>" if cache.break_reason else "")
              + ".</p>")
    notes = ""
    if recorded.recorded_form is not None and recorded.recorded_form != form:
        notes += (f"<p class=warning id=other-form>This turn was assembled in the form "
                  f"\"{escape(recorded.recorded_form or 'plain')}\": this body is what AssembleContext answers for "
                  f"{FORMS[form]} now, and its cache report compares it with that form.</p>")
    if not recorded.fed_again:
        notes += ("<p class=warning id=not-fed-again>The run moved on since this turn was assembled (events "
                  "appended, a summary recorded, its settings changed): AssembleContext for this iteration would "
                  "now choose its window again. Shown is what was fed.</p>")
    if not recorded.as_fed:
        notes += ("<p class=warning id=not-as-fed>The run's profile or task changed after this turn, and only the "
                  "current ones are stored: the request body it was sent cannot be shown.</p>")
        body = ""
    else:
        body = f"<pre class=body id=request-body>{_marked_body(recorded)}</pre>"
    legend = (f"<p class=legend>The body as sent (raw JSON, the bytes the provider's cache compares): "
              f"<mark class=breakpoint>{escape(CACHE_CONTROL)}</mark> a cache breakpoint; "
              "<span class=prefix-end></span> where the part the cache report names as the first to differ from "
              "the previous request begins (for OpenAI the static prefix also holds the tools and the prompt "
              "cache key after the input).</p>") if body else ""
    return f"<h2>Request</h2><p class=forms>{links}</p>{report}{notes}{legend}{body}"


def _marked_body(recorded: Recorded) -> str:
    """The body, escaped, with its breakpoints marked and the stable prefix's end."""
    body, where = recorded.answer.rendered, recorded.body
    if where is None or len(where.starts) != len(recorded.parts) - 1:  # parts not found in it: nothing marked
        return escape(body)
    at = recorded.answer.cache.break_at
    end = where.end if at > len(where.starts) else where.starts[at - 1] if at else 0
    marks = sorted([(point, "bp") for point in where.breakpoints] + [(end, "end")])
    out, done = [], 0
    for point, kind in marks:
        out.append(escape(body[done:point]))
        if kind == "end":
            out.append(f"<span class=prefix-end id=prefix-end data-part={at}></span>")
            done = point
        else:
            out.append(f"<mark class=breakpoint>{escape(body[point:point + len(CACHE_CONTROL)])}</mark>")
            done = point + len(CACHE_CONTROL)
    out.append(escape(body[done:]))
    return "".join(out)


def _label(part: RequestPart) -> str:
    if not part.known:
        return "(not stored: sent under a profile or task since replaced)" if not part.items else ""
    if part.section:
        return part.section if part.section == "static prefix" else f"section {part.section}"
    if not part.items:
        return "the rendering's own text"
    return ", ".join(f"{item.role} {item.type or 'message'}" for item in part.items)


def _text(part: RequestPart | None) -> str:
    if part is None:
        return "<p>(none: the request ended before it)</p>"
    if not part.known:
        return f"<p>{escape(_label(part))}</p>"
    texts = [part.text] if part.section else [item.text for item in part.items]
    return "".join(f"<pre class=\"body{' untrusted' if is_fenced(text) else ''}\">{escape(text)}</pre>"
                   for text in texts) or "<p>(the rendering's own text)</p>"


def _difference(form: str, recorded: Recorded, previous: Recorded | None) -> str:
    if previous is None:
        return "<h2>Against the previous request</h2><p id=no-previous>The first turn: nothing before it.</p>"
    cache = recorded.answer.cache
    at = cache.break_at
    rows = []
    for index, part in enumerate(recorded.parts):
        state = ("same", "same as before") if index < at else ("differs", "first difference") if index == at \
            else ("after", "")
        rows.append(f"<tr class=part data-part={index}><td class=number>{index}</td><td>{escape(_label(part))}</td>"
                    f"<td class=number>{part.tokens}</td><td class={state[0]}>{state[1]}</td></tr>")
    now = recorded.parts[at] if at < len(recorded.parts) else None
    before = previous.parts[at] if at < len(previous.parts) else None
    where = (f"<div id=first-difference data-part={at} data-break-reason=\"{escape(cache.break_reason)}\">"
             f"<h3>Part {at}: {escape(cache.break_reason or 'no break: all of the previous request repeats')}</h3>"
             f"<table><tr><th>Turn {previous.answer.window.iteration} (previous)</th><th>This turn</th></tr>"
             f"<tr><td class=previous-part>{_text(before)}</td><td class=this-part>{_text(now)}</td></tr></table>"
             "</div>")
    other = "" if previous.recorded_form in (form, None) else (
        f"<p class=warning>Turn {previous.answer.window.iteration} was assembled in the form "
        f"\"{escape(previous.recorded_form or 'plain')}\".</p>")
    return (f"<h2>Against the previous request</h2><p>Turn {previous.answer.window.iteration}'s request, in the "
            f"same form: the first {at} of this request's {len(recorded.parts)} parts repeat it.</p>{other}{where}"
            "<table id=parts><tr><th>Part</th><th>What</th><th>Tokens</th><th>Previous request</th></tr>"
            + "".join(rows) + "</table>")


def events_page(transcripts: Transcripts, tenant: str, run_id: str, query: dict[str, list[str]]) -> str:
    """The run's stored events from ``from_seq`` up to ``to_seq`` (exclusive; none: to the end), a
    page at a time, as ListRunEvents answers them."""
    from_seq = _number(query, "from_seq") or 0
    to_seq = _number(query, "to_seq")
    limit = EVENTS_PER_PAGE if to_seq is None else min(EVENTS_PER_PAGE, to_seq - from_seq)
    events, following = transcripts.list_events(tenant, run_id, from_seq, limit) if limit > 0 else ([], None)
    more = following is not None and (to_seq is None or following < to_seq)
    rows = "".join(_event_row(event) for event in events)
    span = f"seqs {from_seq}-{'' if to_seq is None else to_seq - 1}"
    nav = f"<p class=pages>{escape(span)}" + (
        f" <a rel=next href=\"{events_path(run_id, following, to_seq)}\">Next</a>" if more and following else "") \
        + "</p>"
    return pages.page(f"Run {run_id}, events", f"<p><a href=\"{pages.run_path(run_id)}\">All turns</a></p>{nav}"
                      "<table id=events><tr><th>Seq</th><th>Iteration</th><th>Role</th><th>Type</th><th>Tokens</th>"
                      f"<th>Trust</th><th>Text</th></tr>{rows}</table>{nav}" + ("" if events else "<p>No events.</p>"))


def _event_row(event: StoredEvent) -> str:
    untrusted = is_fenced(event.content)
    tag = '<span class="tag untrusted-tag">untrusted</span> ' if untrusted else ""
    return (f"<tr class=\"event{' untrusted' if untrusted else ''}\" data-event-id=\"{escape(event.event_id)}\">"
            f"<td class=number>{event.seq}</td><td class=number>{event.iteration}</td>"
            f"<td class=role>{escape(event.role)}</td><td class=type>{escape(event.type)}</td>"
            f"<td class=\"number tokens\">{event.tokens}</td><td class=form>{tag}</td>"
            f"<td class=text>{escape(event.content)}</td></tr>")


def _number(query: dict[str, list[str]], name: str) -> int | None:
    given = query.get(name, [""])[0]
    if not given:
        return None
    if not given.isdigit():
        raise ValidationError.field(name, "must be a whole number")
    return int(given)
