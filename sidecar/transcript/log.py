"""A run's event log: appending entries and reading them back.

The log holds the host's events and the sidecar's own entries (``context.summarized``,
``context.cleared``), in one seq space. Every entry is kept as its record (``events``), its id
(``event_ids`` index and the per-chunk id lists) and a packed count record (``counts``) that
fastcore walks; the sidecar's entries are marked ``NOT_A_UNIT`` there, with 0 tokens, so they
weigh nothing in a window or in any sum over the counts, and indexed by seq (``log_entries``,
valued with how many came before), so finding them never scans the log.
An event's count record holds what it weighs when fed: its own count, until the sidecar feeds it
in a shorter form from some turn on (``clearing``), then that form's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import fastcore
from sidecar.errors import Conflict, ValidationError
from sidecar.settings import ROLES, TOOL_NAME, ContextSettings
from sidecar.storage.codec import StoredEvent, encode_event, encode_id_index
from sidecar.storage.keys import Txn
from sidecar.text.counting import Counters
from sidecar.transcript.runs import SIDECAR_ID_PREFIX, Run, save_run
from sidecar.transcript.schema import (
    LogChunks,
    call_group,
    indexed_event,
    iteration_start,
    leave_out,
    log_entries_from,
    log_entries_in,
    name_key,
    numbered_key,
    pack_count,
    read_event,
    read_ids,
)
from sidecar.validation import (
    MAX_COUNT,
    MAX_ID_BYTES,
    MAX_UNBROKEN_RUN,
    check_at_least,
    check_id,
    check_text_bytes,
    check_unbroken_runs,
    json_field,
)

MAX_EVENTS_PER_RUN = 2**31 - 1  # seq travels as int32
MAX_TYPE_BYTES = 64


class NewEvent(NamedTuple):
    """An event as the host sends it; ``iteration`` 0 means "the turn being assembled".
    A named tuple, not a frozen dataclass: made per event of every append, it costs a quarter."""

    event_id: str
    iteration: int
    role: str
    type: str
    content: str
    call_id: str = ""
    host_token_count: int | None = None
    tool_name: str = ""  # on a tool call: the tool; the content is then its arguments (a JSON object)
    untrusted: bool = False  # fed inside the untrusted-data block (as every role "tool" event is)

    @classmethod
    def from_fields(cls, event_id: str, iteration: int, role: str, type: str, content: str, call_id: str,
                    host_token_count: int | None, tool_name: str, untrusted: bool) -> NewEvent:
        """An event from every one of its fields: with the fields' declaration above, the one
        place that knows their order, which fastcore's ``new_entries`` and ``event_faults`` read
        the tuple by (``_entries.pyx``; tests/test_architecture.py compares). Made as the
        tuple of its fields, without the named tuple's defaults."""
        return tuple.__new__(cls, (event_id, iteration, role, type, content, call_id, host_token_count, tool_name,
                                   untrusted))

    def with_content(self, content: str) -> NewEvent:
        return self if content is self.content else self._replace(content=content)

    def with_defaults(self, type: str, iteration: int) -> NewEvent:
        if type == self.type and iteration == self.iteration:
            return self
        return self._replace(type=type, iteration=iteration)


class AppendResult(NamedTuple):
    event_id: str
    seq: int
    tokens: int
    already_recorded: bool


