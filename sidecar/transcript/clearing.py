"""What an event is fed as from some turn on, when not its content: cleared tool results and
results clipped in their own turn.

*Clearing* (``[context.clearing]``) is the cheap first step before any summary: once the
transcript fed from the window's start passes ``trigger_fraction`` of the budget, the oldest tool
results (answered calls, outside the active turn, not among the newest ``keep_recent``, not of an
excluded tool) are fed as a short fixed placeholder, oldest first, until at least
``clear_at_least_tokens`` are freed (and the transcript is back under the trigger). Fewer
freeable tokens than that: nothing is cleared, since each clearing breaks the provider's cache
from the first cleared result on, and small steps would break it every turn; except when the
transcript would pass the budget and clearing all it may averts that (in a run without
summaries): the window's start would move, a break at its first entry, which re-bills more.

*Clipping*: an event clipped in its own turn (the active turn alone over the budget) keeps the
clipped form it was fed then on every later turn; fed whole again it would not fit, and the
window would shrink to a few entries around it.

A clearing is the sidecar's own log entry (``context.cleared``: which events, tokens before and
after) with its compaction record, written in the transaction of the assembly that decided it;
a kept clip needs none (the window record that fed it says it). The forms are kept by (event
seq, the log's end when made) in ``fed_forms``, and the event's packed count becomes its form's,
so fastcore's selection weighs what is fed. A window record lists the forms it fed, so a window
read back is the one fed even after later clearings; a fork carries the forms of what it carries
and restores the counts of the others, and a replay fork makes the rest again as the source did
(the same log, the same settings, the same decisions).

The placeholder is the sidecar's own text and is not fenced as untrusted: it holds no byte of
the tool's output, only the tool's name (A-Z a-z 0-9 _ -), the host's call id (quoted as JSON)
and a count.
"""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass, replace

import lmdb

import fastcore
from sidecar.settings import ClearingSettings
from sidecar.storage.codec import StoredEvent, decode_event, dump_json, load_json
from sidecar.storage.keys import be32, records_under
from sidecar.text.fencing import split_block
from sidecar.transcript.log import CHUNK_EVENTS, LogWriter, prefix_end, read_counts
from sidecar.transcript.runs import SIDECAR_ID_PREFIX, Deps
from sidecar.transcript.summaries import in_force, put_compaction_record

CLEARED_TYPE = "context.cleared"
_COUNT = struct.Struct("<III")


@dataclass(frozen=True, slots=True)
class FedForm:
    """What event ``seq`` is fed as, from the assembly that made it on."""

    seq: int
    made_at: int  # the run's next seq then (a clearing's: its log entry's seq); orders an event's forms
    kind: str  # "cleared" or "clipped"
    text: str
    tokens: int
    original_tokens: int  # the event content's own count

    def as_event(self, event: StoredEvent) -> StoredEvent:
        return replace(event, content=self.text, tokens=self.tokens)


def _form_key(key: bytes, seq: int, made_at: int) -> bytes:
    return key + be32(seq) + be32(made_at)


_MEMOISED_FORM_BYTES = 4096  # a placeholder's form is ~250 bytes; a clip's can be half the budget


def _parse(key: bytes, stored_key: bytes, value: bytes) -> FedForm:
    suffix = stored_key[len(key):]
    return _small_form(suffix, value) if len(value) <= _MEMOISED_FORM_BYTES else _form_of(suffix, value)


def _form_of(suffix: bytes, value: bytes) -> FedForm:
    fields = load_json(value)
    return FedForm(int.from_bytes(suffix[:4], "big"), int.from_bytes(suffix[4:8], "big"), fields["kind"],
                   fields["text"], fields["tokens"], fields["original_tokens"])


# Every turn reads the forms of its whole window (a cleared run's window is mostly placeholders),
# and a stored form is a pure function of its bytes: the parse of the small ones is memoised by
# them, never stale whatever is deleted, forked or written again under the same key.
_small_form = functools.lru_cache(maxsize=16384)(_form_of)

_last_window_record: tuple[bytes, dict] | None = None


def window_record(stored: bytes) -> dict:
    """A persisted window record, parsed, to be read and never changed: an assembly reads the
    previous window's record at four stages (kept clips, clearing, the window's start, the cache
    report), so the last one parsed is kept with its bytes and given again for equal bytes."""
    global _last_window_record
    last = _last_window_record
    if last is not None and last[0] == stored:
        return last[1]
    record = load_json(stored)
    _last_window_record = (stored, record)  # one slot, replaced whole: safe across threads
    return record


def current_forms(txn: lmdb.Transaction, db: dict, key: bytes, start: int, end: int) -> dict[int, FedForm]:
    """The newest form of each event of ``[start, end)`` that has one, by seq."""
    forms: dict[int, FedForm] = {}
    for suffix, value in records_under(txn, db["fed_forms"], key, be32(start)):
        if int.from_bytes(suffix[:4], "big") >= end:
            break
        form = _parse(key, key + suffix, value)
        forms[form.seq] = form  # keys ascend by (seq, made_at): the last one of a seq is its newest
    return forms


