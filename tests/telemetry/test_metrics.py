"""Metrics ([metrics] listen): a real sidecar process scraped over HTTP before and after calls,
each figure moving by exactly what the calls imply, no label naming a run, ref, secret or text;
/metrics refused beyond loopback unless allowed, and nothing listening with metrics off. In the
process itself: each server's figures in its own registry, a write's figures counted once it
commits, the background job's rounds and failures."""

from __future__ import annotations

import collections
import importlib.metadata
import os
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import lmdb
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.caching import DECLARED
from sidecar.memory.compaction import BackgroundJob
from sidecar.storage.environment import Store
from sidecar.telemetry import metrics
from sidecar.telemetry.metrics import Metrics
from sidecar.text.redaction import DETECTORS
from tests.helpers import DETECTED, CommitsSeen, Sidecar, call_error, filler, listening_ports, run_cli, tool_turn

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
RUN, TOOL_RUN, REF, SECRETS_REF = "metrics-run-7f3a", "metrics-tools-51c2", "notes-9c1e", "vault-e0d4"
SECRET_ID, SECRET_VALUE = "vault-password-id", "correct-horse-battery-staple"
METHODS = set(pb.DESCRIPTOR.services_by_name["ContextSidecar"].methods_by_name)
KINDS = {kind for kind, _ in DETECTORS} | {"bearer_token", "byok", "registered"}
REASONS = {"first_turn", "render_changed", "profile", "task_changed", "skill_loaded", "skill_unloaded",
           "summary_recorded", "summary_slid_out", "window_start_moved", "tool_results_cleared", "cache_expired",
           "history_changed"}
RUNNING = {"version": importlib.metadata.version("context-sidecar"),  # the sidecar process's, as it runs here
           "python": ".".join(str(part) for part in sys.version_info[:3]), "grpc": grpc.__version__}
LABEL_VALUES = {"method": METHODS, "code": {code.name for code in grpc.StatusCode}, "kind": KINDS,
                "reason": REASONS, "by": {"host", "built-in", "plugin", "replay"},
                "trigger": {"client-requested", "host-managed"}, "job": {"memory_compaction"},
                "cache": set(DECLARED), **{label: {running} for label, running in RUNNING.items()}}


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        return answer.read().decode("utf-8")


def parse(text: str) -> Samples:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape(url: str) -> Samples:
    return parse(scrape_text(url))


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def rpc_count(samples: Samples, method: str, code: str = "OK") -> float:
    return value(samples, "context_sidecar_rpc_duration_seconds_count", method=method, code=code)


def until(condition, what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.05)


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1].split("/")[0])


# A real sidecar, scraped.

