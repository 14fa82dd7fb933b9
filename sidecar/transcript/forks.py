"""Forks of a run (``replay`` and ``branch``), and removing runs and artifacts.

A fork carries the source's log below ``from_seq`` (events, summaries with their artifacts, the
windows of the iterations entirely below it) and the source's settings. A replay fork also
carries, as *pending*, every summary the source recorded at or after ``from_seq`` (RFC 0111:
"the host MUST reuse the recorded summary and MUST NOT re-summarize"). When the replaying host
reaches the point of the log where the source recorded one, the fork records that same summary
(same ref, same replaced turns, same text): before the next host event that came after it, at
an AssembleContext of its iteration or later, or when the host asks RecordSummary for that
range. It reuses them only while the host replays the source exactly: the fork also carries a
fingerprint of each other log entry from ``from_seq`` to the source's last summary (the host's
events, and the sidecar's clearings with the results each cleared), and every entry the fork
appends is held against the one at its seq. From the first that differs (another id, content,
role, type, call, tool or iteration, another clearing or another summary), the fork stops
replaying and from then on behaves as a branch: its host's summaries are recorded as written.
While it replays, the fork does not decide clearings itself (``[context.clearing]`` is the
sidecar's setting, not the run's, and may have changed): it clears the results the source
cleared, at the assembly of the same iteration, once that assembly kept its clips.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from sidecar.context_window import schema as run_context_schema
from sidecar.errors import Conflict, NotFound, SummaryUnavailable, ValidationError
from sidecar.storage.codec import StoredEvent, decode_event
from sidecar.storage.keys import Txn, records_under, sweep
from sidecar.transcript import clearing
from sidecar.transcript.log import LogWriter, NewEvent, host_event_ids, log_entries_before
from sidecar.transcript.runs import SIDECAR_ID_PREFIX, Deps, ForkOrigin, Run, load_run, require_run, save_run
from sidecar.transcript.schema import (
    WindowRecord,
    copy_compaction_records,
    copy_log,
    copy_under,
    delete_replay,
    drop_artifact,
    drop_replay,
    first_replay,
    put_artifact,
    put_replay,
    put_summary_record,
    read_event,
    read_records,
)
from sidecar.transcript.summaries import Summary, in_force, load_summary, newest_in_force, read_artifact, write_summary
from sidecar.validation import check_at_least

MODES = ("replay", "branch")


def fork_run(deps: Deps, txn: Txn, source_key: bytes, source_run_id: str, fork_key: bytes,
             fork_run_id: str, from_seq: int, mode: str) -> tuple[Run, bool]:
    """Create the fork in the caller's transaction; (its run, created). Forking again with the
    same source, from_seq and mode returns the existing fork."""
    db = deps.db
    if mode not in MODES:
        raise ValidationError.field("mode", f"must be one of {', '.join(MODES)}")
    check_at_least("from_seq", from_seq, 0)
    source = require_run(txn, db, source_key, source_run_id)
    if from_seq > source.next_seq:
        raise ValidationError.field("from_seq", f"is {from_seq}; the source's log ends at {source.next_seq}")
    origin = ForkOrigin(source_run_id, from_seq, mode)
    existing = load_run(txn, db, fork_key)
    if existing is not None:
        if existing.origin == origin:
            return existing, False
        raise Conflict.field("new_run_id", "names a run that already exists")

    summaries = [load_summary(txn, db, source_key, index) for index in range(source.summaries)]
    carried = [s for s in summaries if s.seq < from_seq]
    pending = [s for s in summaries if s.seq >= from_seq] if mode == "replay" else []
    artifacts = {}
    for summary in carried + pending:
        try:
            artifacts[summary.ref] = read_artifact(txn, db, source_key, summary.ref)
        except SummaryUnavailable:
            raise SummaryUnavailable(
                f"the source's summary {summary.ref!r} (recorded at seq {summary.seq}) can no longer be read, so a "
                f"{mode} from seq {from_seq} cannot reproduce the source's windows",
                metadata={"from_seq": str(from_seq), "summary_ref": summary.ref}) from None

    copy_log(txn, db, source_key, fork_key, from_seq)
    for summary in carried:
        put_summary_record(txn, db, fork_key, summary.index, summary.record())
        put_artifact(txn, db, fork_key, summary.ref, artifacts[summary.ref])
    # A compaction record per log entry carried (summaries, clearings), and the forms those fed.
    copy_compaction_records(txn, db, source_key, fork_key, from_seq)
    for summary in pending:
        artifact = decode_event(artifacts[summary.ref])
        put_replay(txn, db, fork_key, summary.seq, json.dumps({
            "summary": summary.as_dict(), "text": artifact.content, "role": artifact.role,
            "counter": source.settings.token_counter}).encode("utf-8"))
    if pending:
        # The source's other entries up to its last summary (host events, clearings), each keyed by
        # its seq like the summaries between them: a summary is reused only after the fork appended
        # exactly these.
        summary_seqs = {summary.seq for summary in pending}
        for seq, raw in enumerate(read_records(txn, db, source_key, from_seq, pending[-1].seq), start=from_seq):
            if seq not in summary_seqs:
                entry = decode_event(raw)
                value: dict = {"host": _fingerprint(entry)}
                if entry.type == clearing.CLEARED_TYPE and entry.event_id.startswith(SIDECAR_ID_PREFIX):
                    # Which results the source cleared, at which iteration: the fork clears them again.
                    payload = json.loads(entry.content)
                    value = {"cleared": {"iteration": payload["iteration"], "event_ids": payload["eventIds"],
                                         "entry": _fingerprint(entry)}}
                put_replay(txn, db, fork_key, seq, json.dumps(value).encode("utf-8"))

    limit = read_event(txn, db, source_key, from_seq).iteration if from_seq < source.next_seq else None

    def carried_iteration(suffix: bytes, _: bytes) -> bool:
        return limit is None or int.from_bytes(suffix, "big") < limit

    copied = copy_under(txn, db["windows"], source_key, fork_key, carried_iteration)
    # A replay is fed the source's windows: where the source found the provider's cache cold
    # (a pause longer than its TTL), the fork takes the same steps, however long its host pauses.
    source_cold = tuple(int.from_bytes(suffix, "big") for suffix, value in records_under(txn, db["windows"], source_key)
                        if mode == "replay" and not carried_iteration(suffix, value) and b'"cold"' in value
                        and (WindowRecord.parse(value).context or {}).get("cold"))
    # What the run feeds besides its log (its run context area's records): the fork starts from
    # the source's profile, task and data as they stand, and the usage of the iterations it carries.
    run_context_schema.copy_to_fork(txn, db, source_key, fork_key, carried_iteration)
    last_assembled = max((int.from_bytes(suffix, "big") for suffix in copied), default=0)
    clearing.fork_forms(txn, db, source_key, fork_key, from_seq, last_assembled)
    last_iteration = read_event(txn, db, source_key, from_seq - 1).iteration if from_seq else 0
    fork = Run(source.settings, from_seq, last_iteration, last_assembled, len(carried), len(pending), origin,
               log_entries=log_entries_before(txn, db, source_key, source, from_seq),
               profile_digest=source.profile_digest, task_digest=source.task_digest, fed_prefix=source.fed_prefix,
               source_cold=source_cold, source_assembled=source.last_assembled if mode == "replay" else 0,
               cleared_at=source.cleared_at if source.cleared_at <= last_assembled else 0)
    save_run(txn, db, fork_key, fork)
    return fork, True


def delete_run(txn: Txn, db: dict, key: bytes, run_id: str) -> None:
    """Remove the run and everything under its key in the run's own databases (log, indexes,
    windows, summaries, artifacts, its context): ``db`` holds those and no other area's."""
    require_run(txn, db, key, run_id)
    sweep(txn, db, key)