def forms_listed(txn: lmdb.Transaction, db: dict, key: bytes, listed: list[list[int]]) -> list[FedForm]:
    """The forms a window record lists as [seq, made_at] pairs, in one C-level pass."""
    if not listed:
        return []
    found = txn.cursor(db=db["fed_forms"]).getmulti([_form_key(key, seq, made_at) for seq, made_at in listed])
    return [_parse(key, stored_key, value) for stored_key, value in found]


# A tool's own output is always fed fenced (sidecar.text.fencing), so no fed result but a
# placeholder starts with this.
PLACEHOLDER_OPENING = "[tool result cleared to save context: "


def placeholder(tool_name: str, call_id: str, tokens: int) -> str:
    return (f"{PLACEHOLDER_OPENING}tool {tool_name or 'unknown'}, call_id {json.dumps(call_id)}, "
            f"{tokens} tokens; call the tool again if it is needed]")


def may_be_cleared(role: str, text: str) -> bool:
    """Whether an entry fed as ``text`` is a tool result a later clearing could still change."""
    return role == "tool" and not text.startswith(PLACEHOLDER_OPENING)


def before_plan(deps: Deps, settings: ClearingSettings, writer: LogWriter, iteration: int, budget: int) -> bool:
    """At an assembly of ``iteration``, before its window is chosen (``writer`` flushed): keep the
    clips of the last window fed, then clear tool results if the transcript passed the trigger.
    True when the log changed (the caller flushes the writer)."""
    run = writer.run
    if run.settings.token_counter == "host-defined":
        return False  # host-defined text cannot be counted: a placeholder's count would be a guess
    changed = _keep_clips(deps, writer, iteration, budget)
    if changed:
        writer.flush()  # the clearing reads the counts as they now stand
    # Only at the log's newest iteration: an older one (assembled again, or before events the
    # host appended already) is chosen from the log as it stands, and a clearing's entry must
    # not come after events of a later iteration than its own.
    if settings.enabled and iteration >= max(run.last_assembled, run.last_iteration):
        changed = _clear(deps, settings, writer, iteration, budget) or changed
    return changed


