"""Summaries of older turns (RFC 0111's declared summarization): recording, validating, and
knowing which stand in for what at any iteration.

A summary replaces the oldest events not yet summarised, a contiguous run of them starting at
the *floor* (the first event no summary replaced), and, with ``recursive`` or ``map-reduce``,
the newest summaries too. Summaries stack in order. The stack in force once a summary is
recorded is a persistent linked list: its record names the summary directly under it
(``below``), whose stack is unchanged since (a later summary only ever replaces the newest ones
and pushes itself), so a record is the summary's own fields and a fixed-size link, whatever came
before. A turn walks down from the summary in force only as far as its window reaches, reading
each record's fixed head (link, depth, count, ref) without decoding the rest. Each summary is
persisted as an artifact (the summary entry, fed as a WindowEntry) and announced in the run's log
by a ``context.summarized`` entry whose payload is RFC 0111's, the text never inlined.

A summary record is ``_HEAD`` (layout, below, depth, tokens_after, ref length), the ref, then
the summary's fields as JSON. Records of the first layout (a JSON object holding the whole stack,
first byte ``{``) are still read: their stack's second-newest member is their ``below``.
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice

import fastcore
from sidecar.caching import Cache, CacheSpec, cache_of, text_bytes
from sidecar.context_window.schema import task_id as stored_task_id
from sidecar.errors import Conflict, FieldViolation, SummaryUnavailable, ValidationError
from sidecar.settings import STRATEGIES
from sidecar.storage.codec import StoredEvent, decode_event, dump_plain_json, encode_record, load_plain_json
from sidecar.storage.environment import after_commit
from sidecar.storage.keys import Txn
from sidecar.telemetry import metrics
from sidecar.text.fencing import is_fenced
from sidecar.transcript.log import LogWriter, count_texts, host_event_ids, prefix_end
from sidecar.transcript.runs import SIDECAR_ID_PREFIX, Deps, Run, RunSettings
from sidecar.transcript.schema import (
    CompactionRecord,
    artifact,
    artifacts,
    event_by_id,
    event_seq,
    log_entries_from_seq,
    put_artifact,
    put_compaction_record,
    put_summary_record,
    read_counts,
    read_event,
    read_ids,
    records_in,
    run_id_of,
    summary_record,
    summary_records,
    tokens_at,
)
from sidecar.validation import check_at_least, check_id, check_text_bytes

SUMMARY_TYPE = "context.summary"  # the summary's entry in a window
SUMMARIZED_TYPE = "context.summarized"  # the log entry announcing a summary
REF_PREFIX = SIDECAR_ID_PREFIX + "summary:"
STACKING_STRATEGIES = ("recursive", "map-reduce")  # may replace earlier summaries
NO_SUMMARY = -1  # ``below`` of the oldest summary in force
_HEAD = struct.Struct(">BiIIB")  # layout, below, depth, tokens_after, len(ref)
_LAYOUT = 2  # layout 1: a JSON object with the whole stack, its first byte "{"
WALKED_PER_RUN = 65_536  # summaries kept of one run before its walks start afresh
MAX_TOKENS = 1 << 62  # no bound on what one summary may replace


@dataclass(frozen=True, slots=True)
class Summary:
    index: int
    ref: str  # summaryRef: the artifact id of its text
    seq: int  # of its context.summarized log entry
    iteration: int  # it stands in from this iteration on
    from_seq: int  # the floor before it: the first event it replaced
    to_seq: int  # the floor after it: one past the last event it replaced
    replaced_summaries: tuple[int, ...]
    replaced_turns: tuple[str, ...]  # RFC 0111 replacedTurns: replaced summaries' refs, then event ids
    tokens_before: int
    tokens_after: int
    strategy: str
    text_sha256: str
    below: int  # the summary directly under this one in the stack in force once it is; NO_SUMMARY
    depth: int  # how many summaries are in force once it is (itself included)

    def record(self) -> bytes:
        ref = self.ref.encode("utf-8")
        head = _HEAD.pack(_LAYOUT, self.below, self.depth, self.tokens_after, len(ref))
        return head + ref + dump_plain_json(self.as_dict())

    def as_dict(self) -> dict:
        # Not dataclasses.asdict: it deep-copies every field, which costs more than the rest of a turn.
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, value: dict) -> Summary:
        if "stack" in value:  # layout 1: the whole stack, its newest member this summary
            stack = value.pop("stack")
            del value["stack_tokens"], value["stack_refs"]
            value["below"], value["depth"] = (stack[-2] if len(stack) > 1 else NO_SUMMARY), len(stack)
        for name in ("replaced_summaries", "replaced_turns"):
            value[name] = tuple(value[name])
        return cls(**value)

    @classmethod
    def parse(cls, data: bytes) -> Summary:
        parsed = cache_of(PARSED_SUMMARIES)
        summary = parsed.get(data)
        if summary is None:
            summary = _parse(data)
            parsed.put(data, summary, _summary_bytes(data))
        return summary


# Summary records parsed, by their bytes: a Summary is immutable and a pure function of them, and
# the summary in force is parsed by every turn and every RecordSummary of its run (its JSON is most
# of such a call's decoding). A summary recorded here is put in with the bytes it was written as,
# so the next call of its run finds it parsed already (put in by a write that is then refused, it
# is found by those same bytes alone: no commit needs to come first).
PARSED_SUMMARIES = CacheSpec(
    "parsed_summaries", key="a summary record's bytes", valid="a parse is a pure function of the bytes",
    max_bytes=8 << 20)


def _summary_bytes(record: bytes) -> int:
    """A record's bytes kept as its key, and its parse (about three times its JSON)."""
    return 4 * len(record)


