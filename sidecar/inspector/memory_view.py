"""The inspector's memory view: a tenant's memory refs, a ref's entries (paginated), and a preview
of what ListMemory answers for a query and budget, through the same call (``Memories.list``)."""

from __future__ import annotations

from html import escape
from http import HTTPStatus
from urllib.parse import quote

from sidecar.errors import ValidationError
from sidecar.inspector.pages import message_page, page, pages_nav, when
from sidecar.memory.api import RANKS, EntriesPage, ListRequest, Memories, MemoryList, RefOverview
from sidecar.storage.codec import StoredMemory

REFS_PER_PAGE = 100
ENTRIES_PER_PAGE = 100
COMPACTIONS_SHOWN = 20  # the newest of a ref's compaction records
# The preview form's fields, as ListMemoryRequest names them (query_embedding aside: no one types a vector).
PREVIEW_FIELDS = ("query", "rank", "token_budget", "tag", "limit")
INT32_MAX = 2**31 - 1  # the request's numbers are int32 on the wire


def memory_path(memory_ref: str = "") -> str:
    return f"/memory/{quote(memory_ref, safe='')}" if memory_ref else "/memory"


def answer(memories: Memories, tenant: str, memory_ref: str | None,
           query: dict[str, list[str]]) -> tuple[HTTPStatus, str]:
    """``/memory`` (``memory_ref`` None) or ``/memory/<ref>``. NotFound and ValidationError of a
    ref's own read propagate (the inspector answers 404); a preview's bad input answers 400, the
    page shown with the domain's message."""
    asked = query.get("page", ["1"])[0]
    page_number = int(asked) if asked.isdigit() else 0
    if memory_ref is None:
        refs, total = memories.refs(tenant, max(page_number - 1, 0) * REFS_PER_PAGE, REFS_PER_PAGE)
        last = _last_page(total, REFS_PER_PAGE)
        if not 1 <= page_number <= last:
            return _no_such_page("the memory refs", last, asked)
        return HTTPStatus.OK, _refs_page(refs, total, page_number, last, memories.token_counter)
    shown = memories.entries(tenant, memory_ref, max(page_number - 1, 0) * ENTRIES_PER_PAGE, ENTRIES_PER_PAGE)
    last = _last_page(shown.total, ENTRIES_PER_PAGE)
    if not 1 <= page_number <= last:
        return _no_such_page(f"memory ref {memory_ref!r}", last, asked)
    form = {name: query.get(name, [""])[0] for name in PREVIEW_FIELDS}
    preview: MemoryList | None = None
    status, error = HTTPStatus.OK, ""
    if "preview" in query:
        try:
            preview = memories.list(tenant, _list_request(memory_ref, form))
        except ValidationError as invalid:
            status, error = HTTPStatus.BAD_REQUEST, invalid.message
    # The entries' pages keep the preview asked for.
    kept = {name: value for name, value in form.items() if value} | ({"preview": "1"} if "preview" in query else {})
    body = (_summary(shown, memories.token_counter) + _preview_form(memory_ref, form, error)
            + (_preview(preview) if preview else "") + _entries(memory_ref, shown, page_number, last, kept)
            + _compactions(shown))
    return status, page(f"Memory ref {memory_ref}", f"<p><a href=\"{memory_path()}\">All memory refs</a></p>{body}")


