"""The caches change nothing but speed: a varied workload (tool turns with clearing, host and
built-in summaries, replay and branch forks, re-assemblies of old iterations in every render
form, DeleteArtifact, a restart half-way) played against a sidecar with its caches on and one with
``[cache] enabled = false`` gets the same answers, byte for byte, refusals included.

And what the caches rest on (docs/caches.md): a record written under a run's incarnation never
changes, except artifacts and re-chosen windows. The stores are read record by record at the
restart and at the end: every record of the first reading is there at the end with the same
bytes, except those kinds (and the run records, the counts windows are chosen by, the chunks of
ids that grow at their end, and a replay fork's progress: records no cache keeps)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import lmdb
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.storage.databases import AREAS
from tests.helpers import Sidecar, open_full, tool_turn

FLAGS = ("--token-counter", "o200k_base", "--transcript-token-budget", "12000", "--summarization",
         "--clearing-clear-at-least-tokens", "1500", "--clearing-keep-recent", "1")
KINDS = {"host": (*FLAGS, "--summariser", "none"), "built-in": (*FLAGS, "--summariser", "extractive")}
RENDERS = ("", "anthropic_messages", "openai_responses")
# Records rewritten or deleted by design, none of which a cache keeps: the run record, a window
# chosen again, a summary's text (DeleteArtifact), a replay fork's progress, the counts a window
# is chosen by (a cleared result weighs its placeholder from then on). Chunks of ids grow at their end.
CHANGING = {b"runs", b"windows", b"artifacts", b"replay", b"counts"}
GROWING = {b"id_chunks"}
SUMMARY_REF = "sidecar:summary:"


def call(answers: list, name: str, method: Callable, request: object) -> object:
    """``method(request)``; its answer's bytes (or its refusal: code and message) kept in ``answers``."""
    try:
        answer = method(request)
    except grpc.RpcError as error:
        answers.append((name, error.code().name, error.details()))
        return None
    answers.append((name, answer.SerializeToString(deterministic=True)))
    return answer


def turns(stub, answers: list, run_id: str, first: int, last: int, summaries: list[str]) -> None:
    """Tool turns ``first``..``last`` (each asked in a render form in turn); the host records a
    summary of the candidates whenever one is due (the built-in summariser records its own)."""
    for turn in range(first, last + 1):
        events = tool_turn(turn)
        answer = call(answers, f"{run_id} turn {turn}", stub.AssembleContext, pb.AssembleContextRequest(
            run_id=run_id, iteration=turn, append_events=events, render=RENDERS[turn % 3]))
        if answer is None:
            continue
        summaries += [ref for ref in answer.event_ids if ref.startswith(SUMMARY_REF) and ref not in summaries]
        if answer.compaction.due and answer.compaction.candidate_event_ids:
            recorded = call(answers, f"{run_id} summary {turn}", stub.RecordSummary, pb.RecordSummaryRequest(
                run_id=run_id, iteration=turn + 1, replaced_event_ids=answer.compaction.candidate_event_ids,
                summary_text=f"Summary of turns up to {turn}: searched, read files, answered."))
            if recorded is not None and recorded.summary_ref not in summaries:
                summaries.append(recorded.summary_ref)


def again(stub, answers: list, run_id: str, iterations: range) -> None:
    """Old iterations assembled again in every render form, and their windows read back."""
    for iteration in iterations:
        for render in RENDERS:
            call(answers, f"{run_id} again {iteration} {render}", stub.AssembleContext,
                 pb.AssembleContextRequest(run_id=run_id, iteration=iteration, render=render))
        call(answers, f"{run_id} window {iteration}", stub.GetTranscriptWindow,
             pb.GetTranscriptWindowRequest(run_id=run_id, iteration=iteration))


def first_half(stub, answers: list, summaries: list[str]) -> None:
    open_full(stub, "source", summarization_supported=True, keep_last_turns=1)
    turns(stub, answers, "source", 1, 12, summaries)
    again(stub, answers, "source", range(2, 12, 3))
    for mode in ("replay", "branch"):  # forks from a seq inside the summarised part, fed the same turns
        call(answers, f"fork {mode}", stub.ForkRun, pb.ForkRunRequest(
            source_run_id="source", from_seq=9, mode=mode, new_run_id=mode))
        turns(stub, answers, mode, 3, 8, [])
    if summaries:
        call(answers, "delete artifact", stub.DeleteArtifact,
             pb.DeleteArtifactRequest(run_id="source", artifact_id=summaries[0]))
    again(stub, answers, "source", range(2, 13, 2))
    again(stub, answers, "replay", range(3, 9, 2))


