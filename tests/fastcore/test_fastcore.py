"""fastcore, the compiled hot path, against its pure-Python twin and against the rules themselves.

The twin (``fastcore._fastcore_reference``) is the readable specification; the brute-force oracle below
restates the window rules from scratch (smallest valid cut), so a bug shared by both
implementations still fails here.
"""

from __future__ import annotations

import importlib.machinery
import random
import struct

import pytest

import fastcore
from fastcore import _fastcore_reference as _reference

PACK = struct.Struct("<III")


def test_the_compiled_module_is_what_fastcore_exports() -> None:
    module = fastcore.select_window.__module__
    assert module == "fastcore._fastcore"
    assert fastcore._fastcore.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert fastcore.RECORD_SIZE == _reference.RECORD_SIZE == PACK.size


# -- chars ----------------------------------------------------------------------------------

FIXED_TEXTS = ["", "a", "héllo", "日本語", "emoji 😀 and 👩‍👩‍👧", "\x00 nul", "é" * 1000, "mixed ü€𝄞"]


@pytest.mark.parametrize("text", FIXED_TEXTS)
def test_code_points_fixed(text: str) -> None:
    data = text.encode("utf-8")
    assert fastcore.count_code_points(data) == _reference.count_code_points(data) == len(text)


def test_code_points_random() -> None:
    rng = random.Random(7)
    alphabet = [chr(c) for c in (*range(32, 127), *range(0xA0, 0x2FF), *range(0x4E00, 0x4E80),
                                 *range(0x1F600, 0x1F650))]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 300)))
        data = text.encode("utf-8")
        assert fastcore.count_code_points(data) == _reference.count_code_points(data) == len(text)


# -- window selection -----------------------------------------------------------------------

SKIP = _reference.NOT_A_UNIT


def make_transcript(rng: random.Random, n: int, with_log_entries: bool = False) -> list[tuple[int, int, int]]:
    """(tokens, iteration, group_first) per event: non-decreasing iterations, some tool groups
    (a call and one or two results, sometimes spanning turns), some huge and some empty events,
    and optionally log entries that are not transcript (context.summarized)."""
    records: list[tuple[int, int, int]] = []
    iteration = 1
    open_groups: list[int] = []
    for seq in range(n):
        if rng.random() < 0.3:
            iteration += rng.choice((1, 1, 2))
        if with_log_entries and rng.random() < 0.1:
            records.append((0, iteration, SKIP))
            continue
        tokens = rng.choice((0, 1, 5, 20, 50, 120, 400, 2000))
        group_first = seq
        roll = rng.random()
        if roll < 0.2:
            open_groups.append(seq)  # a tool call
        elif roll < 0.45 and open_groups:
            group_first = rng.choice(open_groups)  # a result answering an earlier call
            if rng.random() < 0.5:
                open_groups.remove(group_first)
        records.append((tokens, iteration, group_first))
    return records


def pack(records: list[tuple[int, int, int]]) -> bytes:
    return b"".join(PACK.pack(*record) for record in records)


def oracle(records, active: int, budget: int, max_events: int, floor: int = 0, prefix: tuple[int, ...] = ()):
    """The rules, restated by brute force over every possible cut."""
    n = len(records)
    tokens = [r[0] for r in records]
    unit = [r[2] != SKIP for r in records]
    group = [max(r[2], floor) if unit[j] else j for j, r in enumerate(records)]

    def whole(cut: int) -> bool:  # no group straddles the cut
        return all(group[j] >= cut for j in range(cut, n))

    active_start = next((j for j in range(floor, n) if records[j][1] >= active), n)
    mandatory = max(j for j in range(floor, active_start + 1) if whole(j))
    if sum(tokens[mandatory:]) > budget:
        return "clip", mandatory
    fits = [c for c in range(floor, mandatory + 1) if whole(c) and sum(tokens[c:]) <= budget
            and (max_events == 0 or sum(unit[c:]) <= max_events or c == mandatory)]
    start = min(fits)
    prefix_in, total, units = 0, sum(tokens[start:]), sum(unit[start:])
    if start == floor:
        for summary in reversed(prefix):
            if (max_events and units >= max_events) or total + summary > budget:
                break
            total, units, prefix_in = total + summary, units + 1, prefix_in + 1
    while start < mandatory and not unit[start]:
        start += 1  # the window starts at a transcript event
    return "window", start, mandatory, total, prefix_in