def _parse(data: bytes) -> Summary:
    if data[:1] == b"{":
        return Summary.from_dict(load_plain_json(data))
    return Summary.from_dict(load_plain_json(data[_HEAD.size + data[_HEAD.size - 1]:]))


@dataclass(frozen=True, slots=True)
class InForce:
    """One summary of a stack, as a turn needs it: where it is and what it feeds."""

    index: int
    below: int
    depth: int
    tokens: int  # its tokens_after
    ref: str


def _in_force(index: int, data: bytes) -> InForce:
    if data[:1] == b"{":
        summary = Summary.parse(data)
        return InForce(index, summary.below, summary.depth, summary.tokens_after, summary.ref)
    _, below, depth, tokens, ref_length = _HEAD.unpack_from(data)
    return InForce(index, below, depth, tokens, data[_HEAD.size:_HEAD.size + ref_length].decode("utf-8"))


# The summaries met walking down a run's stacks, by run (its key and incarnation), then by index:
# a summary record is written once and never changed (DeleteArtifact deletes its text, not it), so
# its place in the stack holds for as long as its run does, and a run deleted and made again is
# another incarnation. Every turn walks its stack as far as its window reaches (50 summaries in
# force: 112 µs a turn read from LMDB, two walks), and mostly the same summaries as the turn before.
WALKED = CacheSpec(
    "walked_summaries", key="run key and incarnation, then a summary's index",
    valid="a summary record is written once and never changed (DeleteArtifact deletes its text, not it) "
    "under its run's incarnation", max_bytes=8 << 20)
_IN_FORCE_BYTES = 250  # an InForce, its ref, its slot in the run's dict


def stack_down(txn: Txn, db: dict, key: bytes, top: Summary | None, incarnation: str) -> Iterator[InForce]:
    """The summaries in force once ``top`` is, newest first, as far as the caller goes: each
    read once per run (a fixed-size read), then kept (:data:`WALKED`)."""
    if top is None:
        return
    yield InForce(top.index, top.below, top.depth, top.tokens_after, top.ref)
    cache = cache_of(WALKED)
    walked = cache.get((key, incarnation))
    if walked is None or len(walked) > WALKED_PER_RUN:
        walked = {}
    read: dict[int, InForce] = {}  # what this walk read that was not kept
    record = None
    below = top.below
    try:
        while below != NO_SUMMARY:
            summary = walked.get(below) or read.get(below)
            if summary is None:
                record = record or summary_records(txn, db, key)
                summary = read[below] = _in_force(below, record(below))
            yield summary
            below = summary.below
    finally:  # the walk may stop anywhere: what it read is kept, measured again
        if read:
            # Kept once committed: a turn that records several summaries (a replay fork's) and is
            # refused leaves their indexes to the summaries recorded next.
            after_commit(_keep_walked, cache, (key, incarnation), walked, read)