def second_half(stub, answers: list, summaries: list[str]) -> None:
    again(stub, answers, "source", range(3, 13, 3))
    turns(stub, answers, "source", 13, 18, summaries)
    turns(stub, answers, "replay", 9, 14, [])
    if len(summaries) > 1:
        call(answers, "delete artifact 2", stub.DeleteArtifact,
             pb.DeleteArtifactRequest(run_id="source", artifact_id=summaries[-1]))
    again(stub, answers, "source", range(1, 19, 4))
    turns(stub, answers, "branch", 9, 12, [])


def records(folder: Path) -> dict[tuple[bytes, bytes], bytes]:
    """Every record of the runs' databases, by (database, key)."""
    names = AREAS["runs"] + AREAS["run_context"]
    env = lmdb.open(str(folder), readonly=True, lock=False, max_dbs=64, subdir=True)
    try:
        found = {}
        with env.begin() as txn:
            for name in names:
                try:
                    db = env.open_db(name, txn=txn, create=False)
                except lmdb.NotFoundError:
                    continue
                found.update({(name, key): value for key, value in txn.cursor(db)})
        return found
    finally:
        env.close()


def changed(before: dict[tuple[bytes, bytes], bytes], after: dict[tuple[bytes, bytes], bytes]) -> list[str]:
    """The records of ``before`` that ``after`` holds otherwise, but for those that change by design."""
    wrong = []
    for (name, key), value in before.items():
        now = after.get((name, key))
        if now == value or name in CHANGING or (name in GROWING and now is not None and now.startswith(value)):
            continue
        wrong.append(f"{name.decode()} {key!r}: {'deleted' if now is None else 'rewritten'}")
    return wrong


@pytest.mark.parametrize("kind", KINDS)
def test_caches_on_and_off_answer_alike_and_records_never_change(tmp_path: Path, kind: str) -> None:
    played: dict[str, list] = {}
    readings: dict[str, list[dict]] = {}
    for cache in ("on", "off"):
        folder = tmp_path / cache
        folder.mkdir()
        flags = (*KINDS[kind], "--cache" if cache == "on" else "--no-cache")
        answers: list = []
        summaries: list[str] = []
        sidecar = Sidecar(folder, *flags)
        try:
            first_half(sidecar.stub, answers, summaries)
        finally:
            sidecar.stop()
        readings[cache] = [records(sidecar.data)]
        sidecar = Sidecar(folder, *flags)  # restarted on the same store: nothing kept in memory
        try:
            second_half(sidecar.stub, answers, summaries)
        finally:
            sidecar.stop()
        readings[cache].append(records(sidecar.data))
        played[cache] = answers
    on, off = played["on"], played["off"]
    assert [answer[0] for answer in on] == [answer[0] for answer in off]
    for with_caches, without in zip(on, off, strict=True):
        assert with_caches == without, with_caches[0]
    # The workload did what it is for: summaries fed, refusals seen, forks and re-assemblies answered.
    names = " ".join(answer[0] for answer in on)
    assert "delete artifact" in names and "fork replay" in names and " again " in names
    assert any(" summary " in answer[0] for answer in on) or kind == "built-in"
    assert any(len(answer) == 3 for answer in on)  # a refusal among them
    assert any(SUMMARY_REF.encode() in answer[1] for answer in on if len(answer) == 2)  # summaries fed
    for cache in ("on", "off"):
        before, after = readings[cache]
        assert changed(before, after) == []


def test_a_record_rewritten_or_deleted_is_reported_and_one_changing_by_design_is_not() -> None:
    before = {(b"events", b"1"): b"a", (b"events", b"2"): b"b", (b"id_chunks", b"1"): b"x",
              (b"fed_forms", b"1"): b"f", (b"artifacts", b"1"): b"t", (b"windows", b"1"): b"w"}
    after = {(b"events", b"1"): b"a", (b"events", b"2"): b"B", (b"id_chunks", b"1"): b"x\x00y",
             (b"windows", b"1"): b"w2"}
    assert changed(before, after) == ["events b'2': rewritten", "fed_forms b'1': deleted"]
