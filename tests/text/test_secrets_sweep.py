"""The SR-1 sweep (issue 9, item 2): a canary planted through every write path the API has, then
a search for it in the LMDB file's raw bytes, in every answer the client received (each
response serialised, the provider renderings and GetState among them) and in the server's log.

Each path plants its own canaries, so a failure names the path that leaked: a tenant-wide
registered secret, a run secret (where run secrets apply: memory is the tenant's), an
OpenAI-shaped key that only the built-in detector knows, and every other detected kind."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import grpc
from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.helpers import DETECTED, TOKENS, Tenant, call_error

RUN = "r"
RUN_PATHS = ["append_events", "assemble_append", "tool_call", "record_summary", "open_run_profile", "open_run_task",
             "system_prompt", "participants", "agents", "skills_index", "tool_description", "tool_parameters",
             "update_task", "load_skill", "state_data"]
MEMORY_PATHS = ["put_memory", "compact_memory"]  # tenant-wide: a run's secrets do not apply there
PATHS = RUN_PATHS + MEMORY_PATHS


def tenant_wide(path: str) -> str:
    return f"tw-canary-{path}-0001"


def run_only(path: str) -> str:
    return f"run-canary-{path}-0002"


def detected(path: str) -> str:
    """An OpenAI-style key nobody registered, distinct per path."""
    return "sk-proj-" + path.replace("_", "") + "AbCdEfGhIjKlMnOpQrStUv0123"


def own_canaries(path: str) -> list[str]:
    return [tenant_wide(path), *([run_only(path)] if path in RUN_PATHS else []), detected(path)]


def plaintexts(path: str) -> list[str]:
    return [*own_canaries(path), *DETECTED.values()]


def leak(path: str) -> str:
    return f"{path} leaks " + " | ".join(plaintexts(path))


def spellings(plaintext: str) -> list[bytes]:
    """The bytes a plaintext has in the file or an answer: as UTF-8, and as a JSON string body
    (a record or a rendering escapes newlines and, with ensure_ascii, every non-ASCII character)."""
    return list(dict.fromkeys(form.encode("utf-8") for form in (
        plaintext, json.dumps(plaintext)[1:-1], json.dumps(plaintext, ensure_ascii=False)[1:-1])))


def assert_no_canary(sidecar, answers: list[bytes], log: str, paths: list[str]) -> None:
    stored = (Path(sidecar.services.store.env.path()) / "data.mdb").read_bytes()
    assert b"[REDACTED:" in stored  # the file is readable as it is: what was stored is there
    # Each path's own canaries first, so that a failure names the path; then the kinds all share.
    planted = [(path, plaintext) for path in paths for plaintext in own_canaries(path)]
    for path, plaintext in planted + [("every path", plaintext) for plaintext in DETECTED.values()]:
        for needle in spellings(plaintext):
            assert needle not in stored, f"{path}: {needle[:24]!r}... is in the LMDB file"
            assert all(needle not in answer for answer in answers), f"{path}: {needle[:24]!r}... was answered"
            assert needle.decode("utf-8") not in log, f"{path}: {needle[:24]!r}... was logged"


def json_leak(path: str) -> dict:
    """A JSON schema (also a fine state value or tool-call argument object) holding the path's
    canaries in string values and in an object key."""
    return {"type": "object", "description": leak(path),
            "properties": {detected(path): {"type": "string", "default": leak(path)},
                           "q": {"enum": [leak(path), 1, None]}}}


def profile(path: Callable[[str], str]) -> pb.Profile:
    """A profile whose every text field plants the canaries of its own path (``path(field)``)."""
    return pb.Profile(
        system_prompt=leak(path("system_prompt")),
        participants=[pb.Participant(role="planner", description=leak(path("participants")))],
        agents=[pb.RemoteAgent(id="billing", name=leak(path("agents")), description=leak(path("agents")),
                               skills=[leak(path("agents"))])],
        skills=[pb.SkillSummary(name="pdf", description=leak(path("skills_index")))],
        tools=[pb.ToolDefinition(name="search", description=leak(path("tool_description")),
                                 parameters_json=json.dumps(json_leak(path("tool_parameters"))))])


def test_no_canary_from_any_write_path_reaches_the_store_an_answer_or_the_log(start_server, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    sidecar = start_server(tenants=TOKENS, summarization=True, keep_last_turns=1, transcript_token_budget=5000,
                           memory={"token_counter": "chars"}, compaction={"enabled": True})
    acme = Tenant(sidecar.channel, TOKENS["acme"])
    answers: list[bytes] = []

    def keep(response):
        answers.append(response if isinstance(response, bytes) else response.SerializeToString())
        return response

    keep(acme.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[
        pb.Secret(secret_id=f"tw{i}", value=tenant_wide(path)) for i, path in enumerate(PATHS)])))
    keep(acme.RegisterSecrets(pb.RegisterSecretsRequest(run_id=RUN, secrets=[
        pb.Secret(secret_id=f"rs{i}", value=run_only(path)) for i, path in enumerate(RUN_PATHS)])))

    # OpenRun's profile and task; then each part of the profile through UpdateProfile.
    keep(acme.OpenRun(pb.OpenRunRequest(run_id=RUN, profile=profile(lambda _: "open_run_profile"), task=pb.Task(
        task_id="t1", goal=leak("open_run_task"), acceptance_criteria=[leak("open_run_task")],
        plan=leak("open_run_task")))))
    keep(acme.UpdateProfile(pb.UpdateProfileRequest(run_id=RUN, profile=profile(lambda field: field))))
    keep(acme.UpdateTask(pb.UpdateTaskRequest(run_id=RUN, task=pb.Task(
        task_id="t2", goal=leak("update_task"), acceptance_criteria=[leak("update_task")], plan=leak("update_task")))))
    keep(acme.LoadSkill(pb.LoadSkillRequest(run_id=RUN, skill=pb.LoadedSkill(name="pdf", body=leak("load_skill")))))
    keep(acme.PutStateData(pb.PutStateDataRequest(run_id=RUN, subset="notes",
                                                  json=json.dumps(json_leak("state_data")))))
    # The transcript: a host event, a turn's appended event, a tool call's JSON arguments, a summary.
    keep(acme.AppendEvents(pb.AppendEventsRequest(run_id=RUN, events=[
        pb.Event(event_id="e1", iteration=1, role="user", content=leak("append_events")),
        pb.Event(event_id="c1", iteration=1, role="assistant", type="tool_call", call_id="k1", tool_name="search",
                 content=json.dumps(json_leak("tool_call")))])))
    keep(acme.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=1, append_events=[
        pb.Event(event_id="e2", role="tool", call_id="k1", content=leak("assemble_append"))])))
    keep(acme.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=2, append_events=[
        pb.Event(event_id="e3", role="user", content="third")])))
    recorded = keep(acme.RecordSummary(pb.RecordSummaryRequest(
        run_id=RUN, iteration=3, replaced_event_ids=["e1", "c1", "e2"], summary_text=leak("record_summary"))))
    keep(acme.RecordUsage(pb.RecordUsageRequest(run_id=RUN, iteration=1, input_tokens=10)))  # numbers only
    # Memory: an entry, and a host's distillation of two.
    for entry_id in ("m1", "m2"):
        keep(acme.PutMemory(pb.PutMemoryRequest(memory_ref="mem:a", content=leak("put_memory"), entry_id=entry_id)))
    compacted = keep(acme.CompactMemory(pb.CompactMemoryRequest(memory_ref="mem:a", source_ids=["m1", "m2"],
                                                                summary_text=leak("compact_memory"))))

    # Every read path, the renderings and GetState among them.
    for render in ("", "openai_responses", "anthropic_messages"):
        keep(acme.AssembleContext(pb.AssembleContextRequest(run_id=RUN, iteration=3, render=render)))
    keep(acme.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id=RUN, iteration=3)))
    events = keep(acme.ListRunEvents(pb.ListRunEventsRequest(run_id=RUN))).events
    keep(acme.GetArtifact(pb.GetArtifactRequest(run_id=RUN, artifact_id=recorded.summary_ref)))
    state = keep(acme.GetState(pb.GetStateRequest(run_id=RUN)))
    keep(acme.ListCompactionRecords(pb.ListCompactionRecordsRequest(run_id=RUN)))
    keep(acme.GetMemory(pb.GetMemoryRequest(memory_ref="mem:a", entry_id=compacted.output_id)))
    keep(acme.ListMemory(pb.ListMemoryRequest(memory_ref="mem:a")))
    keep(acme.ListMemory(pb.ListMemoryRequest(memory_ref="mem:a", rank="relevance", query="leaks")))
    keep(acme.ListMemoryEvents(pb.ListMemoryEventsRequest(memory_ref="mem:a")))

    assert_no_canary(sidecar, answers, caplog.text, PATHS)
    # What was stored is the redacted text, markers in place, and JSON stays JSON.
    by_id = {e.event_id: e for e in events}
    assert "[REDACTED:tw0] | [REDACTED:rs0] | [REDACTED:openai_api_key]" in by_id["e1"].content
    arguments = json.loads(by_id["c1"].content)
    tool_call_index = PATHS.index("tool_call")
    assert arguments["properties"]["[REDACTED:openai_api_key]"]["default"].startswith(
        f"tool_call leaks [REDACTED:tw{tool_call_index}] | [REDACTED:rs{tool_call_index}]")
    data = json.loads(state.data_json)["notes"]
    assert data["properties"]["q"]["enum"][1:] == [1, None] and "[REDACTED:jwt]" in data["description"]
    parameters = json.loads(state.profile.tools[0].parameters_json)
    assert "[REDACTED:private_key]" in parameters["description"]


def test_a_secret_spelled_with_json_escapes_is_redacted_too(start_server, caplog) -> None:
    """JSON may spell any character as \\uXXXX: the stored text then holds no plaintext bytes,
    but whoever parses it (the provider) reads the secret. JSON is redacted as parsed."""
    caplog.set_level(logging.DEBUG)
    sidecar = start_server(token_counter="chars")
    stub = sidecar.stub
    secret = "escaped-canary-0003"
    stub.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id="esc", value=secret)]))
    spelled = '"' + "".join(f"\\u{ord(c):04x}" for c in secret) + '"'
    schema = '{"type":"object","description":' + spelled + ',"properties":{' + spelled + ':{"type":"string"}}}'
    stub.OpenRun(pb.OpenRunRequest(run_id="run", profile=pb.Profile(tools=[
        pb.ToolDefinition(name="search", parameters_json=schema)])))
    stub.PutStateData(pb.PutStateDataRequest(run_id="run", subset="s", json=schema))
    stub.AppendEvents(pb.AppendEventsRequest(run_id="run", events=[pb.Event(
        event_id="c", iteration=1, role="assistant", type="tool_call", call_id="k", tool_name="search",
        content=schema)]))
    answers = [stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1, render=render)).rendered
               for render in ("openai_responses", "anthropic_messages")]
    state = stub.GetState(pb.GetStateRequest(run_id="run"))
    parsed = [json.loads(state.data_json), json.loads(state.profile.tools[0].parameters_json),
              json.loads(state.history[0].content), *map(json.loads, answers)]
    for value in parsed:
        text = json.dumps(value, ensure_ascii=False)
        assert secret not in text and "[REDACTED:esc]" in text
    stored = (Path(sidecar.services.store.env.path()) / "data.mdb").read_bytes()
    assert secret.encode() not in stored and spelled[1:-1].encode() not in stored


def test_a_memory_tag_holding_a_secret_is_refused_and_never_stored(start_server, caplog) -> None:
    """A tag is an identifier, not content: redacting it would merge tags, so it is refused."""
    caplog.set_level(logging.DEBUG)
    sidecar = start_server(tenants=TOKENS, memory={"token_counter": "chars"})
    acme = Tenant(sidecar.channel, TOKENS["acme"])
    acme.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id="tw", value=tenant_wide("tags"))]))
    acme.PutMemory(pb.PutMemoryRequest(memory_ref="mem:a", content="fine", entry_id="m0", tags=["plain"]))
    answers = []
    for tag in (tenant_wide("tags"), detected("tags")):
        code, reason, fields = call_error(acme.PutMemory, pb.PutMemoryRequest(
            memory_ref="mem:a", content="fine", entry_id="m", tags=["plain", tag]))
        assert (code, reason, fields) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["tags[1]"])
    answers.append(acme.ListMemory(pb.ListMemoryRequest(memory_ref="mem:a")).SerializeToString())
    stored = (Path(sidecar.services.store.env.path()) / "data.mdb").read_bytes()
    for needle in (tenant_wide("tags"), detected("tags")):
        assert needle.encode() not in stored and all(needle.encode() not in a for a in answers)
        assert needle not in caplog.text


def test_an_identifier_holding_a_secret_is_refused_not_stored(start_server, caplog) -> None:
    """Tool names, agent ids, skill names, task ids and state subsets are fed or matched as they
    are, like tags: one that holds a secret is refused (redacting it would rename it)."""
    caplog.set_level(logging.DEBUG)
    sidecar = start_server(token_counter="chars")
    stub = sidecar.stub
    secret = "idcanary-0004"
    stub.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id="ids", value=secret)]))
    stub.OpenRun(pb.OpenRunRequest(run_id="run"))
    key = detected("ids")
    for held in (secret, key):
        refused = {
            "profile.tools[0].name": (stub.UpdateProfile, pb.UpdateProfileRequest(run_id="run", profile=pb.Profile(
                tools=[pb.ToolDefinition(name=f"x-{held}")]))),
            "profile.agents[0].id": (stub.UpdateProfile, pb.UpdateProfileRequest(run_id="run", profile=pb.Profile(
                agents=[pb.RemoteAgent(id=f"agent-{held}")]))),
            "profile.skills[0].name": (stub.OpenRun, pb.OpenRunRequest(run_id="other", profile=pb.Profile(
                skills=[pb.SkillSummary(name=held)]))),
            "task.task_id": (stub.UpdateTask, pb.UpdateTaskRequest(run_id="run", task=pb.Task(task_id=held))),
            "skill.name": (stub.LoadSkill,
                           pb.LoadSkillRequest(run_id="run", skill=pb.LoadedSkill(name=held, body="b"))),
            "subset": (stub.PutStateData, pb.PutStateDataRequest(run_id="run", subset=held, json="1")),
        }
        for field, (method, request) in refused.items():
            assert call_error(method, request) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", [field])
    stored = (Path(sidecar.services.store.env.path()) / "data.mdb").read_bytes()
    state = stub.GetState(pb.GetStateRequest(run_id="run")).SerializeToString()
    for needle in (secret, key):
        assert needle.encode() not in stored and needle.encode() not in state and needle not in caplog.text


def test_an_events_identifiers_holding_a_secret_are_refused_on_every_path(start_server, caplog) -> None:
    """An event's tool name is the tool definition's name, its call id is fed as the call's id in
    both renderings, and its event id and type are stored and returned as they are: identifiers,
    refused like a tool's name when they hold a secret, naming the field, with nothing written
    (AppendEvents, AssembleContext, and on a replay fork)."""
    caplog.set_level(logging.DEBUG)
    sidecar = start_server(token_counter="chars")
    stub = sidecar.stub
    secret = "toolcanary-0005"
    stub.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id="tools", value=secret)]))
    stub.AppendEvents(pb.AppendEventsRequest(run_id="run", events=[
        pb.Event(event_id="u0", iteration=1, role="user", content="hi")]))
    stub.ForkRun(pb.ForkRunRequest(source_run_id="run", new_run_id="fork", from_seq=0, mode="replay"))

    def call(held: str, where: str) -> pb.Event:
        names = {"event_id": "c", "type": "tool_call", "tool_name": "search", "call_id": "k", where: held}
        return pb.Event(iteration=1, role="assistant", content='{"q": "x"}', **names)

    for held in (secret, detected("toolname"), f"x-{detected('toolname')}"):
        for where in ("tool_name", "call_id", "event_id", "type"):
            refused = {
                f"events[0].{where}": (stub.AppendEvents, pb.AppendEventsRequest(run_id="run",
                                                                                events=[call(held, where)])),
                f"append_events[0].{where}": (stub.AssembleContext, pb.AssembleContextRequest(
                    run_id="run", iteration=1, append_events=[call(held, where)], render="anthropic_messages")),
                f"append_events[0].{where} (fork)": (stub.AssembleContext, pb.AssembleContextRequest(
                    run_id="fork", iteration=1, append_events=[call(held, where)], render="openai_responses")),
            }
            for field, (method, request) in refused.items():
                assert call_error(method, request) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error",
                                                       [field.split(" ")[0]]), (field, held)
    for run_id in ("run", "fork"):
        assert [e.event_id for e in stub.ListRunEvents(pb.ListRunEventsRequest(run_id=run_id)).events] == \
            (["u0"] if run_id == "run" else []), "nothing written"
    stored = (Path(sidecar.services.store.env.path()) / "data.mdb").read_bytes()
    for needle in (secret, detected("toolname")):
        assert needle.encode() not in stored and needle not in caplog.text