def test_a_scraped_sidecar_counts_what_its_calls_did(tmp_path: Path) -> None:
    sidecar = Sidecar(tmp_path, "--metrics-listen", "127.0.0.1:0", "--compaction-enabled",
                      "--compaction-interval-seconds", "3600")
    try:
        stub = sidecar.stub
        assert sidecar.metrics_url.startswith("http://127.0.0.1:") and sidecar.metrics_url.endswith("/metrics")
        before = scrape(sidecar.metrics_url)
        assert value(before, "context_sidecar_store_map_size_bytes") == 1 << 30  # [storage] map_size
        assert value(before, "context_sidecar_store_max_map_size_bytes") == 0
        used_before = value(before, "context_sidecar_store_used_bytes")
        assert 0 < used_before <= 1 << 30

        # Turns of a run that accepts summaries, one host summary, and a tool-heavy run that clears.
        answers: list[pb.AssembleContextResponse] = []
        stub.OpenRun(pb.OpenRunRequest(run_id=RUN, summarization_supported=True, transcript_token_budget=4000))
        for turn in range(1, 7):
            answers.append(stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=turn, append_events=[
                pb.Event(event_id=f"u{turn}", role="user", content=f"Turn {turn}: what does clause {turn} say?"),
                pb.Event(event_id=f"a{turn}", role="assistant", content=f"Clause {turn} says {turn * 7} days.")])))
        summary = stub.RecordSummary(pb.RecordSummaryRequest(run_id=RUN, iteration=7, replaced_event_ids=[
            "u1", "a1", "u2", "a2"], summary_text="Clauses 1 and 2 give 7 and 14 days."))
        assert summary.created
        answers.append(stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=7, append_events=[
            pb.Event(event_id="u7", role="user", content="And clause 7?")])))
        answers.append(stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=7)))  # again: as fed
        stub.OpenRun(pb.OpenRunRequest(run_id=TOOL_RUN, transcript_token_budget=16_000))
        for turn in range(1, 21):
            answers.append(stub.AssembleContext(pb.AssembleContextRequest(run_id=TOOL_RUN, iteration=turn,
                                                                          append_events=tool_turn(turn))))
        assert call_error(stub.AssembleContext, pb.AssembleContextRequest(run_id=RUN, iteration=0))[0] == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert call_error(stub.GetTranscriptWindow, pb.GetTranscriptWindowRequest(run_id="nowhere-3b9d",
                                                                                  iteration=1))[0] == \
            grpc.StatusCode.NOT_FOUND

        # Secrets of two detector kinds and a registered one, in a memory entry.
        stub.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id=SECRET_ID, value=SECRET_VALUE)]))
        planted = stub.PutMemory(pb.PutMemoryRequest(memory_ref=SECRETS_REF, content=(
            f"keys: {DETECTED['openai_api_key']} and {DETECTED['openai_api_key']}, "
            f"{DETECTED['aws_access_key_id']}; the vault: {SECRET_VALUE}")))
        assert set(planted.redacted_secret_ids) == {"openai_api_key", "aws_access_key_id", SECRET_ID}
        # A memory compaction of three entries, watched.
        watch = stub.WatchEvents(pb.WatchEventsRequest())
        watch.initial_metadata()  # the watch is open
        watching = scrape(sidecar.metrics_url)
        ids = [stub.PutMemory(pb.PutMemoryRequest(memory_ref=REF, content=f"Customer {n} prefers email. "
                                                  "Refunds take 30 days.")).entry_id for n in range(3)]
        compacted = stub.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF, source_ids=ids))
        assert compacted.created and compacted.source_count == 3
        assert next(watch).type == "memory.compacted"
        watch.cancel()
        text = scrape_text(sidecar.metrics_url)
        after = parse(text)

        # Every RPC, by method and code; the stream once it ended (cancelled by its caller).
        assert moved(after, before, "context_sidecar_rpc_duration_seconds_count", method="AssembleContext",
                     code="OK") == len(answers)
        assert moved(after, before, "context_sidecar_rpc_duration_seconds_count", method="AssembleContext",
                     code="INVALID_ARGUMENT") == 1
        assert rpc_count(after, "GetTranscriptWindow", "NOT_FOUND") == 1
        assert rpc_count(after, "OpenRun") == 2 and rpc_count(after, "RecordSummary") == 1
        assert rpc_count(after, "PutMemory") == 4 and rpc_count(after, "CompactMemory") == 1
        assert rpc_count(after, "RegisterSecrets") == 1
        assert value(after, "context_sidecar_rpc_duration_seconds_bucket", method="AssembleContext", code="OK",
                     le="+Inf") == len(answers)
        assert 0 < value(after, "context_sidecar_rpc_duration_seconds_sum", method="AssembleContext", code="OK") < 60
        until(lambda: rpc_count(scrape(sidecar.metrics_url), "WatchEvents", "CANCELLED") == 1,
              "the watch its caller cancelled is counted CANCELLED")
        assert value(watching, "context_sidecar_watchers") == 1
        until(lambda: value(scrape(sidecar.metrics_url), "context_sidecar_watchers") == 0, "no watcher is left")

        # Each turn: what it fed, its fill, what of it repeats the previous request.
        assert moved(after, before, "context_sidecar_turn_transcript_tokens_count") == len(answers)
        assert moved(after, before, "context_sidecar_turn_transcript_tokens_sum") == sum(a.token_count for a in answers)
        assert moved(after, before, "context_sidecar_turn_window_tokens_sum") == sum(a.window_tokens for a in answers)
        assert moved(after, before, "context_sidecar_turn_window_fill_ratio_sum") == pytest.approx(
            sum(a.token_count / a.token_budget for a in answers))
        assert moved(after, before, "context_sidecar_turn_stable_prefix_tokens_total") == sum(
            a.cache.stable_prefix_tokens for a in answers)
        assert moved(after, before, "context_sidecar_turn_stable_prefix_ratio_sum") == pytest.approx(
            sum(a.cache.stable_prefix_tokens / a.cache.request_tokens for a in answers))
        breaks = collections.Counter(a.cache.break_reason.partition(":")[0] for a in answers if a.cache.break_reason)
        assert breaks["first_turn"] == 2 and breaks["summary_recorded"] == 2 and breaks["tool_results_cleared"] >= 1
        assert {reason: moved(after, before, "context_sidecar_turn_cache_breaks_total", reason=reason)
                for reason in REASONS} == {reason: breaks[reason] for reason in REASONS}

        # What the turns recorded: the host's summary, the clearings (as their records say).
        assert moved(after, before, "context_sidecar_summaries_total", by="host") == 1
        assert all(moved(after, before, "context_sidecar_summaries_total", by=by) == 0
                   for by in ("built-in", "plugin", "replay"))
        clearings = [r for r in stub.ListCompactionRecords(pb.ListCompactionRecordsRequest(
            run_id=TOOL_RUN, limit=1000)).records if r.kind == "cleared"]
        assert len(clearings) >= 2
        assert moved(after, before, "context_sidecar_clearings_total") == len(clearings)
        assert moved(after, before, "context_sidecar_cleared_tool_results_total") == sum(
            len(r.removed_event_ids) for r in clearings)
        assert moved(after, before, "context_sidecar_cleared_tokens_total") == sum(
            r.tokens_before - r.tokens_after for r in clearings)

        # Redactions by kind, each occurrence; the memory compaction; the store grew.
        assert {kind: moved(after, before, "context_sidecar_redactions_total", kind=kind) for kind in KINDS} == {
            kind: {"openai_api_key": 2, "aws_access_key_id": 1, "registered": 1}.get(kind, 0) for kind in KINDS}
        assert moved(after, before, "context_sidecar_memory_compactions_total", trigger="client-requested") == 1
        assert moved(after, before, "context_sidecar_memory_compactions_total", trigger="host-managed") == 0
        assert moved(after, before, "context_sidecar_memory_compacted_entries_total") == 3
        assert value(after, "context_sidecar_background_job_runs_total", job="memory_compaction") == 0
        assert value(after, "context_sidecar_store_used_bytes") > used_before

        # Bounded labels: each from a fixed vocabulary; no run id, ref, id, secret or text anywhere.
        for (name, labels), _ in after.items():
            for label, label_value in labels:
                if label != "le":
                    assert label_value in LABEL_VALUES[label], (name, label, label_value)
        for private in (RUN, TOOL_RUN, REF, SECRETS_REF, SECRET_ID, SECRET_VALUE, DETECTED["openai_api_key"],
                        DETECTED["aws_access_key_id"], "u1", "clause", "Customer", "refund", ids[0],
                        compacted.output_id, summary.summary_ref, "nowhere-3b9d"):
            assert private not in text, private
        assert {name for name, _ in after if not name.startswith(("context_sidecar_", "process_"))} == set()
    finally:
        returncode, stderr = sidecar.stop()
    assert returncode == 0, stderr