def check_one(records, active, budget, max_events, floor=0, prefix=()) -> None:
    packed = pack(records)
    compiled = fastcore.select_window(packed, 0, active, budget, max_events, floor, prefix)
    reference = _reference.select_window(packed, 0, active, budget, max_events, floor, prefix)
    assert compiled == reference, (records, active, budget, max_events, floor, prefix)
    start, mandatory, total, cap, prefix_in = compiled
    tokens = [r[0] for r in records]
    expected = oracle(records, active, budget, max_events, floor, prefix)
    if cap >= 0:
        assert expected == ("clip", mandatory) and start == mandatory and prefix_in == 0
        assert total == sum(min(t, cap) for t in tokens[mandatory:]) <= budget
        # The cap is the largest that fits: one more would not.
        assert sum(min(t, cap + 1) for t in tokens[mandatory:]) > budget
    else:
        assert expected == ("window", start, mandatory, total, prefix_in)
        assert total <= budget

    # Given only a tail of the history, the answer is the same or "need more": never different.
    for base in sorted({len(records) // 2, max(len(records) - 3, 0), len(records) - 1}):
        if base <= 0:
            continue
        args = (packed[base * PACK.size:], base, active, budget, max_events, floor, prefix)
        partial = fastcore.select_window(*args)
        assert partial == _reference.select_window(*args)
        assert partial is None or partial == compiled
        if base <= floor:
            assert partial is not None


def test_window_random_against_reference_and_oracle() -> None:
    rng = random.Random(2026)
    for _ in range(1500):
        records = make_transcript(rng, rng.randrange(1, 60))
        active = records[-1][1] if rng.random() < 0.8 else records[-1][1] + 1
        budget = rng.choice((1, 10, 100, 500, 1000, 5000))
        max_events = rng.choice((0, 0, 1, 3, 10))
        check_one(records, active, budget, max_events)


def test_window_with_summaries_against_reference_and_oracle() -> None:
    rng = random.Random(111)
    for _ in range(1500):
        records = make_transcript(rng, rng.randrange(1, 60), with_log_entries=True)
        active = records[-1][1] if rng.random() < 0.8 else records[-1][1] + 1
        # The floor never cuts into the active turn (summaries never replace it).
        active_start = next((j for j, r in enumerate(records) if r[1] >= active), len(records))
        floor = rng.randrange(0, active_start + 1)
        prefix = tuple(rng.choice((5, 40, 100, 300)) for _ in range(rng.randrange(0, 5)))
        budget = rng.choice((1, 10, 100, 500, 1000, 5000))
        max_events = rng.choice((0, 0, 1, 3, 10))
        check_one(records, active, budget, max_events, floor, prefix)


def recent_oracle(records, active: int, keep_turns: int, max_tokens: int, floor: int) -> int:
    """The recent turns' start, restated over every position: the turn boundaries at or above the
    floor that split no group; of them, the largest at or before the last ``keep_turns`` turns,
    or the smallest whose suffix fits ``max_tokens`` when that is smaller."""
    n = len(records)
    tokens = [r[0] for r in records]
    group = [max(r[2], floor) if r[2] != SKIP else j for j, r in enumerate(records)]
    boundaries = [j for j in range(floor, n + 1)
                  if (j == floor or j == n or records[j - 1][1] != records[j][1])
                  and all(group[k] >= j for k in range(j, n))]
    kept = next((j for j in range(floor, n + 1) if all(r[1] > active - keep_turns for r in records[j:])), n)
    start = max(j for j in boundaries if j <= kept)
    return min([start] + [j for j in boundaries if sum(tokens[j:]) <= max_tokens])


def check_recent(records, active: int, keep_turns: int, max_tokens: int, floor: int) -> None:
    packed = pack(records)
    args = (active, keep_turns, max_tokens, floor)
    compiled = fastcore.recent_start(packed, 0, *args)
    assert compiled == _reference.recent_start(packed, 0, *args) == recent_oracle(records, *args), (records, args)
    for base in sorted({len(records) // 2, max(len(records) - 3, 0), len(records) - 1}):
        if base <= 0:
            continue
        partial = fastcore.recent_start(packed[base * PACK.size:], base, *args)
        assert partial == _reference.recent_start(packed[base * PACK.size:], base, *args)
        assert partial is None or partial == compiled, (records, args, base)


def test_recent_turns_random_against_reference_and_oracle() -> None:
    rng = random.Random(23)
    for _ in range(2500):
        records = make_transcript(rng, rng.randrange(1, 50), with_log_entries=rng.random() < 0.5)
        active = records[-1][1] if rng.random() < 0.8 else records[-1][1] + 1
        floor = rng.randrange(0, len(records)) if rng.random() < 0.3 else 0
        check_recent(records, active, rng.choice((1, 1, 2, 3, 10)), rng.choice((0, 10, 100, 500, 3000)), floor)


def stable_oracle(records, active: int, budget: int, max_events: int, floor: int, prefix: tuple[int, ...],
                  previous: int, previous_prefix_in: int, fraction: float, keep_turns: int = 1):
    """The cache-stable rule, restated by brute force over every position (summaries at the floor,
    then event cuts), oldest first: keep the previous start while its window fits; else, a
    summary recorded since, max-fill's window when it feeds one; else the oldest position within
    the trimmed bounds, or the recent turns' start when it is older and fits the budget."""
    expected = oracle(records, active, budget, max_events, floor, prefix)
    if expected[0] == "clip":
        return expected
    mandatory = expected[2]
    n, m = len(records), len(prefix)
    tokens = [r[0] for r in records]
    unit = [r[2] != SKIP for r in records]
    group = [max(r[2], floor) if unit[j] else j for j, r in enumerate(records)]
    positions = [(floor, k) for k in range(m, 0, -1)] + [(c, 0) for c in range(floor, mandatory + 1)]

    def valid(position) -> bool:
        return all(group[j] >= position[0] for j in range(position[0], n))

    def weight(position) -> tuple[int, int]:
        cut, k = position
        return sum(tokens[cut:]) + sum(prefix[m - k:]), sum(unit[cut:]) + k

    if previous < floor:
        at = (floor, m)
    else:
        cut = previous
        while cut > floor and not unit[cut - 1]:
            cut -= 1
        at = (floor, min(previous_prefix_in, m)) if cut == floor else (cut, 0)
    if at[0] > mandatory:
        at = (mandatory, 0)
    at = next(p for p in positions[positions.index(at):] if valid(p))
    fed, units = weight(at)
    if fed <= budget and (max_events == 0 or units <= max_events):
        cut = at[0]
        while cut < mandatory and not unit[cut]:
            cut += 1
        return "window", cut, mandatory, fed, at[1]
    if previous < floor and expected[4] > 0:
        return expected
    trim_tokens = int(fraction * budget)
    trim_events = max(int(fraction * max_events), 1) if max_events else 0
    recent = recent_oracle(records, active, keep_turns, trim_tokens, floor)
    if sum(tokens[mandatory:]) <= trim_tokens:
        trimmed = oracle(records, active, trim_tokens, trim_events, floor, prefix)
        if trimmed[1] <= recent:
            return trimmed
    if expected[1] >= recent:
        return expected
    cut = recent
    while cut < mandatory and not unit[cut]:
        cut += 1
    return "window", cut, mandatory, sum(tokens[cut:]), 0


def check_stable(records, active, budget, max_events, floor, prefix, previous, previous_prefix_in, fraction,
                 keep_turns=1) -> None:
    packed = pack(records)
    args = (active, budget, max_events, floor, prefix, previous, previous_prefix_in, fraction, keep_turns)
    compiled = fastcore.select_stable_window(packed, 0, *args)
    assert compiled == _reference.select_stable_window(packed, 0, *args), (records, args)
    start, mandatory, total, cap, prefix_in = compiled
    expected = stable_oracle(records, *args)
    if cap >= 0:
        assert expected == ("clip", mandatory) and start == mandatory
    else:
        assert expected == ("window", start, mandatory, total, prefix_in), (records, args)
        assert total <= budget
    # Given only a tail of the history, the answer is the same or "need more": never different.
    for base in sorted({len(records) // 2, max(len(records) - 3, 0), len(records) - 1}):
        if base <= 0:
            continue
        partial_args = (packed[base * PACK.size:], base, *args)
        partial = fastcore.select_stable_window(*partial_args)
        assert partial == _reference.select_stable_window(*partial_args)
        assert partial is None or partial == compiled, (records, args, base)


def test_stable_window_random_against_reference_and_oracle() -> None:
    rng = random.Random(10)
    for _ in range(2500):
        records = make_transcript(rng, rng.randrange(1, 50), with_log_entries=rng.random() < 0.5)
        active = records[-1][1] if rng.random() < 0.8 else records[-1][1] + 1
        active_start = next((j for j, r in enumerate(records) if r[1] >= active), len(records))
        floor = rng.randrange(0, active_start + 1) if rng.random() < 0.5 else 0
        prefix = tuple(rng.choice((5, 40, 100, 300)) for _ in range(rng.randrange(0, 4))) if floor else ()
        # Previous starts anywhere: none, below the floor, at it, inside a group, past the active turn.
        previous = rng.choice((-1, rng.randrange(0, len(records) + 1), floor, max(floor - 1, 0)))
        check_stable(records, active, rng.choice((1, 10, 100, 500, 1000, 5000)), rng.choice((0, 0, 1, 3, 10)),
                     floor, prefix, previous, rng.randrange(0, 5), rng.choice((0.3, 0.5, 0.6, 0.8, 1.0)),
                     rng.choice((1, 1, 2, 3, 10)))


def test_a_stable_window_keeps_its_start_until_the_budget_forces_one_step() -> None:
    """Turn after turn of 10-token events at a 100-token budget: the start stays until a turn
    would pass 100, then moves once so the window holds at most 60; never by one event a turn."""
    records: list[tuple[int, int, int]] = []
    start, starts = -1, []
    for turn in range(1, 41):
        seq = len(records)
        records.append((10, turn, seq))
        start, _, total, cap, _ = fastcore.select_stable_window(pack(records), 0, turn, 100, 0, 0, (), start, 0, 0.6)
        assert cap == -1 and total <= 100
        if starts and start != starts[-1]:
            assert total <= 60 and total + 10 > 60  # the oldest start within 60 tokens
        starts.append(start)
    moves = sum(1 for a, b in zip(starts, starts[1:]) if a != b)
    # The 11th event passes 100: 6 are kept and 4 more fit, so a move every 5 turns: 11, 16, ..., 36.
    assert moves == 6 and starts[10] == 5 and starts[14] == 5 and starts[15] == 10
    assert fastcore.select_window(pack(records), 0, 40, 100, 0)[0] == 30  # max-fill slides every turn


def compaction_oracle(records, floor: int, protect: int, max_tokens: int, all_of_it: bool = False) -> tuple[int, int]:
    n = len(records)
    tokens = [r[0] for r in records]
    group = [max(r[2], floor) if r[2] != SKIP else j for j, r in enumerate(records)]
    protect = min(max(protect, floor), n)
    whole = [c for c in range(floor + 1, protect + 1) if all(group[j] >= c for j in range(c, n))]
    target = min(sum(tokens[floor:protect]) // (1 if all_of_it else 2), max_tokens)
    within = [c for c in whole if sum(tokens[floor:c]) <= target]
    cut = max(within) if within else (whole[0] if whole else floor)
    return cut, sum(tokens[floor:cut]), sum(tokens[floor:])


def test_compaction_cut_against_reference_and_oracle() -> None:
    rng = random.Random(5)
    for _ in range(1500):
        records = make_transcript(rng, rng.randrange(1, 50), with_log_entries=True)
        floor = rng.randrange(0, len(records) + 1)
        protect = rng.randrange(0, len(records) + 2)
        max_tokens = rng.choice((1, 50, 500, 10_000))
        base = rng.randrange(0, floor + 1)
        packed = pack(records)[base * PACK.size:]
        whole = rng.random() < 0.5  # everything summarisable (the default candidates), or its oldest half
        compiled = fastcore.compaction_cut(packed, base, floor, protect, max_tokens, whole)
        assert compiled == _reference.compaction_cut(packed, base, floor, protect, max_tokens, whole)
        assert compiled == compaction_oracle(records, floor, protect, max_tokens, whole)
    with pytest.raises(ValueError):
        fastcore.compaction_cut(pack([(1, 1, 0)]), 1, 0, 1, 10)


def test_splits_group_against_reference_and_oracle() -> None:
    rng = random.Random(9)
    for _ in range(1000):
        records = make_transcript(rng, rng.randrange(1, 40), with_log_entries=True)
        floor = rng.randrange(0, len(records))
        cut = rng.randrange(floor, len(records) + 1)
        base = rng.randrange(0, floor + 1)
        packed = pack(records)[base * PACK.size:]
        expected = next((j for j in range(max(cut, base), len(records))
                         if records[j][2] != SKIP and max(records[j][2], floor) < cut), -1)
        assert (fastcore.splits_group(packed, base, floor, cut) == _reference.splits_group(packed, base, floor, cut)
                == expected)


def test_own_entries_against_reference_and_oracle() -> None:
    rng = random.Random(11)
    for _ in range(1000):
        records = make_transcript(rng, rng.randrange(0, 40), with_log_entries=True)
        base = rng.randrange(0, len(records) + 1)
        packed = pack(records)[base * PACK.size:]
        expected = [seq for seq in range(base, len(records)) if records[seq][2] == SKIP]
        assert fastcore.own_entries(packed, base) == _reference.own_entries(packed, base) == expected


def test_window_fixed_cases() -> None:
    # A call (seq 1) and its result (seq 3) straddle the budget cut at 2: both go.
    records = [(10, 1, 0), (10, 1, 1), (10, 2, 2), (10, 2, 1), (10, 3, 4)]
    assert fastcore.select_window(pack(records), 0, 3, 25, 0) == (4, 4, 10, -1, 0)
    # The active turn's result pulls its call (and what lies between) in, over the budget.
    assert fastcore.select_window(pack(records[:4]), 0, 2, 15, 0) == (1, 1, 15, 5, 0)
    # The event-count bound is tighter than the budget.
    assert fastcore.select_window(pack([(1, 1, 0), (1, 1, 1), (1, 2, 2)]), 0, 2, 100, 2) == (1, 2, 2, -1, 0)
    # The active turn alone exceeds the budget: clip to a per-event cap (water-filling).
    assert fastcore.select_window(pack([(5, 1, 0), (100, 2, 1), (3, 2, 2)]), 0, 2, 50, 0) == (1, 1, 50, 47, 0)
    # Nothing assembled yet for an iteration before any event.
    assert fastcore.select_window(b"", 0, 1, 10, 0) == (0, 0, 0, -1, 0)
    # Events 0-1 are summarised (two summaries of 7 and 9 tokens); a log entry at 2 weighs
    # nothing; both summaries fit after the unsummarised events, the older one does not.
    summarised = [(10, 1, 0), (10, 1, 1), (0, 2, SKIP), (10, 2, 3), (10, 3, 4)]
    assert fastcore.select_window(pack(summarised), 0, 3, 30, 0, 2, (7, 9)) == (3, 4, 29, -1, 1)
    assert fastcore.select_window(pack(summarised), 0, 3, 40, 0, 2, (7, 9)) == (3, 4, 36, -1, 2)
    # A unit bound of 3 counts summaries, not log entries.
    assert fastcore.select_window(pack(summarised), 0, 3, 40, 3, 2, (7, 9)) == (3, 4, 29, -1, 1)


def test_select_window_rejects_a_missing_buffer() -> None:
    with pytest.raises(TypeError):
        fastcore.select_window(None, 0, 1, 10, 0)  # type: ignore[arg-type]