def _keep_walked(cache: Cache, key: tuple[bytes, str], walked: dict[int, InForce], read: dict[int, InForce]) -> None:
    walked.update(read)
    cache.put(key, walked, len(walked) * _IN_FORCE_BYTES)


def fed_tokens(txn: Txn, db: dict, key: bytes, indexes: list[int]) -> int:
    """The tokens the summaries at ``indexes`` weigh in a window (each one's ``tokens_after``, what
    its entry is counted as), read from their records' fixed heads."""
    if not indexes:
        return 0
    record = summary_records(txn, db, key)
    return sum(_in_force(index, record(index)).tokens for index in indexes)


def newest_in_force(txn: Txn, db: dict, key: bytes, top: Summary | None, count: int,
                    incarnation: str) -> list[InForce]:
    """The newest ``count`` summaries in force once ``top`` is, oldest first."""
    return list(islice(stack_down(txn, db, key, top, incarnation), count))[::-1]


def feedable_tokens(txn: Txn, db: dict, key: bytes, top: Summary | None, budget: int, max_entries: int,
                    incarnation: str) -> tuple[int, ...]:
    """The counts of the newest summaries in force that a window of ``budget`` tokens and at most
    ``max_entries`` entries (0: no bound) could hold, oldest first: a window takes summaries newest
    first and stops at the first that does not fit, so none older than these can be in it, and
    the walk down the stack stops where the window must."""
    tokens: list[int] = []
    total = 0
    for summary in stack_down(txn, db, key, top, incarnation):
        if (max_entries and len(tokens) >= max_entries) or total + summary.tokens > budget:
            break
        total += summary.tokens
        tokens.append(summary.tokens)
    return tuple(reversed(tokens))


@dataclass(frozen=True, slots=True)
class Candidates:
    """What may be summarised at an iteration, and the built-in choice among it."""

    # Every event older than the recent turns, groups whole ("recursive": the summary in force first).
    ids: tuple[str, ...]
    tokens_before: int  # the ids' tokens
    # The tokens of the transcript no summary replaced yet (as fed: cleared results weigh their placeholder).
    unsummarised: int
    floor: int  # summarisable events are the host events of [floor, protect)
    protect: int
    # Of ``unsummarised``: what was appended after the summary in force was recorded (all of it
    # when none is), and what the active turn and the verbatim floor hold.
    since_summary: int = 0
    protected: int = 0
    cut: int = 0  # one past the last candidate: the floor once they are summarised
    left: int = 0  # the tokens of [cut, end): what a summary of the candidates leaves verbatim


def load_summary(txn: Txn, db: dict, key: bytes, index: int) -> Summary:
    return Summary.parse(summary_record(txn, db, key, index))


def last_summary_where(txn: Txn, db: dict, key: bytes, run: Run,
                       holds: Callable[[Summary], bool]) -> Summary | None:
    """The newest summary for which ``holds`` is true, where ``holds`` is true of a prefix of
    the summaries in recording order (their seqs and iterations never decrease): a binary search,
    O(log n) reads however many summaries the run has recorded since."""
    if run.summaries and holds(newest := load_summary(txn, db, key, run.summaries - 1)):
        return newest  # the usual case: the turn being assembled is the newest
    low, high, found = 0, run.summaries - 2, None
    while low <= high:
        middle = (low + high) // 2
        summary = load_summary(txn, db, key, middle)
        if holds(summary):
            found, low = summary, middle + 1
        else:
            high = middle - 1
    return found


def in_force(txn: Txn, db: dict, key: bytes, run: Run, iteration: int) -> Summary | None:
    """The newest summary recorded for an iteration <= ``iteration``: its stack stands in for
    every event below its ``to_seq``. None when no summary stands in yet."""
    return last_summary_where(txn, db, key, run, lambda summary: summary.iteration <= iteration)


def read_artifact(txn: Txn, db: dict, key: bytes, ref: str) -> bytes:
    """A summary's artifact: its entry as stored (a WindowEntry on the wire)."""
    data = artifact(txn, db, key, ref)
    if data is None:
        raise _unavailable(ref)
    return data