def delete_artifact(txn: Txn, db: dict, key: bytes, run_id: str, artifact_id: str) -> None:
    require_run(txn, db, key, run_id)
    if not drop_artifact(txn, db, key, artifact_id):
        raise NotFound(f"artifact {artifact_id!r} of run {run_id!r} not found")


# -- replay ----------------------------------------------------------------------------------

def before_host_event(deps: Deps, writer: LogWriter, event: NewEvent) -> None:
    """Record the source's summaries that came, in the source's log, before this event; then
    hold the event against the source's at its seq: the first that differs ends the replay."""
    while writer.run.replay_pending:
        found = _source_at(writer)
        if found is None:
            return
        if isinstance(found, _Cleared):  # the source cleared results here, at an assembly the host skipped
            _stop_replaying(writer)
            return
        if isinstance(found, str):
            if found != _fingerprint(event):
                _stop_replaying(writer)
                return
            delete_replay(writer.txn, writer.db, writer.key, writer.run.next_seq)
            return
        if found[0].iteration > event.iteration:  # the source's events after it are of its iteration or later
            _stop_replaying(writer)
            return
        if _apply(deps, writer, found) is None:
            return


def at_assembly(deps: Deps, writer: LogWriter, iteration: int, clear: bool = False) -> bool:
    """Record the source's summaries due at or before ``iteration`` here, and with ``clear`` its
    clearings too (once the assembly kept its clips, as the source's had when it cleared); True
    if a summary was recorded."""
    applied = False
    while writer.run.replay_pending:
        found = _source_at(writer)
        if isinstance(found, _Cleared):
            if not clear or found.iteration > iteration or not _clear_again(deps, writer, found):
                break
        elif isinstance(found, tuple) and found[0].iteration <= iteration:
            if _apply(deps, writer, found) is None:
                break
            applied = True
        else:
            break
    return applied


