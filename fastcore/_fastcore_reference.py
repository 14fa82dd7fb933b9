"""The readable pure-Python twin of ``_fastcore``: every function it exports.

These are the specification: tests run the compiled functions and these side by side on fixed
and random inputs and require identical answers. Nothing in the sidecar imports this module to
serve requests; the compiled module is what runs.

Packed count records (declared by ``sidecar/transcript/schema.py``): one per log entry, ``RECORD_SIZE``
bytes, three little-endian uint32 fields:

    tokens       the event's token count in its run's counter
    iteration    the turn the event belongs to (non-decreasing along a run)
    group_first  the seq of the first event sharing this event's call_id, or the event's own
                 seq when it has no call_id (a tool call and its results form one group);
                 NOT_A_UNIT for a log entry that is not transcript
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

RECORD_SIZE = 12
NOT_A_UNIT = 0xFFFFFFFF  # group_first of a log entry that is not transcript (context.summarized)
_RECORD = struct.Struct("<III")


def count_code_points(data: bytes) -> int:
    """Unicode code points in ``data``, which must be valid UTF-8."""
    return len(bytes(data).decode("utf-8"))


def _unpack(records: bytes) -> tuple[list[int], list[int], list[int]]:
    tokens: list[int] = []
    iterations: list[int] = []
    group_first: list[int] = []
    for t, it, g in _RECORD.iter_unpack(bytes(records)):
        tokens.append(t)
        iterations.append(it)
        group_first.append(g)
    return tokens, iterations, group_first


def _clip_cap(tokens: list[int], budget: int) -> int:
    """The largest cap C with sum(min(t, C) for t in tokens) <= budget (water-filling)."""
    low, high = 0, max(tokens, default=0)
    while low < high:
        mid = (low + high + 1) // 2
        if sum(min(t, mid) for t in tokens) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def select_window(
    records: bytes, base_seq: int, active_iteration: int, budget: int, max_events: int,
    floor_seq: int = 0, prefix_tokens: Sequence[int] = (),
) -> tuple[int, int, int, int, int] | None:
    """Choose the transcript window over the events ``[base_seq, base_seq + n)``.

    ``records`` holds the packed records of those events, which must be the tail of the log as
    of ``active_iteration`` (no record has a greater iteration). Records whose group_first is
    ``NOT_A_UNIT`` are log entries that are not transcript (a ``context.summarized`` event):
    they weigh nothing and are never counted. Events below ``floor_seq`` are replaced by
    summaries; ``prefix_tokens`` are those summaries' counts, oldest first: the oldest units of
    the transcript, before ``floor_seq``. ``max_events`` bounds the units (0: no bound) that
    the window is extended by; the mandatory events are in even beyond it (the caller refuses
    such a window: ``transcript_window_exceeded``).

    Returns ``(start_seq, mandatory_start, tokens, cap, prefix_in)``:

    - the window is the units of ``[start_seq, end)`` plus the newest ``prefix_in`` summaries
      (only when every event from ``floor_seq`` on is in): a contiguous recent tail of the
      transcript; ``start_seq`` is a unit's seq, or ``mandatory_start``;
    - ``[mandatory_start, end)`` is the active turn plus every event grouped with it by
      call_id (and, transitively, whatever lies between): always in;
    - ``cap`` is -1 when everything fits, else the per-event token cap that the mandatory
      events must be clipped to (events above it are clipped to it) so the window fits
      ``budget``; ``tokens`` is then the sum of the capped counts. It knows counts only: the
      caller clips to a cap that also leaves every clip room for its elision marker
      (``sidecar.window.fair_cap``), or refuses;
    - a cut never separates a group: it moves to the newer side (the group goes out); a group
      reaching below ``floor_seq`` counts as starting there (its older part is summarised).

    Returns None when the answer depends on events older than ``base_seq`` (the caller then
    supplies more history); never when ``base_seq <= floor_seq``.
    """
    tokens, iterations, group_first = _unpack(records)
    n = len(tokens)
    end = base_seq + n
    floor = max(floor_seq - base_seq, 0)  # relative
    is_unit = [g != NOT_A_UNIT for g in group_first]
    group_first = [max(g, floor_seq) if unit else base_seq + j for j, (g, unit) in enumerate(zip(group_first, is_unit))]

    # The active turn: the trailing events whose iteration is the active one.
    active_start = n
    while active_start > floor and iterations[active_start - 1] >= active_iteration:
        active_start -= 1
    if active_start == 0 and base_seq > floor_seq and n > 0:
        return None

    # A cut at j (relative) keeps every group whole when no event at or after j has a group
    # starting before j. The mandatory start is the largest such j at or before the active turn.
    suffix_min = [0] * (n + 1)
    suffix_min[n] = end
    for j in range(n - 1, -1, -1):
        suffix_min[j] = min(suffix_min[j + 1], group_first[j])

    def whole(j: int) -> bool:
        return suffix_min[j] >= base_seq + j

    mandatory = active_start
    while mandatory > floor and not whole(mandatory):
        mandatory -= 1
    if mandatory == 0 and base_seq > floor_seq and not whole(0):
        return None

    mandatory_tokens = sum(tokens[mandatory:])
    if mandatory_tokens > budget:
        cap = _clip_cap(tokens[mandatory:], budget)  # non-units weigh 0: they never bind the cap
        capped = sum(min(t, cap) for t in tokens[mandatory:])
        return base_seq + mandatory, base_seq + mandatory, capped, cap, 0

    # Extend older while the next event fits the budget and the unit bound.
    total = mandatory_tokens
    units = sum(is_unit[mandatory:])
    cut = mandatory
    while True:
        if cut == floor:
            if base_seq > floor_seq:
                return None
            break
        if is_unit[cut - 1]:
            if max_events > 0 and units >= max_events:
                break
            if total + tokens[cut - 1] > budget:
                break
            units += 1
        cut -= 1
        total += tokens[cut]

    # Never split a group: move the cut newer to the first position that keeps groups whole.
    while not whole(cut):
        cut += 1
    total = sum(tokens[cut:])
    units = sum(is_unit[cut:])

    # All unsummarised events are in: the summaries before them come in, newest first.
    prefix_in = 0
    if cut == floor:
        for summary_tokens in reversed(prefix_tokens):
            if (max_events > 0 and units >= max_events) or total + summary_tokens > budget:
                break
            total += summary_tokens
            units += 1
            prefix_in += 1
    # The window starts at its oldest event that is transcript: log entries at its edge stay out.
    while cut < mandatory and not is_unit[cut]:
        cut += 1
    return base_seq + cut, base_seq + mandatory, total, -1, prefix_in


def compaction_cut(records: bytes, base_seq: int, floor_seq: int, protect_from: int,
                   max_tokens: int, whole: bool = False) -> tuple[int, int, int]:
    """The oldest half of what may be summarised (``whole``: all of it, one big step that breaks
    a cached prefix once): ``(cut, tokens, unsummarised)`` such that the
    units of ``[floor_seq, cut)`` are the candidates, ``tokens`` their sum, and
    ``unsummarised`` the tokens of everything from ``floor_seq`` to the end of ``records``.

    The summarisable units are those of ``[floor_seq, protect_from)``; the target is half their
    tokens (``whole``: all of them), at most ``max_tokens``. The cut is the largest that keeps every group whole (over
    the whole log tail that ``records`` holds, which must start at or before ``floor_seq``)
    with the candidates' tokens within the target; if even the first whole group is over the
    target, it alone (so that compaction always progresses). ``(floor_seq, 0)`` when nothing
    before ``protect_from`` can be cut.
    """
    if base_seq > floor_seq:
        raise ValueError("records must start at or before floor_seq")
    tokens, _, group_first = _unpack(records)
    n = len(tokens)
    end = base_seq + n
    floor = floor_seq - base_seq
    protect = min(max(protect_from, floor_seq), end) - base_seq
    group_first = [max(g, floor_seq) if g != NOT_A_UNIT else base_seq + j for j, g in enumerate(group_first)]
    suffix_min = [0] * (n + 1)
    suffix_min[n] = end
    for j in range(n - 1, -1, -1):
        suffix_min[j] = min(suffix_min[j + 1], group_first[j])
    target = min(sum(tokens[floor:protect]) // (1 if whole else 2), max_tokens)
    best, first_whole, total = floor, None, 0
    for cut in range(floor + 1, protect + 1):
        total += tokens[cut - 1]
        if suffix_min[cut] < base_seq + cut:
            continue  # this cut would split a group
        if first_whole is None:
            first_whole = cut
        if total > target:
            break
        best = cut
    if best == floor and first_whole is not None:
        best = first_whole
    return base_seq + best, sum(tokens[floor:best]), sum(tokens[floor:])


def splits_group(records: bytes, base_seq: int, floor_seq: int, cut: int) -> int:
    """The first seq at or after ``cut`` whose event belongs to a group that starts before
    ``cut`` (and at or after ``floor_seq``): a cut there would split that group. -1 if none."""
    _, _, group_first = _unpack(records)
    for j, g in enumerate(group_first):
        seq = base_seq + j
        if seq >= cut and g != NOT_A_UNIT and max(g, floor_seq) < cut:
            return seq
    return -1


def own_entries(records: bytes, base_seq: int) -> list[int]:
    """The seqs of the log entries that are not transcript (the sidecar's own, ``NOT_A_UNIT``),
    in order; ``records`` begin at ``base_seq``."""
    _, _, group_first = _unpack(records)
    return [base_seq + j for j, g in enumerate(group_first) if g == NOT_A_UNIT]


def recent_start(records: bytes, base_seq: int, active_iteration: int, keep_turns: int, max_tokens: int,
                 floor_seq: int = 0) -> int | None:
    """Where the recent turns start: the seq of the first event of the last ``keep_turns`` turns
    (iterations above ``active_iteration - keep_turns``, the active one among them) and of the
    older whole turns that fit with them in ``max_tokens``: the oldest turn boundary at which the
    window from there holds at most ``max_tokens``, when that is older. Only boundaries that split
    no tool call from its result count (a call answered a turn later joins the two turns), and
    ``floor_seq`` is one (older events are summarised; a turn cut by it counts from it). A move
    of the window's start, a clearing and a summary never leave these turns out. None when the
    answer depends on records older than ``base_seq``."""
    tokens, iterations, group_first = _unpack(records)
    n = len(tokens)
    floor = max(floor_seq - base_seq, 0)
    more_before = base_seq > floor_seq
    group_first = [max(g, floor_seq) if g != NOT_A_UNIT else base_seq + j for j, g in enumerate(group_first)]

    def boundary(j: int) -> bool:  # a turn boundary that keeps every group whole
        turn_edge = j == floor or j == n or iterations[j - 1] != iterations[j]
        return turn_edge and min(group_first[j:], default=base_seq + n) >= base_seq + j

    start = n
    while start > floor and iterations[start - 1] > active_iteration - keep_turns:
        start -= 1
    while True:
        if start == 0 and more_before:
            return None  # the turn, or a group, may begin before these records
        if boundary(start):
            break
        start -= 1
    total = sum(tokens[start:])
    position = start
    while position > floor:
        position -= 1
        total += tokens[position]
        if total > max_tokens:
            break  # every older boundary holds more still
        if position == 0 and more_before:
            return None  # whether it is a boundary lies before these records
        if boundary(position):
            start = position
    return base_seq + start


def select_stable_window(
    records: bytes, base_seq: int, active_iteration: int, budget: int, max_events: int,
    floor_seq: int = 0, prefix_tokens: Sequence[int] = (), previous_start: int = -1,
    previous_prefix_in: int = 0, trim_fraction: float = 0.6, keep_turns: int = 1,
) -> tuple[int, int, int, int, int] | None:
    """The cache-stable window: the previous window's start, kept while everything fits.

    A provider's prompt cache bills the repeated prefix of a request at a tenth of the price, so
    a window whose first entry moves every turn misses the cache on its whole history. This one
    keeps the start ``(previous_start, previous_prefix_in)`` of the previous window of the run
    (``previous_prefix_in`` summaries before the event at ``previous_start``) as long as the
    window from it fits ``budget`` and ``max_events``. When it does not:

    - if a summary was recorded since (the previous start lies below ``floor_seq``, or there was
      no previous window) and :func:`select_window` under ``budget`` feeds the newest summary,
      that is the window: the summary breaks the cached prefix anyway, and it is fed;
    - else the start moves forward in one step, to the oldest position whose window holds at
      most ``int(trim_fraction * budget)`` tokens and ``int(trim_fraction * max_events)``
      entries (at least 1; 0: no bound), which is :func:`select_window`'s choice under those
      tighter bounds, but never past the recent turns (:func:`recent_start` with
      ``keep_turns`` and those tokens): when they reach further back, the start is theirs, or,
      when they do not fit ``budget``, :func:`select_window`'s under ``budget``.

    Every other rule is :func:`select_window`'s: the active turn
    and its groups are in (clipped as it says when over ``budget``), a cut never splits a group
    (it moves newer), summaries come in only with every event from ``floor_seq`` on.

    Positions run oldest first: the summaries in force (``prefix_tokens``), newest ``k`` of them
    before the event at ``floor_seq``, then the events. A previous start below ``floor_seq`` (a
    summary recorded since replaced it, or ``-1``: no window before) means the oldest position,
    every summary of ``prefix_tokens``; log entries just before the start weigh nothing and do
    not move it. Same answer as :func:`select_window`; None when the records do not reach back
    to the previous start (the caller supplies more history).
    """
    chosen = select_window(records, base_seq, active_iteration, budget, max_events, floor_seq, prefix_tokens)
    if chosen is None:
        return None
    _, mandatory_seq, _, cap, _ = chosen
    if cap >= 0:
        return chosen  # the active turn alone is over the budget: clipped, nothing else in
    tokens, _, group_first = _unpack(records)
    n = len(tokens)
    is_unit = [g != NOT_A_UNIT for g in group_first]
    group_first = [max(g, floor_seq) if unit else base_seq + j for j, (g, unit) in enumerate(zip(group_first, is_unit))]
    floor = max(floor_seq - base_seq, 0)
    mandatory = mandatory_seq - base_seq

    # The previous start, as a position: (relative event index, summaries before it).
    start, summaries = previous_start - base_seq, 0
    if previous_start > floor_seq:
        if start < 1 and base_seq > floor_seq:
            return None  # whether log entries precede the start lies before these records
        while start > floor and not is_unit[start - 1]:
            start -= 1  # log entries weigh nothing: the same window starts before them
        if start == 0 and base_seq > floor_seq:
            return None
    if previous_start <= floor_seq or start <= floor:
        if base_seq > floor_seq:
            return None
        start = floor
        summaries = len(prefix_tokens) if previous_start < floor_seq else min(previous_prefix_in, len(prefix_tokens))
    if start > mandatory:
        start, summaries = mandatory, 0
    # Never split a group: move the start newer (to mandatory at the latest, which keeps groups whole).
    while any(group_first[j] < base_seq + start for j in range(start, n) if is_unit[j]):
        start, summaries = start + 1, 0
    if start > floor:
        summaries = 0
    fed_tokens = sum(tokens[start:]) + sum(prefix_tokens[len(prefix_tokens) - summaries:])
    fed_units = sum(is_unit[start:]) + summaries
    if fed_tokens <= budget and (max_events <= 0 or fed_units <= max_events):
        while start < mandatory and not is_unit[start]:
            start += 1
        return base_seq + start, mandatory_seq, fed_tokens, -1, summaries

    if previous_start < floor_seq and chosen[4] > 0:
        return chosen  # a summary recorded since: fed, with all it leaves
    # Over a bound: one step forward, to the oldest position within the trimmed bounds, the
    # recent turns kept.
    trim_tokens = int(trim_fraction * budget)
    trim_events = max(int(trim_fraction * max_events), 1) if max_events > 0 else 0
    recent = recent_start(records, base_seq, active_iteration, keep_turns, trim_tokens, floor_seq)
    if recent is None:
        return None
    if sum(tokens[mandatory:]) <= trim_tokens:
        trimmed = select_window(records, base_seq, active_iteration, trim_tokens, trim_events, floor_seq,
                                prefix_tokens)
        if trimmed is None:
            return None
        if trimmed[0] <= recent:
            return trimmed
    if chosen[0] >= recent:
        return chosen  # the recent turns do not fit the budget: the newest events that do
    start = recent - base_seq
    while start < mandatory and not is_unit[start]:
        start += 1
    return base_seq + start, mandatory_seq, sum(tokens[start:]), -1, 0