def read_artifacts(txn: Txn, db: dict, key: bytes, refs: list[str]) -> list[bytes]:
    """Several artifacts in one C-level pass (a window may feed dozens of summaries)."""
    found, missing = artifacts(txn, db, key, refs)
    if missing is not None:
        raise _unavailable(missing)
    return found


def _unavailable(ref: str) -> SummaryUnavailable:
    return SummaryUnavailable(f"the summary {ref!r} can no longer be read: its artifact was deleted",
                              metadata={"summary_ref": ref})


def summarized_payload(summary: Summary, token_counter: str) -> str:
    """The ``context.summarized`` payload, exactly RFC 0111's fields, in its order."""
    return dump_plain_json({"iteration": summary.iteration, "replacedTurns": summary.replaced_turns,
                            "summaryRef": summary.ref, "tokenCounter": token_counter,
                            "tokensBefore": summary.tokens_before, "tokensAfter": summary.tokens_after},
                           sort_keys=False).decode("ascii")


def write_summary(writer: LogWriter, summary: Summary, text: str, role: str, token_counter: str,
                  summarised_by: str) -> StoredEvent:
    """Persist the summary, its artifact, its ``context.summarized`` log entry and its
    compaction record (one txn): every entry has exactly one record."""
    txn, db, key = writer.txn, writer.db, writer.key
    put_artifact(txn, db, key, summary.ref, encode_record(summary.ref, summary.seq, summary.iteration, role,
                                                          SUMMARY_TYPE, "", text, summary.tokens_after, ""))
    record = summary.record()
    put_summary_record(txn, db, key, summary.index, record)
    cache_of(PARSED_SUMMARIES).put(record, summary, _summary_bytes(record))
    entry = StoredEvent(summary.seq, f"{SIDECAR_ID_PREFIX}{SUMMARIZED_TYPE}:{summary.index}", summary.iteration,
                        "system", SUMMARIZED_TYPE, summarized_payload(summary, token_counter), "", 0)
    append_compaction(writer, entry, "summary", summary.replaced_turns, summary.ref, summary.tokens_before,
                      summary.tokens_after, summarised_by)
    writer.run.summaries = summary.index + 1
    metrics.summary_recorded(summarised_by)
    return entry


def append_compaction(writer: LogWriter, entry: StoredEvent, kind: str, removed: tuple[str, ...], summary_ref: str,
                      tokens_before: int, tokens_after: int, by: str) -> None:
    """Append the sidecar's log ``entry`` and its compaction record. The entry's tokens are 0, and
    so is its count record: sums over the log's counts (the window's, the compaction signal's) add
    it in. Records are numbered by the entry's place among the run's log entries (summaries,
    clearings), so a page of them follows the log and a fork takes those below its seq."""
    index = writer.run.log_entries
    writer.append(entry, fastcore.NOT_A_UNIT)
    put_compaction_record(writer.txn, writer.db, writer.key, CompactionRecord(
        index, _task_id(writer), entry.iteration, int(time.time() * 1000), entry.seq, kind, removed, summary_ref,
        tokens_before, tokens_after, by))


# The run's task id by (run key, task digest): the task record a digest names never changes, and
# reading the id parses the whole record (the task, its skills, its sections).
TASK_IDS = CacheSpec("task_ids", key="run key and task digest",
                     valid="a record named by the digest of its content never changes", max_bytes=4 << 20)


def _task_id(writer: LogWriter) -> str:
    """The id of the run's task, the run's id when it has none (no task digest: no task record)."""
    key, digest = writer.key, writer.run.task_digest
    if digest:
        task_id = cache_of(TASK_IDS).get_or_make(
            (key, digest), lambda: stored_task_id(writer.txn, writer.db, key), lambda found: text_bytes(found, key))
        if task_id:
            return task_id
    return run_id_of(key)


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    iteration: int
    replaced_ids: tuple[str, ...]
    text: str
    strategy: str  # "" means the run's
    host_token_count: int | None = None

    def with_text(self, text: str) -> SummaryRequest:
        # Written out, not dataclasses.replace, which inspects the fields on every call.
        return SummaryRequest(self.iteration, self.replaced_ids, text, self.strategy, self.host_token_count)


