"""The per-turn transcript window: chosen by fastcore, persisted per iteration, read back.

The window for iteration N is chosen from the log's entries with iteration <= N (a prefix of
the log, since iterations never decrease), and from the summaries in force at N, which stand in
for every event below their floor. What was fed is persisted per iteration, so the seam
(GetTranscriptWindow) returns exactly it, and re-assembling an iteration reproduces it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

import fastcore
from sidecar.caching import Cache, Caches, CacheSpec, text_bytes
from sidecar.context_window.rendering import CLIPPED_ARGUMENTS
from sidecar.errors import TokenBudgetExceeded, TranscriptWindowExceeded
from sidecar.storage.codec import StoredEvent, decode_event
from sidecar.storage.environment import after_commit
from sidecar.storage.keys import Txn
from sidecar.telemetry.tracing import phase
from sidecar.text.counting import TokenCounter
from sidecar.text.fencing import split_block
from sidecar.transcript.log import log_entries_before, prefix_end
from sidecar.transcript.runs import Deps, Run, RunSettings, require_run
from sidecar.transcript.schema import (
    Compaction,
    CountTail,
    WindowRecord,
    count_at,
    counts_from,
    current_forms,
    forms_listed,
    leave_out,
    log_entries_in,
    pack_count,
    read_counts,
    read_ids,
    read_records,
    unpacked,
)
from sidecar.transcript.summaries import (
    NO_SUMMARY,
    Candidates,
    InForce,
    Summary,
    feedable_tokens,
    in_force,
    kept_turns,
    load_summary,
    newest_in_force,
    read_artifacts,
)
from sidecar.validation import MAX_COUNT


@dataclass(frozen=True, slots=True)
class Clip:
    """An event fed in another form than its content: an oversized event clipped so the window
    fits its budget (in its own turn and, kept, on later ones), or a cleared tool result."""

    text: str  # head + elision marker + tail, or a cleared result's placeholder
    tokens: int  # count of ``text``
    original_tokens: int  # the event content's own count
    kind: str = "clipped"  # "clipped" or "cleared" (FedForm.kind): what a reader is told the entry was


@dataclass(frozen=True, slots=True)
class WindowEntry:
    event: StoredEvent  # a host event, or a summary (type context.summary, its ref as event_id)
    text: str  # what was fed: the content, or its clipped form
    tokens: int  # count of ``text`` in the run's counter
    clipped_from_tokens: int  # the content's own count when clipped, else 0
    fed_as: str = ""  # "" (the content itself), "clipped" or "cleared"


@dataclass(frozen=True, slots=True)
class SummarizedRange:
    summary_ref: str
    replaced_turns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TranscriptWindow:
    """What one turn is fed. ``records`` are its entries as stored, oldest first: the summaries
    in the window, then the events; ``clips`` (by position) replace the text of entries fed
    clipped. The per-turn answer is built from these bytes without decoding them;
    :meth:`entries` decodes them for everyone else."""

    run_id: str
    iteration: int
    token_counter: str
    token_budget: int
    token_count: int
    omitted_events: int  # host events left out: neither fed verbatim nor stood in for by a summary in the window
    event_ids: list[str]
    records: list[bytes]
    clips: dict[int, Clip] = field(default_factory=dict)
    compaction: Compaction = Compaction(False)
    summarized_ranges: tuple[SummarizedRange, ...] = ()
    summaries_fed: int = 0  # how many of ``records`` (the first ones) are summaries
    context: dict | None = None  # the rest of the accounting, as persisted (None: before sections)
    window_tokens: int = 0  # everything fed: the transcript's tokens and the sections' and tools'
    summarized_events: int = 0  # host events that the summaries in the window stand in for

    def entries(self) -> list[WindowEntry]:
        entries = []
        for position, record in enumerate(self.records):
            event = decode_event(record)
            clip = self.clips.get(position)
            if clip is None:
                entries.append(WindowEntry(event, event.content, event.tokens, 0))
            else:
                entries.append(WindowEntry(event, clip.text, clip.tokens, clip.original_tokens, clip.kind))
        return entries


@dataclass(frozen=True, slots=True)
class Plan:
    """The window fastcore chose, before any clipping; also what identifies a persisted window."""

    token_counter: str
    budget: int
    start: int
    end: int
    mandatory: int
    cap: int  # -1: nothing clipped
    tokens: int  # the window's count when nothing is clipped
    top: int  # the summary in force (its index), -1 for none
    prefix_in: int  # how many of the summaries in force are in the window

    def identity(self) -> tuple[str, int, int, int, int, int, int]:
        return self.token_counter, self.budget, self.start, self.end, self.cap, self.top, self.prefix_in

    def same_as(self, record: WindowRecord) -> bool:
        return record.plan == self.identity()


def effective_budget(deps: Deps, run: Run, max_transcript_tokens: int | None) -> int:
    # The configured budget is what the capability document advertises; no run exceeds it.
    return min(run.settings.transcript_token_budget, deps.defaults.transcript_token_budget,
               max_transcript_tokens or MAX_COUNT)


def plan(deps: Deps, txn: Txn, key: bytes, run: Run, iteration: int, max_transcript_tokens: int | None, cold: bool,
         previous: WindowRecord | None) -> tuple[Plan, Summary | None]:
    """Choose the window for ``iteration``: read the tail's count chunks (doubling the history
    read while the answer reaches further back, never below the summarised floor). ``cold``: the
    provider's cache is (a cache-stable window moves its start now if the budget would soon);
    ``previous``: the window persisted before ``iteration`` (schema.previous_window)."""
    with phase("select"):
        return _plan(deps, txn, key, run, iteration, max_transcript_tokens, cold, previous)


def _plan(deps: Deps, txn: Txn, key: bytes, run: Run, iteration: int,
          max_transcript_tokens: int | None, cold: bool, previous: WindowRecord | None) -> tuple[Plan, Summary | None]:
    settings = run.settings
    budget = effective_budget(deps, run, max_transcript_tokens)
    end = prefix_end(txn, deps.db, key, run, iteration)
    top = in_force(txn, deps.db, key, run, iteration) if run.summaries else None
    floor = top.to_seq if top else 0
    prefix = feedable_tokens(txn, deps.db, key, top, budget, settings.transcript_window, run.incarnation)
    tail = CountTail(txn, deps.db, key, floor, end)
    stable = settings.window_policy == "cache_stable"
    if stable:
        previous_start, previous_prefix_in, previous_top = previous_window_start(previous)
        if top is not None and top.index != previous_top and previous_start <= floor:
            previous_start = -1  # a summary recorded since, of all before the window: it is fed
        if floor < previous_start < end:
            # The window reaches back to the previous start at least: read from there at once.
            tail.reach_back_to(previous_start - 1)
    while True:
        records, base = tail.records, tail.base
        if stable:
            chosen = fastcore.select_stable_window(records, base, iteration, budget, settings.transcript_window, floor,
                                                   prefix, previous_start, previous_prefix_in,
                                                   settings.trim_to_fraction, kept_turns(settings))
            if cold and chosen is not None and not (previous_start == -1 and chosen[4] > 0 and top is not None
                                                    and top.index != previous_top):
                # (a summary recorded since is fed where it lands: it is the step a cold turn takes)
                chosen = _moved_while_cold(chosen, records, base, iteration, budget, settings, floor, prefix)
            if chosen is not None and run.cleared_at == iteration:
                chosen = _back_to_recent_turns(chosen, records, base, iteration, budget, settings, floor)
        else:
            chosen = fastcore.select_window(records, base, iteration, budget, settings.transcript_window, floor,
                                            prefix)
        if chosen is not None:
            break
        tail.read_further()
    start, mandatory, tokens, cap, prefix_in = chosen
    if settings.transcript_window:
        # fastcore never extends the window past the bound, but the active turn and the calls its
        # results answer are always in: when they alone exceed it, the turn cannot be fed.
        fed = host_events(txn, deps.db, key, run, start, end) + prefix_in
        if fed > settings.transcript_window:
            raise TranscriptWindowExceeded(
                f"iteration {iteration} needs {fed} events in its window (the active turn, with the tool calls "
                f"its results answer and what lies between), but the run's transcript_window is "
                f"{settings.transcript_window}; send the turn in fewer events or open a run with a larger "
                f"transcript_window", metadata={"events_needed": str(fed),
                                                "transcript_window": str(settings.transcript_window)})
    return Plan(settings.token_counter, budget, start, end, mandatory, cap, tokens, top.index if top else -1,
                prefix_in), top


def _moved_while_cold(chosen: tuple, records: bytes, base: int, iteration: int, budget: int, settings: RunSettings,
                      floor: int, prefix: Sequence[int]) -> tuple | None:
    """A cache-stable window on a cold turn: a start past which the window holds more than
    trim_to_fraction of the budget (or of transcript_window) moves now, where the budget will
    move it (the oldest start within those bounds, never past the recent turns), since this request re-bills its history
    anyway; None when the records do not reach back far enough (the caller reads more)."""
    start, mandatory, tokens, cap, prefix_in = chosen
    trimmed_budget = max(1, int(settings.trim_to_fraction * budget))
    trimmed_events = max(1, int(settings.trim_to_fraction * settings.transcript_window)) \
        if settings.transcript_window else 0
    if cap >= 0 or tokens <= trimmed_budget:
        return chosen
    moved = fastcore.select_window(records, base, iteration, trimmed_budget, trimmed_events, floor, prefix)
    if moved is None:
        return None
    # The active turn alone over the tighter bounds would be clipped there: the start stays.
    if moved[3] >= 0 or moved[0] < start:
        return chosen
    # Never past the recent turns: as far as their start, when that moves it at all.
    recent = fastcore.recent_start(records, base, iteration, kept_turns(settings), trimmed_budget, floor)
    if recent is None:
        return None
    if moved[0] <= recent:
        return moved
    if recent <= start:
        return chosen
    return _from_start(records, base, recent, mandatory)


def _back_to_recent_turns(chosen: tuple, records: bytes, base: int, iteration: int, budget: int,
                          settings: RunSettings, floor: int) -> tuple | None:
    """A cache-stable window at the turn that cleared tool results: when the recent turns, as the
    clearing left them (cleared results at their placeholders' counts), reach further back than
    the kept start, the window starts where they do. The clearing re-bills the request from its
    first cleared result anyway, and that result lies near the start (it is older than the recent
    turns): kept, the start left the window a fifth full at 8k after a 6,000-token result was
    cleared, refilling at a turn's tokens a turn. None when the records do not reach back far
    enough (the caller reads more)."""
    start, mandatory, _, cap, _ = chosen
    if cap >= 0:
        return chosen  # the active turn alone is over the budget
    recent = fastcore.recent_start(records, base, iteration, kept_turns(settings),
                                   int(settings.trim_to_fraction * budget), floor)
    if recent is None:
        return None
    if recent >= start:
        return chosen
    moved = _from_start(records, base, recent, mandatory)
    # The last keep_last_turns turns may pass the bounds on their own: then the kept start stays.
    units = sum(group != fastcore.NOT_A_UNIT for _, _, group in unpacked(counts_from(records, base, moved[0])))
    if moved[2] > budget or (settings.transcript_window and units > settings.transcript_window):
        return chosen
    return moved


def _from_start(records: bytes, base: int, start: int, mandatory: int) -> tuple[int, int, int, int, int]:
    """The window of every event from ``start`` (at its first transcript event) to the log's end."""
    first = start
    while first < mandatory and count_at(records, base, first)[2] == fastcore.NOT_A_UNIT:
        first += 1  # the window starts at a transcript event
    tokens = sum(count for count, _, _ in unpacked(counts_from(records, base, first)))
    return first, mandatory, tokens, -1, 0


def summary_room(run: Run, budget: int) -> int:
    """What a summary asked for and the next turn's events may take together, for the summary to
    be fed in the next window: what trim_to_fraction of the budget leaves."""
    return budget - int(run.settings.trim_to_fraction * budget)


def summary_room_entries(run: Run) -> int:
    """The entries a summary asked for and the next turn's events may take together, under a
    transcript_window: what trim_to_fraction of it leaves (0: no bound)."""
    window = run.settings.transcript_window
    return window - int(run.settings.trim_to_fraction * window) if window else 0


def fed_next(deps: Deps, txn: Txn, key: bytes, run: Run, iteration: int, chosen: Plan, top: Summary | None,
             found: Candidates) -> bool:
    """Whether a summary of ``found`` recorded for the iteration after ``iteration`` would be fed in
    its window, when the summary and that iteration's events take :func:`summary_room` tokens and
    :func:`summary_room_entries` entries together: that window chosen as :func:`plan` would, over
    the log as it stands, one more turn and the summary in force (``chosen`` the window of
    ``iteration``, where a cache-stable one starts from). The summary weighs the whole token room;
    the next turn is as many events of no tokens as the entry room leaves beside the summary."""
    settings = run.settings
    budget = chosen.budget
    next_turn = max(1, summary_room_entries(run) - 1)
    records = read_counts(txn, deps.db, key, found.cut, chosen.end) + b"".join(
        pack_count(0, iteration + 1, chosen.end + k) for k in range(next_turn))
    stack = feedable_tokens(txn, deps.db, key, top, budget, settings.transcript_window, run.incarnation)
    if top is not None and found.ids[:1] == (top.ref,):
        stack = stack[:-1]  # a recursive summary replaces the one in force
    prefix = (*stack, summary_room(run, budget))
    if settings.window_policy == "cache_stable":
        # As plan would: a window that started at or before the summary's end has it fed first.
        start = chosen.start if chosen.start > found.cut else -1
        next_window = fastcore.select_stable_window(records, found.cut, iteration + 1, budget,
                                                    settings.transcript_window, found.cut, prefix, start,
                                                    chosen.prefix_in, settings.trim_to_fraction, kept_turns(settings))
    else:
        next_window = fastcore.select_window(records, found.cut, iteration + 1, budget, settings.transcript_window,
                                             found.cut, prefix)
    return next_window is not None and next_window[3] < 0 and next_window[4] > 0


def previous_window_start(record: WindowRecord | None) -> tuple[int, int, int]:
    """Where the run's previous window (``record``) started: its first event's seq, how many
    summaries came before it, and the summary in force then (-1: none); (-1, 0, -1) when there is
    none. A cache-stable window keeps that start while everything fits."""
    if record is None:
        return -1, 0, -1
    return record.start, len(record.summaries), record.plan[5]


def host_events(txn: Txn, db: dict, key: bytes, run: Run, start: int, end: int) -> int:
    """How many of the host's events lie in ``[start, end)`` (the sidecar's own entries left out)."""
    return (end - start) - (log_entries_before(txn, db, key, run, end) - log_entries_before(txn, db, key, run, start))


def summarized_events(txn: Txn, db: dict, key: bytes, run: Run, top: Summary | None,
                      fed: list[InForce]) -> int:
    """How many host events ``fed``, the newest summaries of ``top``'s stack (oldest first), stand in for.

    The summaries in force cover the log below ``top.to_seq`` end to end, oldest first (each
    replaces the oldest events not yet summarised, and a stacking one the summaries it folds in),
    so the newest of them cover from the floor of the one before them."""
    if top is None or not fed:
        return 0
    under = fed[0].below  # the summary before them
    covered_from = load_summary(txn, db, key, under).to_seq if under != NO_SUMMARY else 0
    return host_events(txn, db, key, run, covered_from, top.to_seq)


def _over_budget(budget: int) -> TokenBudgetExceeded:
    return TokenBudgetExceeded(
        f"the active turn (with the tool calls its results answer) does not fit the token budget of {budget} "
        f"even with every event above a common cap clipped to its smallest marked form (the elision marker, "
        f"and an untrusted block's opening line, preamble and closing line); send the turn in fewer or "
        f"smaller events or give the run a larger budget", metadata={"token_budget": str(budget)})


def fair_cap(sizes: list[int], floors: list[int], budget: int) -> int | None:
    """The largest common cap C with sum(min(t, max(C, m))) <= budget over the events' counts t
    and marked minima m: every event is fed whole up to C, one above it is clipped to C but never
    below its marked minimum (an event no larger than its minimum stays whole). None when even
    every event at its minimum is over the budget: then no fair clipping with the marker exists."""
    fixed = sum(t for t, m in zip(sizes, floors) if t <= m)
    clippable = [(t, m) for t, m in zip(sizes, floors) if t > m]

    def cost(cap: int) -> int:
        return fixed + sum(t if t < cap else (cap if cap > m else m) for t, m in clippable)

    if cost(0) > budget:
        return None
    low, high = 0, max((t for t, _ in clippable), default=0)
    while low < high:
        middle = (low + high + 1) // 2
        if cost(middle) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def clip_frame(event: StoredEvent) -> tuple[str, str, str, bool]:
    """How ``event`` is clipped: (opening, inside, closing, quote) for ``TokenCounter.clip``.
    Only ``inside`` is elided: an untrusted block keeps its opening line, preamble and closing
    line; a tool call's arguments become one string in ``CLIPPED_ARGUMENTS``."""
    if event.tool_name:
        return CLIPPED_ARGUMENTS[0], event.content, CLIPPED_ARGUMENTS[1], True
    block = split_block(event.content)
    return (*block, False) if block is not None else ("", event.content, "", False)


def clip_mandatory(counter: TokenCounter, events: list[StoredEvent], budget: int) -> dict[int, str]:
    """The clipped texts (by seq) that make the active turn fit ``budget``: water-filling to a
    common cap whose clips all carry the marker, each in its frame (``clip_frame``). Raises
    token_budget_exceeded when no such cap exists."""
    frames = [clip_frame(event) for event in events]
    sizes = [event.tokens for event in events]
    # The marker counts what it elides: all of ``inside`` (a block's content, not its lines).
    floors = [counter.marked_minimum(event.tokens if inside == event.content else counter.count(inside),
                                     opening, closing, quote) if event.tokens else 0
              for event, (opening, inside, closing, quote) in zip(events, frames)]
    cap = fair_cap(sizes, floors, budget)
    if cap is None:
        raise _over_budget(budget)
    clipped = {}
    for event, (opening, inside, closing, quote), floor in zip(events, frames, floors):
        target = max(cap, floor)
        if event.tokens > target:
            text = counter.clip(inside, target, opening, closing, quote)
            if not text:  # no marked form fits (a guard: the floor is the smallest one's count)
                raise _over_budget(budget)
            clipped[event.seq] = text
    return clipped


def window_record(deps: Deps, txn: Txn, key: bytes, run: Run, chosen: Plan, top: Summary | None,
                  due: Compaction | None, context: dict) -> WindowRecord:
    """The record of what ``chosen`` feeds (clipping what must be), with the compaction decision
    and the rest of the window's accounting (``context``), for the caller to persist once it has
    added the request's cache state to ``context``."""
    db = deps.db
    fed = newest_in_force(txn, db, key, top, chosen.prefix_in, run.incarnation)  # one walk, for both
    summarized = summarized_events(txn, db, key, run, top, fed)
    # The events fed in another form (cleared, clipped on an earlier turn), as they are now: the
    # record names the forms, so the window reads back as fed whatever later turns change.
    forms = current_forms(txn, db, key, chosen.start, chosen.end)
    clipped: list[tuple[int, str, int]] = []
    tokens = chosen.tokens
    if chosen.cap >= 0:
        # fastcore's cap knows counts only; the cap the events are clipped to also gives every
        # clip room for its marker (clip_mandatory). The counts of the clipped texts, not the
        # cap, are what the window adds up.
        counter = deps.counters.get(chosen.token_counter)
        events = [decode_event(raw) for raw in read_records(txn, db, key, chosen.start, chosen.end)]
        events = [forms[event.seq].as_event(event) if event.seq in forms else event for event in events]
        clips = clip_mandatory(counter, [e for e in events if e.seq >= chosen.mandatory], chosen.budget)
        tokens = 0
        for event in events:
            text = clips.get(event.seq)
            if text is not None:
                clipped_tokens = counter.count(text)
                clipped.append((event.seq, text, clipped_tokens))
                tokens += clipped_tokens
            else:
                tokens += event.tokens
    record = WindowRecord(
        chosen.identity(), chosen.start, chosen.end, chosen.token_counter, chosen.budget, tokens,
        log_entries_in(txn, db, key, chosen.start, chosen.end), tuple(clipped),
        tuple((summary.index, summary.ref) for summary in fed),
        host_events(txn, db, key, run, 0, chosen.start) - summarized, summarized,
        [[form.seq, form.made_at] for form in forms.values()] if forms else None, due, context,
        # Everything fed: the transcript as clipped, and what the sections and tools add to it.
        tokens + context["fixed_tokens"])
    return record


# The entries a run's window was last read back with (records and ids, sidecar entries included),
# so that the next read of a window starting at or after that start (and within them) reads only
# what lies past them. A cache-stable window keeps its start for many turns and grows by a turn's
# events; a window whose summaries move its floor on starts a few entries later. An entry never
# changes under its run's incarnation once committed, so only what committed is kept
# (``after_commit``).
READ_BACK = CacheSpec(
    "read_back", key="run key (the run's incarnation kept with the entries)",
    valid="an entry at a seq never changes under its run's incarnation once committed (a run deleted and "
    "made again is another incarnation, checked on every read)", max_bytes=16 << 20)


class ReadBack:
    """:data:`READ_BACK`: per run, the last window's entries; the runs read longest ago go first."""

    def __init__(self, caches: Caches) -> None:
        # run key -> (incarnation, start, records, ids)
        self._runs: Cache[bytes, tuple[str, int, list[bytes], list[str]]] = caches.of(READ_BACK)

    def read(self, txn: Txn, db: dict, key: bytes, incarnation: str, start: int,
             end: int) -> tuple[list[bytes], list[str]]:
        """The records and ids of entries ``[start, end)``."""
        last = self._runs.get(key)
        if last is None or last[0] != incarnation or not last[1] <= start < last[1] + len(last[2]):
            records, ids = read_records(txn, db, key, start, end), read_ids(txn, db, key, start, end)
        else:
            _, held_from, records, ids = last
            if start > held_from:  # the entries before the new start are not held any longer
                dropped = start - held_from
                records, ids = records[dropped:], ids[dropped:]
            held = start + len(records)
            if end <= held:
                return records[:end - start], ids[:end - start]
            records, ids = records + read_records(txn, db, key, held, end), ids + read_ids(txn, db, key, held, end)
        # Kept once what was read is committed: a turn refused after it read its window (a summary's
        # text deleted) aborts the events it appended, and the next turn appends others at their seqs.
        after_commit(self._runs.put, key, (incarnation, start, records, ids), text_bytes(*records, *ids))
        return records, ids


def from_record(deps: Deps, txn: Txn, key: bytes, run_id: str, iteration: int, record: WindowRecord,
                with_ranges: bool = False, reads: tuple[ReadBack, str] | None = None) -> TranscriptWindow:
    """The window persisted for ``iteration``, read back as it was fed. ``reads``: the entries
    last read back for the run, and its incarnation."""
    with phase("read"):
        return _from_record(deps, txn, key, run_id, iteration, record, with_ranges, reads)


def _from_record(deps: Deps, txn: Txn, key: bytes, run_id: str, iteration: int, record: WindowRecord,
                 with_ranges: bool, reads: tuple[ReadBack, str] | None) -> TranscriptWindow:
    db = deps.db
    start, end = record.start, record.end
    if reads is None:
        records, ids = read_records(txn, db, key, start, end), read_ids(txn, db, key, start, end)
    else:
        records, ids = reads[0].read(txn, db, key, reads[1], start, end)
    # The sidecar's own entries in the window (one a summary or clearing recorded since its
    # start) are left out, and an event's position is its seq less the entries before it: no
    # pass in Python per entry. (A turn with 50 summaries in force has some 200 of them.)
    skip = sorted(record.skip)
    records, ids = leave_out(skip, start, records, ids)
    refs = [ref for _, ref in record.summaries]
    clips = {}
    if record.clipped or record.fed:
        def position_of(seq: int) -> int:
            return seq - start - bisect_left(skip, seq)

        for form in forms_listed(txn, db, key, record.fed or []):
            clips[len(refs) + position_of(form.seq)] = Clip(form.text, form.tokens, form.original_tokens, form.kind)
        for seq, text, tokens in record.clipped:
            position = position_of(seq)
            clips[len(refs) + position] = Clip(text, tokens, decode_event(records[position]).tokens)
    ranges: tuple[SummarizedRange, ...] = ()
    if with_ranges:
        ranges = tuple(SummarizedRange(s.ref, s.replaced_turns)
                       for s in (load_summary(txn, db, key, index) for index, _ in record.summaries))
    summarized, omitted = record.summarized, record.omitted
    if summarized is None:
        # Persisted before the two counts were apart: "omitted" then held every host event
        # before the window, the summarised ones too.
        top = load_summary(txn, db, key, record.summaries[-1][0]) if record.summaries else None
        run = require_run(txn, db, key, run_id)
        summarized = summarized_events(txn, db, key, run, top,
                                       newest_in_force(txn, db, key, top, len(record.summaries), run.incarnation))
        omitted -= summarized
    return TranscriptWindow(
        run_id, iteration, record.counter, record.budget, record.tokens, omitted,
        refs + ids, read_artifacts(txn, db, key, refs) + records, clips, record.compaction or Compaction(False),
        ranges, len(refs), record.context, record.fed_tokens, summarized)