def test_the_background_job_counts_its_rounds_and_compactions(tmp_path: Path) -> None:
    sidecar = Sidecar(tmp_path, "--metrics-listen", "127.0.0.1:0", "--compaction-enabled",
                      "--compaction-interval-seconds", "0.2", "--compaction-min-entries", "2",
                      "--compaction-keep-recent", "0")
    try:
        for n in range(3):
            sidecar.stub.PutMemory(pb.PutMemoryRequest(memory_ref=REF, content=f"Fact {n}: refunds take 30 days."))
        until(lambda: value(scrape(sidecar.metrics_url), "context_sidecar_memory_compactions_total",
                            trigger="host-managed") == 1, "the job's compaction is counted host-managed")
        runs = value(scrape(sidecar.metrics_url), "context_sidecar_background_job_runs_total", job="memory_compaction")
        until(lambda: value(scrape(sidecar.metrics_url), "context_sidecar_background_job_runs_total",
                            job="memory_compaction") >= runs + 2, "two more rounds are counted")
        samples = scrape(sidecar.metrics_url)
        assert value(samples, "context_sidecar_memory_compactions_total", trigger="host-managed") == 1
        assert value(samples, "context_sidecar_memory_compactions_total", trigger="client-requested") == 0
        assert value(samples, "context_sidecar_memory_compacted_entries_total") == 3
        assert value(samples, "context_sidecar_background_job_failures_total", job="memory_compaction") == 0
    finally:
        returncode, stderr = sidecar.stop()
    assert returncode == 0, stderr