def protected_from(deps: Deps, txn: Txn, key: bytes, run: Run, iteration: int,
                   counts: bytes, base_seq: int) -> int:
    """Where the verbatim floor starts for a summary in force from ``iteration``: the active
    turn and the last ``keep_last_turns`` turns, or the last ``keep_last_tokens`` tokens if that
    reaches further back. ``counts`` must hold the log from ``base_seq`` to its end."""
    settings = run.settings
    by_turns = prefix_end(txn, deps.db, key, run, iteration - max(settings.keep_last_turns, 1))
    by_tokens = base_seq + records_in(counts)
    total = 0
    while settings.keep_last_tokens and by_tokens > base_seq and total < settings.keep_last_tokens:
        by_tokens -= 1
        total += tokens_at(counts, base_seq, by_tokens)
    return min(by_turns, by_tokens)


def record_summary(deps: Deps, writer: LogWriter, request: SummaryRequest,
                   summarised_by: str = "host") -> tuple[Summary, StoredEvent, bool]:
    """Validate and record a host's summary; returns (summary, its log entry, created). A retry
    of a recorded summary (same range, same text) returns it with created False."""
    txn, db, key, run = writer.txn, writer.db, writer.key, writer.run
    strategy = _check_request(deps, run.settings, request)
    text_sha256 = hashlib.sha256(request.text.encode("utf-8")).hexdigest()
    existing = _retry_of(txn, db, key, run, request.replaced_ids, text_sha256)
    if existing is not None:
        return existing, read_event(txn, db, key, existing.seq), False
    iteration = _check_iteration(run, request.iteration)
    top = in_force(txn, db, key, run, iteration)
    replaced = _check_replaced(deps, txn, key, run, iteration, top, strategy, request.replaced_ids)
    summary = _new_summary(deps, run, request, strategy, text_sha256, iteration, top, replaced)
    entry = write_summary(writer, summary, request.text, deps.defaults.summary_role, run.settings.token_counter,
                          summarised_by)
    return summary, entry, True


@dataclass(frozen=True, slots=True)
class _Replaced:
    """What a summary replaces, checked: the newest summaries in force, then the oldest events
    not yet summarised, from the floor on."""

    summaries: list[InForce]  # oldest first
    refs: list[str]
    event_ids: list[str]
    seqs: list[int]  # the events'
    floor: int  # the first event no summary replaced yet
    counts: bytes  # the log's count records from the floor to its end


def _check_request(deps: Deps, settings: RunSettings, request: SummaryRequest) -> str:
    """The summary's strategy, once the request's own fields are valid."""
    if not settings.summarization:
        raise ValidationError.field("run_id", "the run does not accept summaries (OpenRun summarization_supported)")
    strategy = request.strategy or settings.summarization_strategy
    if strategy not in STRATEGIES:
        raise ValidationError.field("strategy", f"must be one of {', '.join(STRATEGIES)}")
    if not request.text:
        raise ValidationError.field("summary_text", "is required")
    check_text_bytes("summary_text", request.text, deps.defaults.max_event_bytes)
    if not request.replaced_ids:
        raise ValidationError.field("replaced_event_ids", "at least one event or summary is required")
    for i, replaced_id in enumerate(request.replaced_ids):
        check_id(f"replaced_event_ids[{i}]", replaced_id)
    return strategy


def _retry_of(txn: Txn, db: dict, key: bytes, run: Run, replaced_ids: tuple[str, ...],
              text_sha256: str) -> Summary | None:
    """The summary recorded already for exactly this range (the call is a retry), if any; a
    conflict when it was recorded with another text."""
    existing = _recorded_with(txn, db, key, run, replaced_ids)
    if existing is not None and existing.text_sha256 != text_sha256:
        raise Conflict.field("summary_text", f"this range is already summarised as {existing.ref!r}, with another text")
    return existing


def _check_iteration(run: Run, requested: int) -> int:
    iteration = check_at_least("iteration", requested, 1)
    if iteration < run.last_iteration or iteration <= run.last_assembled:
        raise ValidationError.field(
            "iteration", f"is {iteration}; a summary stands in from an iteration not yet assembled and not "
            f"before the log's last (assembled up to {run.last_assembled}, log at {run.last_iteration})")
    return iteration