def decides_clearings(writer: LogWriter) -> bool:
    """Whether the run decides at this assembly which tool results to clear: not while it
    replays a source whose clearings it carries (``at_assembly`` makes them); a fork made before
    clearings were carried (its records name the source's entries by fingerprint alone) decides,
    as its source did, and ``after_own_entries`` holds what it clears against the source's."""
    if not writer.run.replay_pending:
        return True
    found = first_replay(writer.txn, writer.db, writer.key)
    return found is not None and found[0] == writer.run.next_seq and "event" in json.loads(found[1])


def after_own_entries(writer: LogWriter, first_seq: int) -> None:
    """Hold the sidecar's own log entries appended from ``first_seq`` (the clearing of a fork
    that decides its own, ``decides_clearings``) against the source's at their seqs, as a host
    event is held: the same entry passes, another ends the replay."""
    txn, db, key = writer.txn, writer.db, writer.key
    for seq in range(first_seq, writer.run.next_seq):
        found = first_replay(txn, db, key) if writer.run.replay_pending else None
        if found is None or found[0] > seq:
            return  # nothing carried for it: past the source's last summary
        if found[0] < seq or json.loads(found[1]).get("event") != _fingerprint(read_event(txn, db, key, seq)):
            _stop_replaying(writer)  # the source had a summary or a host event here
            return
        delete_replay(txn, db, key, seq)


def recorded_for(deps: Deps, writer: LogWriter, replaced: tuple[str, ...]) -> tuple[Summary, StoredEvent] | None:
    """A RecordSummary in a replay fork: the source's summary for this range and its log entry,
    recorded again as they were (the host's new text is not stored), or None when the host
    departs from the source."""
    if not writer.run.replay_pending:
        return None
    pending = _pending_at(writer)
    if pending is None or pending[0].replaced_turns != replaced:
        _stop_replaying(writer)
        return None
    entry = _apply(deps, writer, pending)
    return (pending[0], entry) if entry is not None else None