class LogWriter:
    """Appends entries to one run's log inside a write transaction, keeping the chunks it touches
    in memory (:class:`~sidecar.transcript.schema.LogChunks`) until :meth:`flush` writes those that
    changed, and the run record."""

    def __init__(self, txn: Txn, db: dict, key: bytes, run: Run) -> None:
        self.txn, self.db, self.key, self.run = txn, db, key, run
        self._chunks = LogChunks(txn, db, key)

    def append(self, entry: StoredEvent, group_first: int, host_token_count: int | None = None) -> None:
        """Write ``entry`` (its seq must be the run's next) with its count record."""
        self.append_record(entry.seq, entry.event_id, entry.iteration, entry.tokens, encode_event(entry), group_first,
                           host_token_count)

    def append_record(self, seq: int, event_id: str, iteration: int, tokens: int, record: bytes, group_first: int,
                      host_token_count: int | None) -> None:
        """Write an entry's ``record`` (an encoded StoredEvent; ``seq`` must be the run's next) with its
        count record. Its writes are written out here rather than in ``schema``: they run once per
        event, on the turn's hot path."""
        txn, db, key, run = self.txn, self.db, self.key, self.run
        assert seq == run.next_seq and iteration >= run.last_iteration
        if iteration > run.last_iteration:
            txn.put(numbered_key(key, iteration), seq.to_bytes(4, "big"), db=db["iterations"])
        txn.put(numbered_key(key, seq), record, db=db["events"])
        txn.put(name_key(key, event_id), encode_id_index(seq, host_token_count), db=db["event_ids"])
        self._chunks.append(seq, pack_count(tokens, iteration, group_first), (event_id,))
        if group_first == fastcore.NOT_A_UNIT:
            txn.put(numbered_key(key, seq), run.log_entries.to_bytes(4, "big"), db=db["log_entries"])
            run.log_entries += 1
        run.next_seq = seq + 1
        run.last_iteration = iteration

    def append_host(self, events: Sequence[NewEvent], tokens: Sequence[int], group_firsts: Sequence[int]) -> None:
        """Write the host's ``events`` (new, their iterations not decreasing from the run's) as the
        run's next entries, with their counts and call groups. fastcore makes every record, key
        and count record in one call (a record's bytes are protobuf's own; tests compare), and each
        database takes its writes in one ``putmulti``: per event, no Python runs here."""
        txn, db, key, run = self.txn, self.db, self.key, self.run
        first = run.next_seq
        records, index, counts, iteration_starts = fastcore.new_entries(
            key, first, events, tokens, group_firsts, run.last_iteration)
        txn.cursor(db=db["events"]).putmulti(records)
        txn.cursor(db=db["event_ids"]).putmulti(index)
        if iteration_starts:
            txn.cursor(db=db["iterations"]).putmulti(iteration_starts)
        self._chunks.append(first, counts, [event.event_id for event in events])
        if events:
            assert events[0].iteration >= run.last_iteration
            run.next_seq = first + len(events)
            run.last_iteration = events[-1].iteration

    def recount(self, seq: int, tokens: int) -> None:
        """Make entry ``seq`` weigh ``tokens`` in every window chosen from now on: the count of the
        form it is fed in from now on (a cleared tool result's placeholder, a clipped result's
        clipped text), so that fastcore's selection sees what is fed."""
        self._chunks.set_tokens(seq, tokens)

    def flush(self) -> None:
        self._chunks.flush()
        save_run(self.txn, self.db, self.key, self.run)


def prepare_events(events: Sequence[NewEvent], field: str, defaults: ContextSettings,
                   turn: int | None = None) -> list[NewEvent]:
    """Fill in defaults (type ``message``; iteration ``turn`` when 0 and a turn is given) and
    validate every field, naming the first bad one (``field[i].role``)."""
    prepared = [event.with_defaults(event.type or "message", event.iteration or (turn or 0)) for event in events]
    limit = defaults.max_event_bytes
    # fastcore checks every event against the event rules in one pass; only the events it names
    # (the invalid, and tool calls) are looked at here, to word the refusal or check the call.
    for i, faults in _event_faults(prepared, limit, turn):
        try:
            _refuse_first(prepared[i], faults, limit, turn)
        except ValidationError as error:
            # The event's place is put in the name only now: nearly every event is good, and
            # making its field names up front cost more than checking them.
            bad = error.violations[0]
            raise ValidationError.field(f"{field}[{i}].{bad.field}", bad.description) from None
    for i, event in enumerate(prepared):  # fastcore passes long runs: only a long content can hold one
        if len(event.content) > MAX_UNBROKEN_RUN:
            check_unbroken_runs(f"{field}[{i}].content", event.content)
    return prepared


def check_event(event: NewEvent, max_event_bytes: int, turn: int | None) -> None:
    """Raise naming the first bad field of ``event`` (``role``, ``content``, ...)."""
    faulted = _event_faults((event,), max_event_bytes, turn)
    if faulted:
        _refuse_first(event, faulted[0][1], max_event_bytes, turn)
    else:
        check_unbroken_runs("content", event.content)


def _event_faults(events: Sequence[NewEvent], max_event_bytes: int, turn: int | None) -> list[tuple[int, int]]:
    """The event rules, ``fastcore.EVENT_RULES`` (stated once, in fastcore's ``_entries`` and its
    twin), with the sidecar's limits: (index, mask of the rules broken) of each event that breaks
    one or is a tool call."""
    return fastcore.event_faults(events, max_event_bytes, turn, ROLES, SIDECAR_ID_PREFIX, MAX_ID_BYTES,
                                 MAX_TYPE_BYTES, MAX_COUNT)


def _refuse_first(event: NewEvent, faults: int, max_event_bytes: int, turn: int | None) -> None:
    """Raise the refusal of the first rule ``event`` breaks (``faults``: an :func:`_event_faults`
    mask), in the order of ``fastcore.EVENT_RULES``. fastcore checks neither a tool call's
    arguments (JSON) nor a content's unbroken runs: they are checked here, at their places."""
    for bit, rule in enumerate(fastcore.EVENT_RULES):
        if faults >> bit & 1:
            _refuse(rule, event, max_event_bytes, turn)
        if rule == "content":
            check_unbroken_runs("content", event.content)