def _check_replaced(deps: Deps, txn: Txn, key: bytes, run: Run, iteration: int, top: Summary | None, strategy: str,
                    replaced_ids: tuple[str, ...]) -> _Replaced:
    """What the summary replaces, naming every violation at once."""
    db = deps.db
    floor = top.to_seq if top else 0
    # Replaced summaries first (a suffix of the stack, in its order), then events from the floor.
    refs = [r for r in replaced_ids if r.startswith(REF_PREFIX)]
    event_ids = list(replaced_ids[len(refs):])
    violations = []
    if any(r.startswith(REF_PREFIX) for r in event_ids):
        violations.append(FieldViolation("replaced_event_ids", "replaced summaries must come before events"))
    summaries, wrong = _replaced_summaries(txn, db, key, top, strategy, refs, run.incarnation)
    violations += wrong
    counts = read_counts(txn, db, key, floor, run.next_seq)
    seqs, wrong = _replaced_events(txn, db, key, run, floor, event_ids, len(refs))
    violations += wrong
    if not violations and seqs:
        violations += _uncuttable(deps, txn, key, run, iteration, counts, floor, event_ids, seqs, len(refs))
    if violations:
        raise ValidationError("; ".join(f"{v.field}: {v.description}" for v in violations), tuple(violations))
    if not seqs and len(summaries) < 2:
        raise ValidationError.field("replaced_event_ids", "replacing summaries alone takes at least two of them")
    return _Replaced(summaries, refs, event_ids, seqs, floor, counts)


def _replaced_summaries(txn: Txn, db: dict, key: bytes, top: Summary | None, strategy: str,
                        refs: list[str], incarnation: str) -> tuple[list[InForce], list[FieldViolation]]:
    """The summaries ``refs`` name (the newest in force, oldest first), and what is wrong with them."""
    if not refs:
        return [], []
    replaced = newest_in_force(txn, db, key, top, len(refs), incarnation)
    if strategy not in STACKING_STRATEGIES:
        return replaced, [FieldViolation("replaced_event_ids[0]", f"only {' or '.join(STACKING_STRATEGIES)} "
                                         "summaries may replace summaries")]
    if [summary.ref for summary in replaced] != refs:
        # Named up to the refs' count: the whole stack may be long, and only its newest can be meant.
        shown = [summary.ref for summary in newest_in_force(txn, db, key, top, max(len(refs), 8), incarnation)]
        return replaced, [FieldViolation("replaced_event_ids[0]", "replaced summaries must be the newest "
                                         "ones in force, in order: " + (", ".join(shown) or "(none)"))]
    return replaced, []


def _replaced_events(txn: Txn, db: dict, key: bytes, run: Run, floor: int, event_ids: list[str],
                     first_field: int) -> tuple[list[int], list[FieldViolation]]:
    """The seqs of the events ``event_ids`` (found ones), and what is wrong with them: they must be
    the oldest not yet summarised, in order, without gaps. ``first_field``: the first one's place
    in replaced_event_ids."""
    units = _first_units(txn, db, key, floor, run.next_seq, len(event_ids))
    seqs: list[int] = []
    violations = []
    for position, event_id in enumerate(event_ids):
        field = f"replaced_event_ids[{first_field + position}]"
        seq = event_seq(txn, db, key, event_id)
        expected = units[position] if position < len(units) else None
        if seq is None:
            violations.append(FieldViolation(field, f"{event_id!r} is not an event of the run"))
            continue
        if seq != expected:
            violations.append(FieldViolation(
                field, f"{event_id!r} is not the next unsummarised event (the oldest events "
                "not yet summarised must be replaced in order, without gaps)"))
        seqs.append(seq)
    return seqs, violations


def _first_units(txn: Txn, db: dict, key: bytes, start: int, end: int, count: int) -> list[int]:
    """The seqs of the first ``count`` host events in ``[start, end)``, the sidecar's own entries
    (summaries recorded since) skipped: read no further than they reach, however long the log."""
    own = log_entries_from_seq(txn, db, key, start, end)
    next_own = next(own, end)
    units: list[int] = []
    seq = start
    while seq < end and len(units) < count:
        if seq == next_own:
            next_own = next(own, end)
        else:
            units.append(seq)
        seq += 1
    return units


