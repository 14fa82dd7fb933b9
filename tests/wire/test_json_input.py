"""JSON input over a real server (issue 9, item 6): every request field that carries JSON text
(agent-state data, a tool call's arguments, a tool's parameter schema) is parsed by one strict
parser, and what it refuses is INVALID_ARGUMENT / validation_error naming the field, never
INTERNAL. What it accepts reads back as JSON a strict parser accepts."""

from __future__ import annotations

import json

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.helpers import call_error, ev

REFUSED = (grpc.StatusCode.INVALID_ARGUMENT, "validation_error")
DEEP = 990  # deep enough that the standard library's parser hits Python's recursion limit


def nested_object(depth: int) -> str:
    """``{"a":{"a":...{}...}}``: ``depth`` nested objects (also a valid, if odd, JSON schema)."""
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def nested_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def tool_call(content: str, event_id: str = "c") -> pb.Event:
    return ev(event_id, 1, content, "assistant", "tool_call", "k-" + event_id, tool_name="search")


def tool_profile(parameters_json: str) -> pb.Profile:
    return pb.Profile(tools=[pb.ToolDefinition(name="ok"),
                             pb.ToolDefinition(name="x", parameters_json=parameters_json)])


def strict(text: str):
    """Parse as providers do: NaN, Infinity and out-of-range numbers are not JSON."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")
    value = json.loads(text, parse_constant=refuse)
    assert "inf" not in json.dumps(value).lower()
    return value


@pytest.fixture
def stub(start_server):
    stub = start_server(token_counter="chars").stub
    stub.OpenRun(pb.OpenRunRequest(run_id="run"))
    return stub


def each_json_field(stub, text: str) -> dict[str, tuple]:
    """Send ``text`` through every JSON field; each path's error (or None when accepted)."""
    def error_of(method, request):
        try:
            method(request)
        except grpc.RpcError:
            return call_error(method, request)
        return None
    return {
        "json": error_of(stub.PutStateData, pb.PutStateDataRequest(run_id="run", subset="s", json=text)),
        "events[0].content": error_of(stub.AppendEvents,
                                      pb.AppendEventsRequest(run_id="run", events=[tool_call(text)])),
        "append_events[0].content": error_of(stub.AssembleContext, pb.AssembleContextRequest(
            run_id="run", iteration=1, append_events=[tool_call(text, "c2")])),
        "profile.tools[1].parameters_json": error_of(stub.UpdateProfile, pb.UpdateProfileRequest(
            run_id="run", profile=tool_profile(text))),
        "profile.tools[1].parameters_json (OpenRun)": error_of(stub.OpenRun, pb.OpenRunRequest(
            run_id="other", profile=tool_profile(text))),
    }


@pytest.mark.parametrize("text", [nested_object(DEEP), '{"a":' + nested_array(DEEP) + "}"])
def test_json_nested_too_deep_is_refused_naming_the_field(stub, text: str) -> None:
    for field, error in each_json_field(stub, text).items():
        assert error == (*REFUSED, [field.split(" ")[0]]), field


def test_json_at_the_depth_limit_is_accepted_and_one_more_level_is_refused(stub) -> None:
    from sidecar.validation import MAX_JSON_DEPTH
    for field, error in each_json_field(stub, nested_object(MAX_JSON_DEPTH)).items():
        assert error is None, (field, error)
    assert strict(stub.GetState(pb.GetStateRequest(run_id="run")).data_json) == {"s": strict(
        nested_object(MAX_JSON_DEPTH))}
    for field, error in each_json_field(stub, nested_object(MAX_JSON_DEPTH + 1)).items():
        assert error == (*REFUSED, [field.split(" ")[0]]), field
    with pytest.raises(grpc.RpcError) as raised:
        stub.PutStateData(pb.PutStateDataRequest(run_id="run", subset="s", json=nested_array(MAX_JSON_DEPTH + 1)))
    assert f"at most {MAX_JSON_DEPTH}" in raised.value.details()
    # Brackets inside strings are text, not depth.
    assert each_json_field(stub, json.dumps({"a": "[" * 5000 + "{" * 5000}))["json"] is None