def _refuse(rule: str, event: NewEvent, max_event_bytes: int, turn: int | None) -> None:
    """Raise the refusal of ``event``, which breaks ``rule``, worded by the sidecar's shared
    checks where one applies; a tool call is checked (fastcore only says it is one)."""
    match rule:
        case "event_id":
            check_id("event_id", event.event_id)
        case "event_id_reserved":
            raise ValidationError.field("event_id", f"ids starting with {SIDECAR_ID_PREFIX!r} are the sidecar's")
        case "iteration":
            check_at_least("iteration", event.iteration, 1)
        case "iteration_turn":
            raise ValidationError.field("iteration",
                                        f"is {event.iteration}, after the iteration being assembled ({turn})")
        case "role":
            raise ValidationError.field("role", f"must be one of {', '.join(ROLES)}")
        case "type":
            check_id("type", event.type, max_bytes=MAX_TYPE_BYTES)
        case "content":
            check_text_bytes("content", event.content, max_event_bytes, "[context] max_event_bytes")
        case "call_id":
            check_id("call_id", event.call_id, required=False)
        case "tool_call":
            check_tool_call(event)
            return
        case "host_token_count":
            raise ValidationError.field("host_token_count", f"must be between 0 and {MAX_COUNT}")
    raise AssertionError(f"fastcore's event rule {rule!r} has no refusal here, or the shared check passed")  # a defect


def check_tool_call(event: NewEvent) -> None:
    """A tool call names its tool as providers accept it, and carries its arguments as a JSON
    object, so that every rendering can make the provider's own tool-call item from it."""
    if not TOOL_NAME.fullmatch(event.tool_name):
        raise ValidationError.field("tool_name", "must be 1-64 of A-Z a-z 0-9 _ - (as providers name tools)")
    if event.role != "assistant" or not event.call_id:
        raise ValidationError.field("tool_name", "is only for tool calls: role 'assistant' with a call_id")
    if not isinstance(json_field("content", event.content), dict):
        raise ValidationError.field("content", "a tool call's content is its arguments: a JSON object")
    if event.untrusted:  # fenced, its arguments would be text, not the JSON object a rendering sends
        raise ValidationError.field("untrusted", "a tool call's arguments are sent as JSON, so they cannot be "
                                    "fenced as untrusted data; mark its result untrusted instead")


def count_texts(counters: Counters, counter_name: str, texts: Sequence[str],
                host_counts: Sequence[int | None], fields: Sequence[str]) -> list[int]:
    """Each text's count in the run's counter; under ``host-defined``, the host's own counts,
    each required (``fields`` name where each one was due)."""
    if counter_name == "host-defined":
        for count, field in zip(host_counts, fields):
            if count is None:
                raise ValidationError.field(field, "is required: the run counts tokens as host-defined")
        return list(host_counts)  # type: ignore[arg-type]
    counter = counters.get(counter_name)
    return [counter.count(text) for text in texts]


def count_events(counters: Counters, counter_name: str, events: Sequence[NewEvent], field: str) -> list[int]:
    if counter_name != "host-defined":  # the host's counts, and the fields naming them, are not needed
        return count_texts(counters, counter_name, [e.content for e in events], (), ())
    return count_texts(counters, counter_name, [e.content for e in events], [e.host_token_count for e in events],
                       [f"{field}[{i}].host_token_count" for i in range(len(events))])


def append_host_events(writer: LogWriter, events: Sequence[NewEvent], counts: Sequence[int], field: str,
                       before_each: Callable[[LogWriter, NewEvent], None] | None = None) -> list[AppendResult]:
    """Append the host's events: a retried one (same id, same fields) is a no-op, a changed one
    a conflict, an iteration going backwards invalid. The caller commits or aborts all of it.
    Runs under the write lock: the usual call, every event new, is written in one go; field
    names are made only to raise."""
    if before_each is None and _all_new(writer, events):
        # The usual call: every event new and in order. Nothing can fail; written in one go.
        first = writer.run.next_seq
        groups = [_group_first(writer, event, seq) for seq, event in enumerate(events, first)]
        writer.append_host(events, counts, groups)
        return [AppendResult(event.event_id, seq, tokens, False)
                for seq, (event, tokens) in enumerate(zip(events, counts), first)]
    return _append_one_by_one(writer, events, counts, field, before_each)