def _uncuttable(deps: Deps, txn: Txn, key: bytes, run: Run, iteration: int, counts: bytes, floor: int,
                event_ids: list[str], seqs: list[int], first_field: int) -> list[FieldViolation]:
    """What keeps the log from being cut after the replaced events: an event in the verbatim
    floor or the active turn, or a tool call parted from its result."""
    protect = protected_from(deps, txn, key, run, iteration, counts, floor)
    violations = [FieldViolation(f"replaced_event_ids[{i}]", f"{event_id!r} is in the active turn "
                                 "or the keep_last_turns / keep_last_tokens floor")
                  for i, (event_id, seq) in enumerate(zip(event_ids, seqs), start=first_field) if seq >= protect]
    split = fastcore.splits_group(counts, floor, floor, seqs[-1] + 1)
    if split >= 0:
        partner = read_ids(txn, deps.db, key, split, split + 1)[0]
        violations.append(FieldViolation(f"replaced_event_ids[{first_field + len(seqs) - 1}]",
                                         f"the range splits a tool call from its result {partner!r}"))
    return violations


def _new_summary(deps: Deps, run: Run, request: SummaryRequest, strategy: str, text_sha256: str, iteration: int,
                 top: Summary | None, replaced: _Replaced) -> Summary:
    """The summary to record: it goes on the stack where the oldest summary it replaces was (or
    on top of the one in force)."""
    tokens_after = count_texts(deps.counters, run.settings.token_counter, [request.text], [request.host_token_count],
                               ["host_token_count"])[0]
    tokens_before = sum(tokens_at(replaced.counts, replaced.floor, seq) for seq in replaced.seqs)
    tokens_before += sum(summary.tokens for summary in replaced.summaries)
    below = replaced.summaries[0].below if replaced.summaries else (top.index if top else NO_SUMMARY)
    index = run.summaries
    return Summary(
        index=index, ref=f"{REF_PREFIX}{index}:{text_sha256[:12]}", seq=run.next_seq, iteration=iteration,
        from_seq=replaced.floor, to_seq=(replaced.seqs[-1] + 1) if replaced.seqs else replaced.floor,
        replaced_summaries=tuple(summary.index for summary in replaced.summaries),
        replaced_turns=tuple(replaced.refs) + tuple(replaced.event_ids), tokens_before=tokens_before,
        tokens_after=tokens_after, strategy=strategy, text_sha256=text_sha256, below=below,
        depth=(top.depth if top else 0) - len(replaced.summaries) + 1)


def _ref_index(ref: str) -> int | None:
    try:
        return int(ref[len(REF_PREFIX):].split(":", 1)[0])
    except ValueError:
        return None


def _recorded_with(txn: Txn, db: dict, key: bytes, run: Run,
                   replaced: tuple[str, ...]) -> Summary | None:
    """The summary already recorded for exactly these replaced turns, if any (a retry)."""
    first = replaced[0]
    if first.startswith(REF_PREFIX):
        index = _ref_index(first)
        candidates = range(index + 1, run.summaries) if index is not None else range(0)
    else:
        seq = event_seq(txn, db, key, first)
        if seq is None:
            return None
        # Summaries are recorded in seq order and each follows the events it replaced.
        candidates = range(run.summaries - 1, -1, -1)
        for index in candidates:
            summary = load_summary(txn, db, key, index)
            if summary.to_seq <= seq:
                return None
            if summary.replaced_turns == replaced:
                return summary
        return None
    for index in candidates:
        summary = load_summary(txn, db, key, index)
        if summary.replaced_turns == replaced:
            return summary
    return None