def test_build_info_names_the_versions_that_run(tmp_path: Path) -> None:
    sidecar = Sidecar(tmp_path, "--metrics-listen", "127.0.0.1:0")
    try:
        text = scrape_text(sidecar.metrics_url)
    finally:
        sidecar.stop()
    assert "# TYPE context_sidecar_build_info gauge" in text
    builds = [(sample.labels, sample.value) for family in text_string_to_metric_families(text)
              for sample in family.samples if sample.name == "context_sidecar_build_info"]
    assert builds == [(RUNNING, 1.0)]


def test_metrics_listen_only_on_loopback_unless_allowed(tmp_path: Path) -> None:
    refused = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"), "--metrics-listen", "0.0.0.0:0")
    assert refused.returncode == 2
    assert "[metrics] listen: '0.0.0.0:0' is not a loopback address" in refused.stderr
    assert "allow_non_loopback" in refused.stderr
    sidecar = Sidecar(tmp_path, "--metrics-listen", "0.0.0.0:0", "--metrics-allow-non-loopback")
    try:
        assert sidecar.metrics_url.startswith("http://0.0.0.0:")
        assert "context_sidecar_watchers" in scrape_text(sidecar.metrics_url)
    finally:
        sidecar.stop()


def test_a_metrics_port_in_use_stops_the_sidecar(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"), "--metrics-listen", address)
    assert result.returncode == 3
    assert f"cannot start: cannot serve metrics on {address}" in result.stderr


def test_only_metrics_is_served_and_nothing_listens_with_metrics_off(tmp_path: Path) -> None:
    for name in ("on", "off"):
        (tmp_path / name).mkdir()
    on = Sidecar(tmp_path / "on", "--metrics-listen", "127.0.0.1:0")
    off = None
    try:
        off = Sidecar(tmp_path / "off")
        metrics_port = port_of(on.metrics_url[len("http://"):])
        assert listening_ports(on.process.pid) == {port_of(on.address), metrics_port}
        assert listening_ports(off.process.pid) == {port_of(off.address)}
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(on.metrics_url.replace("/metrics", "/"), timeout=10)
        assert raised.value.code == 404
    finally:
        on.stop()
        if off is not None:
            off.stop()


# In the process: registries apart, figures of a write counted once it commits, the job's rounds.

class Aborted(Exception):
    pass


class Context:
    """What the wrap reads of a grpc.ServicerContext: the code an abort set."""

    def __init__(self, code: grpc.StatusCode | None = None) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def is_active(self) -> bool:
        return True


def test_each_server_counts_in_its_own_registry() -> None:
    first, second = Metrics(), Metrics()

    def RecordSummary(request: object, context: Context) -> str:
        metrics.summary_recorded("host")
        return "answer"

    def GetArtifact(request: object, context: Context) -> str:
        raise Aborted()  # as grpc's abort raises, once it set the code

    assert first.wrap(RecordSummary)(None, Context()) == "answer"
    first.wrap(RecordSummary)(None, Context())
    second.wrap(RecordSummary)(None, Context())
    with pytest.raises(Aborted):
        second.wrap(GetArtifact)(None, Context(grpc.StatusCode.NOT_FOUND))
    with pytest.raises(Aborted):
        second.wrap(GetArtifact)(None, Context())
    metrics.summary_recorded("host")  # no server's call: counted nowhere
    counts = [parse(exposition(m)) for m in (first, second)]
    assert [value(c, "context_sidecar_summaries_total", by="host") for c in counts] == [2, 1]
    assert [rpc_count(c, "RecordSummary") for c in counts] == [2, 1]
    assert rpc_count(counts[1], "GetArtifact", "NOT_FOUND") == rpc_count(counts[1], "GetArtifact", "UNKNOWN") == 1


def exposition(m: Metrics) -> str:
    return generate_latest(m.registry).decode("utf-8")


def test_a_writes_figures_count_once_it_commits(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "data"), 1 << 20)
    m = Metrics()
    attempts = []

    def fails(txn: object) -> None:
        metrics.summary_recorded("host")
        raise ValueError("refused")

    def grows_then_commits(txn: object) -> None:
        attempts.append(txn)
        metrics.summary_recorded("host")
        if len(attempts) == 1:
            raise lmdb.MapFullError("as when the map is full: the store grows it and runs the work again")

    try:
        with m.bound():
            with pytest.raises(ValueError):
                store.write(fails)
            assert value(parse(exposition(m)), "context_sidecar_summaries_total", by="host") == 0
            store.write(grows_then_commits)
            metrics.summary_recorded("built-in")  # outside a write: counted at once
        assert len(attempts) == 2
        samples = parse(exposition(m))
        assert value(samples, "context_sidecar_summaries_total", by="host") == 1
        assert value(samples, "context_sidecar_summaries_total", by="built-in") == 1
    finally:
        store.close()