def _last_page(total: int, size: int) -> int:
    return max(1, -(-total // size))  # nothing to show is one page, empty


def _no_such_page(what: str, last: int, asked: str) -> tuple[HTTPStatus, str]:
    return HTTPStatus.NOT_FOUND, message_page("Not found", f"{what} have {last} page(s), not {asked!r}")


def _whole_number(field: str, text: str) -> int:
    """A number of the form, as the request's int32 field would carry it."""
    try:
        value = int(text)
    except ValueError:
        raise ValidationError.field(field, f"must be a whole number, not {text!r}") from None
    if not -INT32_MAX - 1 <= value <= INT32_MAX:
        raise ValidationError.field(field, f"must fit in 32 bits (at most {INT32_MAX})")
    return value


def _list_request(memory_ref: str, form: dict[str, str]) -> ListRequest:
    """The ListMemoryRequest the form stands for: an empty budget is an absent one, an empty
    limit is 0 (no count bound), as on the wire."""
    budget = form["token_budget"].strip()
    limit = form["limit"].strip()
    return ListRequest(memory_ref, limit=_whole_number("limit", limit) if limit else 0, tag=form["tag"],
                       token_budget=_whole_number("token_budget", budget) if budget else None,
                       rank=form["rank"], query=form["query"])


def _refs_page(refs: list[RefOverview], total: int, page_number: int, last: int, counter: str) -> str:
    rows = "".join(
        f"<tr class=ref><td class=memory-ref><a href=\"{memory_path(r.memory_ref)}\">{escape(r.memory_ref)}</a></td>"
        f"<td class=\"number entries\">{r.entries}</td><td class=\"number tokens\">{r.tokens}</td>"
        f"<td class=\"number compactions\">{r.compactions}</td></tr>" for r in refs)
    nav = pages_nav(memory_path(), {}, page_number, last, f"{total} refs")
    return page("Memory", f"<p>Tokens in the memory's counter, {escape(counter)}; entries that expired are not "
                          f"counted.</p>{nav}<table id=refs><tr><th>Memory ref</th><th>Entries</th><th>Tokens</th>"
                          f"<th>Compactions</th></tr>{rows}</table>" + ("" if refs else "<p>No memory refs.</p>"))


def _summary(shown: EntriesPage, counter: str) -> str:
    return (f"<p class=summary>{shown.total} live entries, {shown.tokens} tokens in the memory's counter "
            f"({escape(counter)}); content as stored (redacted when it was put).</p>")


def _preview_form(memory_ref: str, form: dict[str, str], error: str) -> str:
    ranks = "".join(f"<option{' selected' if form['rank'] == rank else ''}>{escape(rank)}</option>"
                    for rank in dict.fromkeys(("", *RANKS, form["rank"])))  # a rank asked that is none, shown
    return (f"<h2>ListMemory preview</h2><form id=preview method=get action=\"{memory_path(memory_ref)}\">"
            "<input type=hidden name=preview value=1>"
            f"<label>query <input name=query value=\"{escape(form['query'])}\"></label> "
            f"<label>rank <select name=rank>{ranks}</select></label> "
            f"<label>token_budget <input name=token_budget value=\"{escape(form['token_budget'])}\" size=8></label> "
            f"<label>tag <input name=tag value=\"{escape(form['tag'])}\" size=12></label> "
            f"<label>limit <input name=limit value=\"{escape(form['limit'])}\" size=6></label> "
            "<button>Preview</button></form>"
            + (f"<p class=error style=\"color: #b00020\">{escape(error)}</p>" if error else ""))


def _entry_cells(entry: StoredMemory) -> str:
    ttl = f"{(entry.expires_ms - entry.created_ms) // 1000} s, until {when(entry.expires_ms)}" \
        if entry.expires_ms else "never expires"
    return (f"<td class=entry-id>{escape(entry.entry_id)}</td><td class=stored-at>{when(entry.created_ms)}</td>"
            f"<td class=ttl>{ttl}</td><td class=tags>{escape(', '.join(entry.tags))}</td>"
            f"<td class=\"number tokens\">{entry.tokens}</td><td class=text>{escape(entry.content)}</td>")


ENTRY_HEADINGS = ("<th>Id</th><th>Stored (put or replaced)</th><th>TTL</th><th>Tags</th><th>Tokens</th>"
                  "<th>Content</th>")


def _preview(listed: MemoryList) -> str:
    scores = listed.scores or []
    rows = "".join(
        f"<tr class=entry data-entry-id=\"{escape(entry.entry_id)}\"><td class=number>{position}</td>"
        f"<td class=\"number score\">{f'{scores[position - 1]:.4f}' if scores else ''}</td>{_entry_cells(entry)}</tr>"
        for position, entry in enumerate(listed.entries(), 1))
    figures = (("rank", listed.rank), ("tokens_used", listed.tokens_used),
               ("left_out_for_budget", listed.left_out_for_budget), ("left_out_for_size", listed.left_out_for_size),
               ("token_counter", listed.token_counter))
    return ("<p id=preview-answer>ListMemory answers: "
            + ", ".join(f"{name} <span class=\"{name.replace('_', '-')}\">{escape(str(value))}</span>"
                        for name, value in figures)
            + f"</p><table id=preview-entries><tr><th>#</th><th>Score</th>{ENTRY_HEADINGS}</tr>{rows}</table>")


def _entries(memory_ref: str, shown: EntriesPage, page_number: int, last: int, kept: dict[str, str]) -> str:
    rows = "".join(f"<tr class=entry data-entry-id=\"{escape(entry.entry_id)}\">{_entry_cells(entry)}</tr>"
                   for entry in shown.entries)
    skip = (page_number - 1) * ENTRIES_PER_PAGE
    where = f"entries {skip + 1}-{skip + len(shown.entries)}, " if shown.entries else ""
    nav = pages_nav(memory_path(memory_ref), kept, page_number, last,
               f"{where}{shown.total} in all, newest first")
    return f"<h2>Entries</h2>{nav}<table id=entries><tr>{ENTRY_HEADINGS}</tr>{rows}</table>{nav}"


def _compactions(shown: EntriesPage) -> str:
    if not shown.compactions:
        return ""
    rows = "".join(
        f"<tr class=compaction><td>{escape(c.compaction_id)}</td><td>{escape(str(c.event.get('ts', '')))}</td>"
        f"<td>{escape(str(c.event.get('trigger', '')))}</td><td class=number>{c.source_count}</td>"
        f"<td>{escape(c.output_id)}</td></tr>" for c in shown.compactions[:COMPACTIONS_SHOWN])
    return (f"<h2>Compactions</h2><p>{len(shown.compactions)} recorded, the newest first"
            f"{f' (the {COMPACTIONS_SHOWN} newest shown)' if len(shown.compactions) > COMPACTIONS_SHOWN else ''}."
            "</p><table id=compactions><tr><th>Compaction</th><th>When</th><th>Trigger</th><th>Sources</th>"
            f"<th>Entry made</th></tr>{rows}</table>")