def candidates(deps: Deps, txn: Txn, key: bytes, run: Run, iteration: int, budget: int,
               top: Summary | None, end: int) -> Candidates:
    """What the built-in policy would summarise: every event older than the recent turns
    (:func:`recent_from`) and the verbatim floor, groups whole, and, for ``recursive``, the
    summary in force first. As far as that, no further: the window then holds the summary and
    the recent turns, near trim_to_fraction of the budget; and no less: a summary is fed only
    with every event after it, so one that left older events out of the window beside it would
    not be fed."""
    floor = top.to_seq if top else 0
    counts = read_counts(txn, deps.db, key, floor, end)
    verbatim = protected_from(deps, txn, key, run, iteration, counts, floor)
    protect = min(verbatim, recent_from(run.settings, counts, floor, iteration, budget))
    cut, tokens_before, unsummarised = fastcore.compaction_cut(counts, floor, floor, protect, MAX_TOKENS, True)
    since_summary = _tokens_between(counts, floor, top.seq + 1, end) if top else unsummarised
    protected = _tokens_between(counts, floor, max(verbatim, floor), end)
    ids = tuple(host_event_ids(txn, deps.db, key, floor, cut))
    if ids and top and run.settings.summarization_strategy == "recursive":
        return Candidates((top.ref, *ids), tokens_before + top.tokens_after, unsummarised, floor, protect,
                          since_summary, protected, cut, unsummarised - tokens_before)
    return Candidates(ids, tokens_before, unsummarised, floor, protect, since_summary, protected, cut,
                      unsummarised - tokens_before)


def kept_turns(settings: RunSettings) -> int:
    """The turns a window always keeps when they fit the budget: the last keep_last_turns, the
    active one among them."""
    return max(settings.keep_last_turns, 1)


def recent_from(settings: RunSettings, counts: bytes, base_seq: int, iteration: int, budget: int) -> int:
    """Where the recent turns of ``iteration`` start: its last keep_last_turns turns (itself among
    them) and the older whole turns that fit with them in trim_to_fraction of ``budget``, as fed
    now. ``counts`` hold the log from ``base_seq`` (the floor) to its end."""
    recent = fastcore.recent_start(counts, base_seq, iteration, kept_turns(settings),
                                   int(settings.trim_to_fraction * budget), base_seq)
    assert recent is not None  # the counts begin at the floor, below which nothing is a turn's
    return recent


def _tokens_between(counts: bytes, base_seq: int, start: int, end: int) -> int:
    """The tokens of the entries of ``[start, end)`` in ``counts`` (which begin at ``base_seq``).
    The sidecar's own log entries there (``context.summarized``, ``context.cleared``) are summed
    too, at the 0 tokens their count records hold: :func:`append_compaction` writes them with none
    and nothing recounts them (only a host event's form does), so the sum is the host events' as fed."""
    return sum(tokens_at(counts, base_seq, seq) for seq in range(max(start, base_seq), end))


def tokens_of(deps: Deps, txn: Txn, key: bytes, top: Summary | None, ids: tuple[str, ...]) -> int:
    """The tokens of a range to summarise: the summary in force's, then each event's."""
    total = 0
    for replaced in ids:
        if top is not None and replaced == top.ref:
            total += top.tokens_after
            continue
        total += event_by_id(txn, deps.db, key, replaced).tokens
    return total


def extractive_summary(deps: Deps, txn: Txn, key: bytes, run: Run, candidate_ids: tuple[str, ...],
                       tokens_before: int, budget: int) -> str | None:
    """The built-in summariser: deterministic and extractive, the first line of each replaced
    entry, clipped to a quarter of what it replaces (at most an eighth of the budget). None when
    it could not be shorter than what it replaces."""
    counter = deps.counters.get(run.settings.token_counter)
    bound = max(32, min(tokens_before // 4, budget // 8))
    if bound >= tokens_before:
        return None
    lines = [f"Summary of {len(candidate_ids)} earlier transcript entries (extractive):"]
    for replaced in candidate_ids:
        if replaced.startswith(REF_PREFIX):
            event = decode_event(read_artifact(txn, deps.db, key, replaced))
        else:
            event = event_by_id(txn, deps.db, key, replaced)
        if is_fenced(event.content):
            # Untrusted content stays inside its block: a summary is fed as the sidecar's own text.
            first_line = f"({event.tokens} tokens of untrusted data)"
        else:
            first_line = event.content.strip().split("\n", 1)[0][:160]
        lines.append(f"- {event.role}/{event.type}: {first_line}")
    return counter.clip("\n".join(lines), bound)