def _keep_clips(deps: Deps, writer: LogWriter, iteration: int, budget: int) -> bool:
    """The events the last window fed clipped are fed clipped from now on, at most half the
    budget each: clipped in its own turn to all the room the turn left, a result could never
    sit beside the next turn, and the window would drop it and all before it (measured at an
    800-token budget: 5 entries and 157 tokens on the next turn, the same as fed whole)."""
    txn, db, key, run = writer.txn, writer.db, writer.key, writer.run
    if iteration <= run.last_assembled or not run.last_assembled:
        return False
    stored = txn.get(key + be32(run.last_assembled), db=db["windows"])
    clipped = window_record(stored)["clipped"] if stored is not None else []
    if not clipped:
        return False
    # No log entry: the clips are in the window record, which a fork carries or makes again.
    counter = deps.counters.get(run.settings.token_counter)
    for seq, text, tokens in clipped:
        original = decode_event(txn.get(key + be32(seq), db=db["events"]))
        if tokens > budget // 2:
            opening, inside, closing = split_block(original.content) or ("", original.content, "")
            shorter = counter.clip(inside, budget // 2, opening, closing)
            if shorter:  # else the marker and the block's lines alone pass half the budget: keep the turn's clip
                text, tokens = shorter, counter.count(shorter)
        _put_form(writer, original, "clipped", text, tokens, iteration)
    return True


def _clear(deps: Deps, settings: ClearingSettings, writer: LogWriter, iteration: int, budget: int) -> bool:
    txn, db, key, run = writer.txn, writer.db, writer.key, writer.run
    end = prefix_end(txn, db, key, run, iteration)
    top = in_force(txn, db, key, run, iteration) if run.summaries else None
    start = top.to_seq if top else 0
    last = txn.get(key + be32(run.last_assembled), db=db["windows"]) if run.last_assembled else None
    if last is not None:
        # What would be fed if the window's start stayed where it was last fed: only results
        # there cost anything, so only they are worth clearing.
        start = max(start, window_record(last)["start"])
    counts = read_counts(txn, db, key, start, end)
    records = list(_COUNT.iter_unpack(counts))
    fed = sum(tokens for tokens, _, group_first in records if group_first != fastcore.NOT_A_UNIT)
    trigger = settings.trigger_fraction * budget
    if fed <= trigger:
        return False
    # Tool results answering a call before them: their group starts at the call.
    answered = [start + i for i, (_, _, group_first) in enumerate(records)
                if group_first != fastcore.NOT_A_UNIT and group_first < start + i]
    if not answered:
        return False
    # Only tool results are ever cleared, so a result already cleared needs no decoding to be
    # known one (a cleared run's window is mostly those): None stands for it.
    forms = current_forms(txn, db, key, answered[0], answered[-1] + 1)
    cleared = {seq for seq, form in forms.items() if form.kind == "cleared"}
    results: list[StoredEvent | None] = []
    for seq in answered:
        if seq in cleared:
            results.append(None)
            continue
        record = decode_event(txn.get(key + be32(seq), db=db["events"]))
        if record.role == "tool":
            results.append(record)
    clearable = results[:max(len(results) - settings.keep_recent, 0)]
    if not clearable:
        return False
    counter = deps.counters.get(run.settings.token_counter)
    step = settings.clear_at_least_tokens or budget // 2
    target = max(step, fed - int(trigger))
    freed, changes = 0, []
    for event in clearable:
        if event is None or event.iteration >= iteration:
            continue
        call = decode_event(txn.get(key + be32(records[event.seq - start][2]), db=db["events"]))
        if call.tool_name in settings.exclude_tools:
            continue
        text = placeholder(call.tool_name, event.call_id, event.tokens)
        tokens = counter.count(text)
        weighs = records[event.seq - start][0]  # as fed now: a clipped result at its clipped size
        if tokens >= weighs:
            continue
        freed += weighs - tokens
        changes.append((event, text, tokens))
        if freed >= target:
            break
    # A smaller step only instead of a move of the window's start, which would break the cache at
    # its first entry, before any result (a summarising run moves its start by summaries).
    averts_a_move = not run.settings.summarization and fed - freed <= budget < fed
    if not changes or (freed < step and not averts_a_move):
        return False
    _record(writer, CLEARED_TYPE, "cleared", iteration, changes)
    return True


def _put_form(writer: LogWriter, event: StoredEvent, kind: str, text: str, tokens: int, iteration: int) -> None:
    """``event`` is fed as ``text`` (``tokens``) from the assembly of ``iteration`` on, which
    happens with the log ending at the run's next seq (the form's version)."""
    writer.txn.put(_form_key(writer.key, event.seq, writer.run.next_seq), dump_json({
        "kind": kind, "text": text, "tokens": tokens, "original_tokens": event.tokens, "iteration": iteration}),
        db=writer.db["fed_forms"])
    writer.recount(event.seq, tokens)


def _record(writer: LogWriter, entry_type: str, kind: str, iteration: int,
            changes: list[tuple[StoredEvent, str, int]]) -> None:
    """Write the forms of ``changes`` (event, text fed from now on, its count), their log entry
    and its compaction record; the events' counts become the forms'."""
    txn, db, key, run = writer.txn, writer.db, writer.key, writer.run
    made_at = run.next_seq
    counts = read_counts(txn, db, key, changes[0][0].seq, changes[-1][0].seq + 1)
    before = after = 0
    for event, text, tokens in changes:
        weighs = _COUNT.unpack_from(counts, (event.seq - changes[0][0].seq) * fastcore.RECORD_SIZE)[0]
        before, after = before + weighs, after + tokens
        _put_form(writer, event, kind, text, tokens, iteration)
    ids = [event.event_id for event, _, _ in changes]
    payload = json.dumps({"iteration": iteration, "eventIds": ids, "tokenCounter": run.settings.token_counter,
                          "tokensBefore": before, "tokensAfter": after}, separators=(",", ":"))
    entry = StoredEvent(made_at, f"{SIDECAR_ID_PREFIX}{entry_type}:{run.log_entries}", iteration, "system",
                        entry_type, payload, "", 0)
    put_compaction_record(writer, entry, {"kind": kind, "removed": ids, "summary_ref": "", "tokens_before": before,
                                          "tokens_after": after, "by": "built-in"})


def fork_forms(txn: lmdb.Transaction, db: dict, source_key: bytes, fork_key: bytes, from_seq: int,
               last_assembled: int) -> None:
    """Give a fork the forms it carries: a clearing's when its log entry is below ``from_seq``, a
    kept clip's when the assembly that kept it is among the fork's (up to ``last_assembled``;
    the fork keeps the others itself at its next assembly). The counts of events whose forms the
    fork does not carry go back to what they weighed without them."""
    later: dict[int, int] = {}  # seq -> what it weighs in the fork
    kept: dict[int, int] = {}
    for suffix, value in records_under(txn, db["fed_forms"], source_key):
        seq, made_at = int.from_bytes(suffix[:4], "big"), int.from_bytes(suffix[4:8], "big")
        if seq >= from_seq:
            break
        form = _parse(source_key, source_key + suffix, value)
        if (made_at < from_seq) if form.kind == "cleared" else (load_json(value)["iteration"] <= last_assembled):
            txn.put(fork_key + suffix, value, db=db["fed_forms"])
            kept[seq] = form.tokens
        else:
            later.setdefault(seq, form.original_tokens)
    chunks: dict[int, bytearray] = {}
    for seq, original in later.items():
        chunk = seq // CHUNK_EVENTS
        if chunk not in chunks:
            chunks[chunk] = bytearray(txn.get(fork_key + be32(chunk), db=db["counts"]))
        at = (seq - chunk * CHUNK_EVENTS) * fastcore.RECORD_SIZE
        chunks[chunk][at:at + 4] = kept.get(seq, original).to_bytes(4, "little")
    for chunk, records in chunks.items():
        txn.put(fork_key + be32(chunk), bytes(records), db=db["counts"])