@pytest.mark.parametrize("text", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e400}', "[-1e999]"])
def test_numbers_that_are_not_json_are_refused(stub, text: str) -> None:
    for field, error in each_json_field(stub, text).items():
        assert error == (*REFUSED, [field.split(" ")[0]]), field
    assert strict(stub.GetState(pb.GetStateRequest(run_id="run")).data_json) == {}


def test_a_lone_surrogate_is_refused(stub) -> None:
    # Valid JSON syntax, but not text: it cannot be stored as UTF-8 nor sent to a provider.
    for field, error in each_json_field(stub, '{"x": "\\ud800"}').items():
        assert error == (*REFUSED, [field.split(" ")[0]]), field
    # A surrogate pair is one character, and fine.
    assert each_json_field(stub, '{"x": "\\ud83d\\ude00"}')["json"] is None
    assert strict(stub.GetState(pb.GetStateRequest(run_id="run")).data_json) == {"s": {"x": "\U0001f600"}}


@pytest.mark.parametrize("schema", [
    '{"type": "objekt", "properties": 5}',
    '{"type": "object", "required": "query"}',
    '{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {"q": {"minLength": -1}}}',
])
def test_a_tool_schema_that_is_not_a_json_schema_is_refused(stub, schema: str) -> None:
    field = "profile.tools[1].parameters_json"
    code, reason, fields = call_error(stub.UpdateProfile, pb.UpdateProfileRequest(run_id="run",
                                                                                  profile=tool_profile(schema)))
    assert (code, reason, fields) == (*REFUSED, [field])
    assert call_error(stub.OpenRun, pb.OpenRunRequest(run_id="other", profile=tool_profile(schema)))[:3] == (
        *REFUSED, [field])
    with pytest.raises(grpc.RpcError) as raised:
        stub.UpdateProfile(pb.UpdateProfileRequest(run_id="run", profile=tool_profile(schema)))
    assert "JSON schema" in raised.value.details()


def test_a_schema_of_an_older_draft_is_checked_against_its_own_metaschema(stub) -> None:
    # Draft 4's exclusiveMaximum is a boolean; 2020-12's a number: each is valid only in its draft.
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"n": {"type": "number", "maximum": 5, "exclusiveMaximum": True}}}
    stub.UpdateProfile(pb.UpdateProfileRequest(run_id="run", profile=tool_profile(json.dumps(draft4))))
    current = {"type": "object", "properties": {"n": {"type": "number", "exclusiveMaximum": True}}}
    assert call_error(stub.UpdateProfile, pb.UpdateProfileRequest(
        run_id="run", profile=tool_profile(json.dumps(current))))[:3] == (
            *REFUSED, ["profile.tools[1].parameters_json"])


def test_a_tool_call_cannot_be_marked_untrusted(stub) -> None:
    # Fencing a tool call's arguments in the untrusted-data block would make them text, not the
    # JSON object both renderings send as the call (Anthropic's rendering then failed: INTERNAL).
    call = ev("c", 1, '{"q": 1}', "assistant", "tool_call", "k", tool_name="search", untrusted=True)
    assert call_error(stub.AppendEvents, pb.AppendEventsRequest(run_id="run", events=[call])) == (
        *REFUSED, ["events[0].untrusted"])
    assert call_error(stub.AssembleContext, pb.AssembleContextRequest(run_id="run", iteration=1, append_events=[
        call])) == (*REFUSED, ["append_events[0].untrusted"])
    for render in ("openai_responses", "anthropic_messages"):
        strict(stub.AssembleContext(pb.AssembleContextRequest(run_id="run", iteration=1, render=render)).rendered)


def test_a_repeated_key_is_refused(stub) -> None:
    # Python keeps the last member of a repeated key, other readers the first: the text would
    # say what its parsed, checked and redacted value does not.
    for field, error in each_json_field(stub, '{"q": "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx", "q": "x"}').items():
        assert error == (*REFUSED, [field.split(" ")[0]]), field
