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
and restores the counts of the others, and a replay fork makes the rest again: while it replays
its source, it clears where the source's log entries say, whatever its own settings, and
decides for itself only after them.

The placeholder is the sidecar's own text and is not fenced as untrusted: it holds no byte of
the tool's output, only the tool's name (A-Z a-z 0-9 _ -), the host's call id (quoted as JSON)
and a count.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import compress

import fastcore
from sidecar.settings import ClearingSettings
from sidecar.storage.codec import StoredEvent
from sidecar.storage.keys import Txn
from sidecar.telemetry import metrics
from sidecar.text.counting import Counters, TokenCounter
from sidecar.transcript.log import LogWriter, prefix_end
from sidecar.transcript.runs import SIDECAR_ID_PREFIX, Deps
from sidecar.transcript.schema import (
    FedForm,
    LogChunks,
    WindowRecord,
    copy_form,
    count_at,
    count_columns,
    current_forms,
    event_by_id,
    forms_below,
    made_in,
    put_form,
    read_counts,
    read_event,
    tokens_at,
)
from sidecar.transcript.summaries import append_compaction, in_force, kept_turns
from sidecar.transcript.window import clip_frame

CLEARED_TYPE = "context.cleared"


# A tool's own output is always fed fenced (sidecar.text.fencing), so no fed result but a
# placeholder starts with this.
PLACEHOLDER_OPENING = "[tool result cleared to save context: "


def placeholder(tool_name: str, call_id: str, tokens: int) -> str:
    return (f"{PLACEHOLDER_OPENING}tool {tool_name or 'unknown'}, call_id {json.dumps(call_id)}, "
            f"{tokens} tokens; call the tool again if it is needed]")


def may_be_cleared(role: str, text: str) -> bool:
    """Whether an entry fed as ``text`` is a tool result not cleared yet."""
    return role == "tool" and not text.startswith(PLACEHOLDER_OPENING)


def replacement(settings: ClearingSettings, counter: TokenCounter, tool_name: str, call_id: str,
                original_tokens: int, fed_tokens: int) -> tuple[str, int] | None:
    """The placeholder (and its count) a clearing feeds in place of a result of ``tool_name``'s call
    ``call_id`` that counted ``original_tokens`` and is fed as ``fed_tokens``; None when no
    clearing ever replaces it: its tool is excluded, or the placeholder would not be smaller."""
    if tool_name in settings.exclude_tools:
        return None
    text = placeholder(tool_name, call_id, original_tokens)
    tokens = counter.count(text)
    return (text, tokens) if tokens < fed_tokens else None


def will_be_cleared(settings: ClearingSettings, counter_name: str, counters: Counters) -> \
        Callable[[str, str, str, int, int], bool]:
    """Whether a clearing will some day replace a result answering a call of ``tool_name``, fed as
    ``text`` (``fed_tokens``), of ``original_tokens`` (arguments: tool_name, call_id, text,
    original_tokens, fed_tokens): what a rendering's breakpoint must not be placed behind. Never,
    with clearing off or a host-defined counter (a placeholder's count would be a guess)."""
    if not settings.enabled or counter_name == "host-defined":
        return _never
    counter = counters.get(counter_name)

    def will(tool_name: str, call_id: str, text: str, original_tokens: int, fed_tokens: int) -> bool:
        return may_be_cleared("tool", text) and \
            replacement(settings, counter, tool_name, call_id, original_tokens, fed_tokens) is not None
    return will


def _never(tool_name: str, call_id: str, text: str, original_tokens: int, fed_tokens: int) -> bool:
    return False


def before_plan(deps: Deps, settings: ClearingSettings, writer: LogWriter, iteration: int, budget: int,
                run_budget: int, last_fed: WindowRecord | None, decide: bool = True, cold: bool = False) -> bool:
    """At an assembly of ``iteration``, before its window is chosen (``writer`` flushed): keep the
    clips of the last window fed (within half of ``run_budget``, the run's: a call's tighter
    ``max_transcript_tokens`` changes its own window alone, not what later turns are fed), then
    clear tool results if the transcript passed the trigger (of ``budget``, the call's)
    (unless not ``decide``: a replay fork clears where its source did, ``clear_as_recorded``).
    ``cold``: the provider's cache is, at this first assembly of the iteration: the trigger is
    then the run's trim_to_fraction if lower, and any step is big enough (nothing cached is
    lost). ``last_fed``: the window persisted for the run's last assembly when that is
    ``iteration`` or the one before it (None: none, or an older iteration is assembled). True
    when the log changed (the caller flushes the writer)."""
    run = writer.run
    if run.settings.token_counter == "host-defined":
        return False  # host-defined text cannot be counted: a placeholder's count would be a guess
    changed = _keep_clips(deps, writer, iteration, run_budget, last_fed)
    if changed:
        writer.flush()  # the clearing reads the counts as they now stand
    # Only at the log's newest iteration: an older one (assembled again, or before events the
    # host appended already) is chosen from the log as it stands, and a clearing's entry must
    # not come after events of a later iteration than its own.
    if decide and settings.enabled and iteration >= max(run.last_assembled, run.last_iteration):
        changed = _clear(deps, settings, writer, iteration, budget, cold and iteration > run.last_assembled,
                         last_fed) or changed
    return changed