def _all_new(writer: LogWriter, events: Sequence[NewEvent]) -> bool:
    """Whether every event is new (its id is in neither the run nor, twice, the batch), their
    iterations do not decrease from the run's, and the run has room for them all."""
    run, key = writer.run, writer.key
    keys = [key + event.event_id.encode("utf-8") for event in events]
    last = run.last_iteration
    for event in events:
        if event.iteration < last:
            return False
        last = event.iteration
    return (len(set(keys)) == len(keys) and run.next_seq + len(events) <= MAX_EVENTS_PER_RUN
            and not writer.txn.cursor(db=writer.db["event_ids"]).getmulti(keys))


def _append_one_by_one(writer: LogWriter, events: Sequence[NewEvent], counts: Sequence[int], field: str,
                       before_each: Callable[[LogWriter, NewEvent], None] | None) -> list[AppendResult]:
    """``append_host_events`` event by event: retried events, conflicts, errors, and replay forks."""
    txn, db, key, run = writer.txn, writer.db, writer.key, writer.run
    results: list[AppendResult] = []
    in_batch: dict[str, tuple[NewEvent, AppendResult]] = {}
    for i, (event, tokens) in enumerate(zip(events, counts)):
        event_id = event.event_id
        earlier = in_batch.get(event_id)
        if earlier is not None:
            if earlier[0] != event:
                raise Conflict.field(f"{field}[{i}].event_id", "appears twice in this call with different fields")
            results.append(earlier[1]._replace(already_recorded=True))
            continue
        indexed = indexed_event(txn, db, key, event_id)
        if indexed is not None:
            stored = read_event(txn, db, key, indexed[0])
            if not _same_event(stored, indexed[1], event):
                raise Conflict.field(f"{field}[{i}].event_id", "is already recorded with different fields")
            results.append(AppendResult(stored.event_id, stored.seq, stored.tokens, True))
            continue
        if before_each is not None:
            before_each(writer, event)
        if event.iteration < run.last_iteration:
            raise ValidationError.field(
                f"{field}[{i}].iteration", f"is {event.iteration}, but the run is already at iteration "
                f"{run.last_iteration}; iterations never decrease")
        seq = run.next_seq
        if seq >= MAX_EVENTS_PER_RUN:
            raise ValidationError.field(f"{field}[{i}]", f"the run already holds {seq} events, the most one run can")
        writer.append_host((event,), (tokens,), (_group_first(writer, event, seq),))
        result = AppendResult(event_id, seq, tokens, False)
        in_batch[event_id] = (event, result)
        results.append(result)
    return results


def _group_first(writer: LogWriter, event: NewEvent, seq: int) -> int:
    """The group of ``event`` appended as entry ``seq``: its call's first entry (``seq`` for a new
    call, recorded so), or itself outside a call."""
    return call_group(writer.txn, writer.db, writer.key, event.call_id, seq) if event.call_id else seq


def _same_event(stored: StoredEvent, stored_host_count: int | None, event: NewEvent) -> bool:
    return (stored.iteration, stored.role, stored.type, stored.content, stored.call_id, stored_host_count,
            stored.tool_name) == (event.iteration, event.role, event.type, event.content, event.call_id,
                                  event.host_token_count, event.tool_name)


def check_request_size(field: str, contents: Sequence[str], limits: ContextSettings) -> None:
    """Refuse a call whose ``contents`` (events' contents, or texts) pass ``[context]``
    max_request_events or max_request_bytes, naming ``field``: one caller's call must not hold a
    worker (and the GIL) for long enough to starve the others."""
    if len(contents) > limits.max_request_events:
        raise ValidationError.field(field, f"holds {len(contents)} items; at most {limits.max_request_events} "
                                    "are allowed in one call ([context] max_request_events)")
    total = 0
    for content in contents:
        total += len(content.encode("utf-8"))
        if total > limits.max_request_bytes:
            raise ValidationError.field(field, f"holds more than {limits.max_request_bytes} bytes of content; "
                                        "that is the most one call may carry ([context] max_request_bytes)")


def log_entries_before(txn: Txn, db: dict, key: bytes, run: Run, seq: int) -> int:
    """How many of the sidecar's own entries lie below ``seq``."""
    before = log_entries_from(txn, db, key, seq)
    return run.log_entries if before is None else before


def host_event_ids(txn: Txn, db: dict, key: bytes, start: int, end: int) -> list[str]:
    """The ids of the host's events in ``[start, end)``, in order (the sidecar's entries left out)."""
    [ids] = leave_out(log_entries_in(txn, db, key, start, end), start, read_ids(txn, db, key, start, end))
    return ids


def prefix_end(txn: Txn, db: dict, key: bytes, run: Run, iteration: int) -> int:
    """One past the last seq of the entries with iteration <= ``iteration``."""
    if iteration <= 0:
        return 0
    if iteration >= run.last_iteration:
        return run.next_seq
    end = iteration_start(txn, db, key, iteration + 1)
    return run.next_seq if end is None else end