class FailingCompactor:
    def __init__(self) -> None:
        self.rounds = 0

    def run_round(self) -> list:
        self.rounds += 1
        if self.rounds % 2:
            raise RuntimeError("a bad round")
        return []


def test_the_background_job_counts_in_the_metrics_of_the_server_that_made_it() -> None:
    m, compactor = Metrics(), FailingCompactor()
    with m.bound():
        job = BackgroundJob(compactor, 0.01)  # type: ignore[arg-type]
    job.start()
    try:
        until(lambda: compactor.rounds >= 4, "four rounds ran")
    finally:
        job.stop()
    samples = parse(exposition(m))
    runs = value(samples, "context_sidecar_background_job_runs_total", job="memory_compaction")
    failures = value(samples, "context_sidecar_background_job_failures_total", job="memory_compaction")
    assert runs == compactor.rounds and failures == (compactor.rounds + 1) // 2



def test_a_turn_whose_commit_fills_the_map_is_counted_once(start_server) -> None:
    """A turn whose commit finds the map full (MDB_MAP_FULL once every put of it fitted) is run
    again once the store grew the map; its answer is made while the commit syncs, so the turn's
    figures must count the attempt that committed, once. The size of the turn that fills a fresh
    1 MiB map exactly at its commit is found by bisection (the smallest that does not fit at once)."""

    def turn_of(size: int) -> tuple[list[str], Samples, list[int]]:
        sidecar = start_server(storage={"map_size": 1 << 20}, metrics=True, token_counter="chars")
        seen = sidecar.services.store.env = CommitsSeen(sidecar.services.store.env)
        sidecar.stub.OpenRun(pb.OpenRunRequest(run_id=RUN))
        counts = [sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=1, append_events=[
            pb.Event(event_id="u1", role="user", content="hello")])).token_count]
        seen.ends.clear()
        counts.append(sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=2, append_events=[
            pb.Event(event_id="u2", role="user", content=filler(size))])).token_count)
        assert sidecar.metrics is not None
        return list(seen.ends), parse(exposition(sidecar.metrics)), counts

    fits, fills = 1, 1_000_000
    assert turn_of(fits)[0] == ["committed"] and turn_of(fills)[0][0] != "committed"
    while fills - fits > 1:
        middle = (fits + fills) // 2
        if turn_of(middle)[0][0] == "committed":
            fits = middle
        else:
            fills = middle
    ends, samples, counts = turn_of(fills)
    assert ends == ["full at commit", "committed"]  # the turn's commit filled the map, and it ran again
    assert value(samples, "context_sidecar_turn_transcript_tokens_count") == 2  # two turns: each counted once
    assert value(samples, "context_sidecar_turn_transcript_tokens_sum") == sum(counts)
    assert value(samples, "context_sidecar_turn_window_tokens_count") == 2


def test_every_turn_counts_once_its_commit_is_durable_however_fast_the_disk(start_server) -> None:
    """A turn's answer is made while its commit syncs, on the store's own thread; on a disk whose
    sync costs nothing (tmpfs) the commit ends first, and the turn must count all the same: once."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("needs a tmpfs at /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
        sidecar = start_server(storage={"path": folder, "sync": True}, metrics=True, token_counter="o200k_base")
        sidecar.stub.OpenRun(pb.OpenRunRequest(run_id=RUN))
        counts = [sidecar.stub.AssembleContext(pb.AssembleContextRequest(
            run_id=RUN, iteration=turn, append_events=tool_turn(turn))).token_count
            for turn in range(1, 41)]
        assert sidecar.metrics is not None
        samples = parse(exposition(sidecar.metrics))
    assert value(samples, "context_sidecar_turn_transcript_tokens_count") == len(counts)
    assert value(samples, "context_sidecar_turn_transcript_tokens_sum") == sum(counts)