def _keep_clips(deps: Deps, writer: LogWriter, iteration: int, budget: int, last: WindowRecord | None) -> bool:
    """The events the last window fed clipped are fed clipped from now on, at most half the
    run's ``budget`` each: clipped in its own turn to all the room the turn left, a result could never
    sit beside the next turn, and the window would drop it and all before it (measured at an
    800-token budget: 5 entries and 157 tokens on the next turn, the same as fed whole)."""
    txn, db, key, run = writer.txn, writer.db, writer.key, writer.run
    if iteration <= run.last_assembled or not run.last_assembled:
        return False
    clipped = last.clipped if last is not None else ()
    if not clipped:
        return False
    # No log entry: the clips are in the window record, which a fork carries or makes again.
    counter = deps.counters.get(run.settings.token_counter)
    for seq, text, tokens in clipped:
        original = read_event(txn, db, key, seq)
        if tokens > budget // 2:
            opening, inside, closing, quote = clip_frame(original)
            shorter = counter.clip(inside, budget // 2, opening, closing, quote)
            if shorter:  # else the marker and the block's lines alone pass half the budget: keep the turn's clip
                text, tokens = shorter, counter.count(shorter)
        _put_form(writer, original, "clipped", text, tokens, iteration)
    return True


def _clear(deps: Deps, settings: ClearingSettings, writer: LogWriter, iteration: int, budget: int,
           cold: bool, last: WindowRecord | None) -> bool:
    txn, db, key, run = writer.txn, writer.db, writer.key, writer.run
    end = prefix_end(txn, db, key, run, iteration)
    top = in_force(txn, db, key, run, iteration) if run.summaries else None
    start = top.to_seq if top else 0
    if last is not None:
        # What would be fed if the window's start stayed where it was last fed: only results
        # there cost anything, so only they are worth clearing.
        start = max(start, last.start)
    # Every turn asks, and most turns stop at the trigger: the count records' columns as arrays
    # (tokens, group_first), so that the sum and the scans run in C.
    counts = read_counts(txn, db, key, start, end)
    columns = count_columns(counts)
    weights, groups = columns[0::3], columns[2::3]
    fed = sum(weights)
    if fastcore.NOT_A_UNIT in groups:  # the sidecar's own entries weigh nothing (in C: one per summary)
        fed -= sum(compress(weights, map(fastcore.NOT_A_UNIT.__eq__, groups)))
    trigger = (min(settings.trigger_fraction, run.settings.trim_to_fraction) if cold else settings.trigger_fraction) \
        * budget
    if fed <= trigger:
        return False
    # Tool results answering a call before them: their group starts at the call.
    answered = [seq for seq, group_first in enumerate(groups, start)
                if group_first < seq and group_first != fastcore.NOT_A_UNIT]
    # Never a result of the recent turns (none when they reach back past the window's start);
    # the newest keep_recent results of all are never cleared either, theirs counted first.
    recent = fastcore.recent_start(counts, start, iteration, kept_turns(run.settings),
                                   int(run.settings.trim_to_fraction * budget), top.to_seq if top else 0)
    if recent is None:
        return False
    keep_older = settings.keep_recent
    for seq in reversed(answered):
        if seq < recent or not keep_older:
            break
        keep_older -= read_event(txn, db, key, seq).role == "tool"
    answered = [seq for seq in answered if seq < recent]
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
        record = read_event(txn, db, key, seq)
        if record.role == "tool":
            results.append(record)
    clearable = results[:max(len(results) - keep_older, 0)]
    if not clearable:
        return False
    counter = deps.counters.get(run.settings.token_counter)
    step = settings.clear_at_least_tokens or budget // 2
    target = max(step, fed - int(trigger))
    freed, changes = 0, []
    for event in clearable:
        if event is None or event.iteration >= iteration:
            continue
        call = read_event(txn, db, key, groups[event.seq - start])
        weighs = weights[event.seq - start]  # as fed now: a clipped result at its clipped size
        replaced = replacement(settings, counter, call.tool_name, event.call_id, event.tokens, weighs)
        if replaced is None:
            continue
        text, tokens = replaced
        freed += weighs - tokens
        changes.append((event, text, tokens))
        if freed >= target:
            break
    # A smaller step only instead of a move of the window's start, which would break the cache at
    # its first entry, before any result (a summarising run moves its start by summaries), and
    # only when it leaves as much room as the move would: the recent turns' results are never
    # cleared, so a small step would be followed by another a few turns later, each re-billing
    # most of the window.
    averts_a_move = not run.settings.summarization and fed - freed <= budget < fed and \
        freed >= budget - int(run.settings.trim_to_fraction * budget)
    if not changes or (freed < step and not averts_a_move and not cold):
        return False
    _record(writer, CLEARED_TYPE, "cleared", iteration, changes)
    return True


def clear_as_recorded(deps: Deps, writer: LogWriter, iteration: int, event_ids: list[str]) -> None:
    """Clear the tool results ``event_ids`` from ``iteration`` on as a clearing recorded with
    them did (a replay fork's source's, on the same log): the same placeholders and log entry,
    whatever this sidecar's ``[context.clearing]`` says. ``writer`` flushed."""
    txn, db, key = writer.txn, writer.db, writer.key
    counter = deps.counters.get(writer.run.settings.token_counter)
    changes = []
    for event_id in event_ids:
        event = event_by_id(txn, db, key, event_id)
        _, _, call_seq = count_at(read_counts(txn, db, key, event.seq, event.seq + 1), event.seq,
                                  event.seq)  # its group: the call
        text = placeholder(read_event(txn, db, key, call_seq).tool_name, event.call_id, event.tokens)
        changes.append((event, text, counter.count(text)))
    _record(writer, CLEARED_TYPE, "cleared", iteration, changes)


def _put_form(writer: LogWriter, event: StoredEvent, kind: str, text: str, tokens: int, iteration: int) -> None:
    """``event`` is fed as ``text`` (``tokens``) from the assembly of ``iteration`` on, which
    happens with the log ending at the run's next seq (the form's version)."""
    form = FedForm(event.seq, writer.run.next_seq, kind, text, tokens, event.tokens)
    put_form(writer.txn, writer.db, writer.key, form, iteration)
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
        weighs = tokens_at(counts, changes[0][0].seq, event.seq)
        before, after = before + weighs, after + tokens
        _put_form(writer, event, kind, text, tokens, iteration)
    ids = [event.event_id for event, _, _ in changes]
    payload = json.dumps({"iteration": iteration, "eventIds": ids, "tokenCounter": run.settings.token_counter,
                          "tokensBefore": before, "tokensAfter": after}, separators=(",", ":"))
    entry = StoredEvent(made_at, f"{SIDECAR_ID_PREFIX}{entry_type}:{run.log_entries}", iteration, "system",
                        entry_type, payload, "", 0)
    append_compaction(writer, entry, kind, tuple(ids), "", before, after, "built-in")
    run.cleared_at = iteration  # the window of this turn reaches back to the recent turns (window.py)
    metrics.tool_results_cleared(len(changes), before - after)


def fork_forms(txn: Txn, db: dict, source_key: bytes, fork_key: bytes, from_seq: int, last_assembled: int) -> None:
    """Give a fork the forms it carries: a clearing's when its log entry is below ``from_seq``, a
    kept clip's when the assembly that kept it is among the fork's (up to ``last_assembled``;
    the fork keeps the others itself at its next assembly). The counts of events whose forms the
    fork does not carry go back to what they weighed without them."""
    later: dict[int, int] = {}  # seq -> what it weighs in the fork
    kept: dict[int, int] = {}
    for form, value in forms_below(txn, db, source_key, from_seq):
        if (form.made_at < from_seq) if form.kind == "cleared" else (made_in(value) <= last_assembled):
            copy_form(txn, db, fork_key, form, value)
            kept[form.seq] = form.tokens
        else:
            later.setdefault(form.seq, form.original_tokens)
    counts = LogChunks(txn, db, fork_key, with_ids=False)
    for seq, original in later.items():
        counts.set_tokens(seq, kept.get(seq, original))
    counts.flush()
