"""A real plugin package, installed with pip, replacing each compaction hook of a real sidecar
process (tests/plugin: every third turn, keep the skills index but not the plan, summarise the
oldest two events itself) and describing an agent-state subset."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.helpers import Sidecar, open_full, rich_error, run_cli, sections_of, turn_events, with_site


def test_each_hook_is_replaced_by_the_installed_plugin(tmp_path: Path, site: Path) -> None:
    sidecar = Sidecar(tmp_path, "--plugin", "every-third", "--summarization", "--token-counter", "chars",
                      "--transcript-token-budget", "1200", "--keep-last-turns", "1", env=with_site(site))
    try:
        stub = sidecar.stub
        document = json.loads(stub.GetCapabilities(pb.GetCapabilitiesRequest()).capabilities_json)
        assert document["contextWindow"]["compactionHooks"] == {
            "trigger": "every-third", "keep": "every-third", "summarise": "every-third"}
        assert document["contextWindow"]["stateSchemas"] == ["counter"]
        open_full(stub)
        stub.PutStateData(pb.PutStateDataRequest(run_id="run", subset="counter", json="3"))
        with pytest.raises(grpc.RpcError) as raised:
            stub.PutStateData(pb.PutStateDataRequest(run_id="run", subset="counter", json="-1"))
        assert rich_error(raised.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "state_invalid")

        answers = [stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=turn,
                                                                  append_events=turn_events(turn)))
                   for turn in range(1, 7)]
        # keep: the skills index joined the kept sections, the plan left them.
        flags = {s.name: s.never_compact for s in answers[0].sections}
        assert flags["skills_index"] and not flags["plan"] and flags["system_prompt"]
        # trigger: nothing at turns 1-2 (tiny windows); at turn 3 the plugin summarised by itself.
        records = stub.ListCompactionRecords(pb.ListCompactionRecordsRequest(run_id="run")).records
        assert [(r.iteration, list(r.removed_event_ids), r.summarised_by) for r in records] == [
            (3, ["u1", "c1", "r1"], "plugin"), (6, ["u2", "c2", "r2"], "plugin")]
        assert "state_summary" not in sections_of(answers[1])
        summary = sections_of(answers[2])["state_summary"]
        artifact = stub.GetArtifact(pb.GetArtifactRequest(run_id="run", artifact_id=summary.event_ids[0]))
        assert artifact.content == "[plugin summary of u1, c1, r1]"
        # After its summary at turn 3 nothing older than the recent turns is left (turns 2-3 fit in
        # 0.6 of the budget); at turn 6 turns 3-4 are, the plugin having summarised turn 2 alone.
        assert [a.compaction.due for a in answers] == [False, False, False, False, False, True]
    finally:
        code, stderr = sidecar.stop()
    assert code == 0, stderr


def test_a_plugin_that_is_not_installed_stops_the_sidecar(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "serve", "--plugin", "no-such-plugin", "--listen", "127.0.0.1:0",
                     "--storage-path", str(tmp_path / "data"))
    assert result.returncode == 2
    assert "no entry point 'no-such-plugin' in the group 'context_sidecar.plugins'" in result.stderr