def _fingerprint(event: StoredEvent | NewEvent) -> str:
    """Every field of a host event that the source's windows were made of (its content as
    stored: redacted and, when untrusted, fenced; the count follows from it and the counter)."""
    fields = [event.event_id, event.iteration, event.role, event.type, event.content, event.call_id, event.tool_name]
    return hashlib.sha256(json.dumps(fields).encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class _Cleared:
    """A clearing the source recorded: the results it cleared from ``iteration`` on, and its
    log entry's fingerprint."""

    iteration: int
    event_ids: list[str]
    fingerprint: str


def _pending_at(writer: LogWriter) -> tuple[Summary, dict] | None:
    """The source's summary due at the fork's next seq, if any."""
    found = _source_at(writer)
    return found if isinstance(found, tuple) else None


def _source_at(writer: LogWriter) -> str | _Cleared | tuple[Summary, dict] | None:
    """What the source's log holds at the fork's next seq: a host event's fingerprint, a clearing,
    a summary (with its text), or None when nothing is carried for it (past the source's last
    summary, or a fork made before fingerprints were carried). A record the fork already passed
    (its log grew otherwise than the source's) ends the replay."""
    found = first_replay(writer.txn, writer.db, writer.key)
    if found is None:
        return None
    seq, stored = found
    if seq < writer.run.next_seq:
        _stop_replaying(writer)
        return None
    if seq > writer.run.next_seq:
        return None
    value = json.loads(stored)
    if "host" in value:
        return value["host"]
    if "cleared" in value:
        cleared = value["cleared"]
        return _Cleared(cleared["iteration"], cleared["event_ids"], cleared["entry"])
    if "event" in value:  # made before clearings were carried: a host event's or a clearing's
        return value["event"]
    return Summary.from_dict(value.pop("summary")), value


def _apply(deps: Deps, writer: LogWriter, pending: tuple[Summary, dict]) -> StoredEvent | None:
    """Record the pending summary as the source did; its log entry, or None (and the fork stops
    replaying) when the fork's log no longer matches the source's."""
    summary, value = pending
    writer.flush()  # the checks below read the log as it stands
    if not _still_replaying(writer, summary):
        _stop_replaying(writer)
        return None
    delete_replay(writer.txn, writer.db, writer.key, summary.seq)
    writer.run.replay_pending -= 1
    return write_summary(writer, summary, value["text"], value["role"], value["counter"], "replay")


def _clear_again(deps: Deps, writer: LogWriter, cleared: _Cleared) -> bool:
    """Clear the results the source cleared, as it did; False (and the fork stops replaying)
    when the clearing's log entry is not the source's (the results weighed otherwise)."""
    txn, db, key, seq = writer.txn, writer.db, writer.key, writer.run.next_seq
    writer.flush()  # the clearing weighs the results as their counts now stand
    delete_replay(txn, db, key, seq)
    clearing.clear_as_recorded(deps, writer, cleared.iteration, cleared.event_ids)
    if _fingerprint(read_event(txn, db, key, seq)) != cleared.fingerprint:
        _stop_replaying(writer)
        return False
    return True


def _still_replaying(writer: LogWriter, summary: Summary) -> bool:
    """The fork's log is the source's where the summary is concerned: same position, same next
    summary, the same summaries in force, the same events replaced."""
    txn, db, key, run = writer.txn, writer.db, writer.key, writer.run
    if summary.seq != run.next_seq or summary.index != run.summaries:
        return False
    top = in_force(txn, db, key, run, summary.iteration)
    if (top.to_seq if top else 0) != summary.from_seq:
        return False
    newest = newest_in_force(txn, db, key, top, len(summary.replaced_summaries), run.incarnation)
    if tuple(replaced.index for replaced in newest) != summary.replaced_summaries:
        return False
    ids = host_event_ids(txn, db, key, summary.from_seq, summary.to_seq)
    return tuple(ids) == summary.replaced_turns[len(summary.replaced_summaries):]


def _stop_replaying(writer: LogWriter) -> None:
    """The host departed from the source: drop what is pending; the fork is a branch now."""
    drop_replay(writer.txn, writer.db, writer.key)
    writer.run.replay_pending = 0
