"""The window rules every answer must keep, checked from outside: what a host or an auditor can
check with the run's log (ListRunEvents), the artifacts (GetArtifact) and its own counter
(tiktoken, through tests/specification/model.py), whatever the configuration. Each check raises
AssertionError naming the rule."""

from __future__ import annotations

from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.specification.model import (
    CLEARED_PLACEHOLDER,
    MARKER_WORD,
    SIDECAR_TYPES,
    counts,
)

SUMMARY_TYPE = "context.summary"


def check_window(answer: pb.AssembleContextResponse, log: list[pb.StoredEvent], counter: str,
                 transcript_window: int, artifacts: dict[str, str]) -> None:
    """RFC 0111 and docs/transcript.md "The window rules", on one AssembleContext answer."""
    iteration = answer.iteration
    entries = list(answer.entries)
    # Every entry's tokens recount from its text; token_count is their sum; within the budget.
    recount = counts(counter, [entry.text for entry in entries])
    for entry, tokens in zip(entries, recount):
        assert entry.tokens == tokens, f"recount: {entry.event_id} says {entry.tokens}, its text counts {tokens}"
    assert answer.token_count == sum(recount), ("recount: token_count", answer.token_count, sum(recount))
    assert answer.token_count <= answer.token_budget, ("budget", answer.token_count, answer.token_budget)
    assert list(answer.event_ids) == [entry.event_id for entry in entries], "event_ids name the entries"
    if transcript_window:
        assert len(entries) <= transcript_window, ("event count", len(entries), transcript_window)
    for entry in entries:
        assert entry.text or entry.type == SUMMARY_TYPE or not entry.clipped_from_tokens, \
            f"no entry fed emptied: {entry.event_id}"

    summaries = [entry for entry in entries if entry.type == SUMMARY_TYPE]
    verbatim = [entry for entry in entries if entry.type != SUMMARY_TYPE]
    assert entries[:len(summaries)] == summaries, "the summaries in the window come first"
    for entry in summaries:
        assert entry.event_id in artifacts, f"a summary fed is one recorded: {entry.event_id}"
        assert entry.text == artifacts[entry.event_id], f"a summary is fed as its artifact: {entry.event_id}"

    host = [event for event in log if event.iteration <= iteration and event.type not in SIDECAR_TYPES]
    by_id = {event.event_id: event for event in host}
    # The recent tail: the verbatim events are the log's last ones, contiguous.
    if verbatim:
        first = next(i for i, event in enumerate(host) if event.event_id == verbatim[0].event_id)
        assert [event.event_id for event in host[first:]] == [entry.event_id for entry in verbatim], \
            "the recent tail: no event left out while an older one is in"
        assert answer.omitted_events + answer.summarized_events == first, \
            ("omitted + summarized = host events before the window", answer.omitted_events,
             answer.summarized_events, first)
    else:
        assert not [event for event in host if event.iteration == iteration], "the active turn is fed"
    # The active turn is always in, with the calls its results answer.
    fed = {entry.event_id for entry in verbatim}
    active = [event for event in host if event.iteration == iteration]
    assert all(event.event_id in fed for event in active), "the active turn is always in"
    # A call and its results are in or out together.
    call_ids = {by_id[event_id].call_id for event_id in fed if by_id[event_id].call_id}
    for event in host:
        if event.call_id in call_ids:
            assert event.event_id in fed, f"call {event.call_id!r}: {event.event_id} is left out, its pair is in"
    # Each verbatim entry is its event: its content, or a marked clip of it, or a cleared placeholder.
    for entry in verbatim:
        event = by_id[entry.event_id]
        assert (entry.seq, entry.iteration, entry.role, entry.call_id) == \
            (event.seq, event.iteration, event.role, event.call_id), f"the entry is its event: {entry.event_id}"
        if not entry.clipped_from_tokens:
            assert entry.text == event.content, f"fed as stored: {entry.event_id}"
            continue
        assert entry.clipped_from_tokens == event.tokens, ("clipped_from_tokens", entry.event_id)
        if entry.text.startswith(CLEARED_PLACEHOLDER):
            assert event.role == "tool" and f'call_id "{event.call_id}"' in entry.text and \
                f"{event.tokens} tokens" in entry.text, f"a cleared result names its call: {entry.text!r}"
        else:
            assert MARKER_WORD in entry.text, f"a clip keeps its marker: {entry.event_id}"
            assert entry.tokens < event.tokens, f"a clip is smaller than its event: {entry.event_id}"


def check_seam(answer: pb.AssembleContextResponse, seam: pb.GetTranscriptWindowResponse) -> None:
    """The seam (GetTranscriptWindow) says exactly what the answer fed (RFC 0111 conformance)."""
    assert seam.token_count == answer.token_count and seam.token_budget == answer.token_budget
    assert list(seam.event_ids) == list(answer.event_ids)
    assert [(e.event_id, e.rendered, e.tokens) for e in seam.entries] == \
        [(e.event_id, e.text, e.tokens) for e in answer.entries]
    summary_ids = [entry.event_id for entry in answer.entries if entry.type == SUMMARY_TYPE]
    assert [r.summary_ref for r in seam.summarized_ranges] == summary_ids, "every summary fed is a summarized range"


def same_window(first: pb.AssembleContextResponse, again: pb.AssembleContextResponse) -> bool:
    """Two answers feed the same window: entries, counts and accounting alike."""
    fields = ("token_budget", "token_count", "omitted_events", "summarized_events", "token_counter")
    return list(first.entries) == list(again.entries) and \
        all(getattr(first, name) == getattr(again, name) for name in fields)
