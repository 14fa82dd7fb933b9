"""Readable pure-Python twins of every function fastcore exports.

These are the specification: tests run the compiled functions and these side by side on fixed
and random inputs and require identical answers. Nothing in the sidecar imports this module to
serve requests; the compiled module is what runs.

Packed event records (shared with ``sidecar.records``): one record per event, ``RECORD_SIZE``
bytes, three little-endian uint32 fields:

    tokens       the event's token count in its run's counter
    iteration    the turn the event belongs to (non-decreasing along a run)
    group_first  the seq of the first event sharing this event's call_id, or the event's own
                 seq when it has no call_id (a tool call and its results form one group)
"""

from __future__ import annotations

import struct

RECORD_SIZE = 12
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
    records: bytes, base_seq: int, active_iteration: int, budget: int, max_events: int
) -> tuple[int, int, int, int] | None:
    """Choose the transcript window over the events ``[base_seq, base_seq + n)``.

    ``records`` holds the packed records of those events, which must be the tail of the
    transcript as of ``active_iteration`` (no record has a greater iteration). ``max_events``
    is the event-count bound (0: none). Returns ``(start_seq, mandatory_start, tokens, cap)``:

    - the window is the events ``[start_seq, end)``, a contiguous recent tail;
    - ``[mandatory_start, end)`` is the active turn plus every event grouped with it by
      call_id (and, transitively, whatever lies between): always in;
    - ``cap`` is -1 when everything fits, else the per-event token cap that the mandatory
      events must be clipped to (events above it are clipped to it) so the window fits
      ``budget``; ``tokens`` is then the sum of the capped counts;
    - a cut never separates a group: it moves to the newer side (the group goes out).

    Returns None when the answer depends on events older than ``base_seq`` (the caller then
    supplies more history); never when ``base_seq`` is 0.
    """
    tokens, iterations, group_first = _unpack(records)
    n = len(tokens)
    end = base_seq + n

    # The active turn: the trailing events whose iteration is the active one.
    active_start = n
    while active_start > 0 and iterations[active_start - 1] >= active_iteration:
        active_start -= 1
    if active_start == 0 and base_seq > 0 and n > 0 and iterations[0] >= active_iteration:
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
    while mandatory > 0 and not whole(mandatory):
        mandatory -= 1
    if mandatory == 0 and base_seq > 0 and not whole(0):
        return None

    mandatory_tokens = sum(tokens[mandatory:])
    if mandatory_tokens > budget:
        cap = _clip_cap(tokens[mandatory:], budget)
        capped = sum(min(t, cap) for t in tokens[mandatory:])
        return base_seq + mandatory, base_seq + mandatory, capped, cap

    # Extend older while the next event fits the budget and the event-count bound.
    total = mandatory_tokens
    cut = mandatory
    while True:
        if max_events > 0 and n - cut >= max_events:
            break
        if cut == 0:
            if base_seq > 0:
                return None
            break
        if total + tokens[cut - 1] > budget:
            break
        cut -= 1
        total += tokens[cut]

    # Never split a group: move the cut newer to the first position that keeps groups whole.
    while not whole(cut):
        cut += 1
    total = sum(tokens[cut:])
    return base_seq + cut, base_seq + mandatory, total, -1
