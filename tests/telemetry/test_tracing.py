"""Traces: a real server with an in-memory exporter joins the host's trace (W3C traceparent in the
call's metadata), one SERVER span per call carrying the turn's figures, its costly phases as child
spans; an error call's span says so. Off, nothing of OpenTelemetry is imported; on without the
extra, the sidecar refuses to start; with an OTLP endpoint, a real sidecar exports its spans to it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar.settings import ContextSettings, ServerSettings, Settings, StorageSettings, TracingSettings
from sidecar.storage.environment import Store
from sidecar.telemetry import tracing
from sidecar.telemetry.tracing import Tracing
from sidecar.wire import server as server_module
from sidecar.wire.server import Services, build_server
from tests.helpers import ROOT, Sidecar, ev, run_cli

ASSEMBLE = "contextsidecar.v1.ContextSidecar/AssembleContext"


class Traced:
    """A real server on a free port whose spans land in ``spans`` (None: built without tracing)."""

    def __init__(self, tmp_path: Path, counters, traced: bool = True) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracing = Tracing.start(TracingSettings(enabled=True), SimpleSpanProcessor(self.exporter)) \
            if traced else None
        settings = Settings(server=ServerSettings(listen="127.0.0.1:0"),
                            storage=StorageSettings(path=str(tmp_path / "lmdb"), map_size=16 << 20),
                            context=ContextSettings(token_counter="chars", transcript_token_budget=1000))
        self.services = Services.build(settings, Store(settings.storage.path, settings.storage.map_size), counters)
        self.server, port, health_servicer = build_server(settings, self.services, tracing=self.tracing)
        server_module.start(self.server, health_servicer)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.ContextSidecarStub(self.channel)

    def spans(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def close(self) -> None:
        self.channel.close()
        self.server.stop(None).wait()
        self.services.close()
        if self.tracing:
            self.tracing.shutdown()


@pytest.fixture
def sidecar_at(tmp_path: Path, counters) -> Iterator:
    made: list[Traced] = []

    def make(name: str = "traced", traced: bool = True) -> Traced:
        made.append(Traced(tmp_path / name, counters, traced))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def host() -> tuple[TracerProvider, InMemorySpanExporter]:
    """The host's own tracer, as an agent host instrumented with the SDK has it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def traceparent() -> tuple[tuple[str, str], ...]:
    """The current span's context as gRPC metadata, by the W3C propagator."""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return tuple(carrier.items())


def turn(run_id: str = "run-1") -> pb.AssembleContextRequest:
    return pb.AssembleContextRequest(run_id=run_id, iteration=2, render="openai_responses", append_events=[
        ev("u1", iteration=1, content="Hi, I bought a kettle."), ev("u2", content="What does the refund policy say?"),
        ev("c2", role="assistant", type="tool_call", call_id="k2", tool_name="search", content='{"q": "refund"}'),
        ev("r2", role="tool", type="tool_result", call_id="k2", content="30 days.")])


def server_span(spans: tuple[ReadableSpan, ...], name: str = ASSEMBLE) -> ReadableSpan:
    found = [span for span in spans if span.kind == SpanKind.SERVER and span.name == name]
    assert len(found) == 1, [span.name for span in spans]
    return found[0]


def test_a_turn_joins_the_hosts_trace_with_its_figures_and_phases(sidecar_at, host) -> None:
    sidecar = sidecar_at()
    provider, host_spans = host
    with provider.get_tracer("host").start_as_current_span("agent turn") as host_span:
        answer = sidecar.stub.AssembleContext(turn(), metadata=traceparent())
    assert answer.rendered and len(answer.event_ids) == 4 and answer.token_count > 0

    span = server_span(sidecar.spans())
    assert span.parent is not None and span.parent.is_remote
    assert span.parent.span_id == host_span.get_span_context().span_id
    assert span.context.trace_id == host_span.get_span_context().trace_id == host_spans.get_finished_spans()[0] \
        .context.trace_id
    assert span.resource.attributes["service.name"] == "context-sidecar"
    assert {name: span.attributes[name] for name in ("rpc.system", "rpc.service", "rpc.method",
                                                     "rpc.grpc.status_code")} == {
        "rpc.system": "grpc", "rpc.service": "contextsidecar.v1.ContextSidecar", "rpc.method": "AssembleContext",
        "rpc.grpc.status_code": 0}
    assert span.status.status_code == StatusCode.UNSET
    assert {name: span.attributes[f"contextsidecar.{name}"] for name in ("iteration", "tokens", "entries", "budget")} \
        == {"iteration": answer.iteration, "tokens": answer.token_count, "entries": len(answer.event_ids),
            "budget": answer.token_budget} == {"iteration": 2, "tokens": answer.token_count, "entries": 4,
                                               "budget": 1000}
    phases = [s for s in sidecar.spans() if s.parent is not None and s.parent.span_id == span.context.span_id]
    # Each phase once: never a span per event. All inside the server span's time.
    assert sorted(s.name for s in phases) == ["commit", "count", "read", "render", "select"]
    assert all(s.context.trace_id == span.context.trace_id and span.start_time <= s.start_time <= s.end_time
               <= span.end_time for s in phases)
    assert len(sidecar.spans()) == 6


def test_a_call_without_a_traceparent_starts_a_trace_and_phases_run_only_when_they_cost(sidecar_at) -> None:
    sidecar = sidecar_at()
    sidecar.stub.AssembleContext(turn())
    again = sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="run-1", iteration=2))
    first, second = [s for s in sidecar.spans() if s.kind == SpanKind.SERVER]
    assert first.parent is None and second.parent is None and first.context.trace_id != second.context.trace_id
    # Assembled again unchanged: read only, nothing counted, chosen (to compare), nor committed.
    assert sorted(s.name for s in sidecar.spans() if s.parent and s.parent.span_id == second.context.span_id) \
        == ["read", "select"]
    assert second.attributes["contextsidecar.entries"] == len(again.event_ids) == 4
    # A call whose trace the host did not sample (flags 00) records nothing, its phases neither.
    made = len(sidecar.spans())
    sidecar.stub.AssembleContext(turn("run-2"), metadata=(
        ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),))
    assert len(sidecar.spans()) == made == 6 + 3


def test_an_error_call_has_an_error_status(sidecar_at, host) -> None:
    sidecar = sidecar_at()
    provider, _ = host
    with provider.get_tracer("host").start_as_current_span("agent turn") as host_span, \
            pytest.raises(grpc.RpcError) as raised:
        sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="nowhere", iteration=1), metadata=traceparent())
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    span = server_span(sidecar.spans())
    assert span.context.trace_id == host_span.get_span_context().trace_id
    assert span.status.status_code == StatusCode.ERROR and span.status.description == "NOT_FOUND"
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert "contextsidecar.iteration" not in span.attributes  # no answer, no figures
    # A refused turn's phase fails with it: its span says how.
    sidecar.stub.OpenRun(pb.OpenRunRequest(run_id="narrow", transcript_window=1))
    with pytest.raises(grpc.RpcError) as raised:
        sidecar.stub.AssembleContext(pb.AssembleContextRequest(run_id="narrow", iteration=1, append_events=[
            ev("u1"), ev("u2")]))
    refused = [s for s in sidecar.spans() if s.kind == SpanKind.SERVER][-1]
    assert refused.name == ASSEMBLE and refused.status.status_code == StatusCode.ERROR
    select = [s for s in sidecar.spans() if s.name == "select"][-1]
    assert select.parent.span_id == refused.context.span_id
    assert select.status.status_code == StatusCode.ERROR and select.status.description == "TranscriptWindowExceeded"
    assert refused.status.description == raised.value.code().name


def test_a_stream_is_one_span_to_its_end(sidecar_at, host) -> None:
    sidecar = sidecar_at()
    provider, _ = host
    with provider.get_tracer("host").start_as_current_span("agent turn") as host_span:
        watch = sidecar.stub.WatchEvents(pb.WatchEventsRequest(), metadata=traceparent())
    watch.initial_metadata()  # the watch has begun
    assert not [s for s in sidecar.spans() if s.kind == SpanKind.SERVER]  # open: not ended yet
    watch.cancel()
    deadline = time.monotonic() + 10
    while not sidecar.spans() and time.monotonic() < deadline:
        time.sleep(0.01)
    span = server_span(sidecar.spans(), "contextsidecar.v1.ContextSidecar/WatchEvents")
    assert span.parent.span_id == host_span.get_span_context().span_id
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
    assert span.status.description == "CANCELLED"


def test_a_server_without_tracing_makes_no_span_and_phases_outside_a_call_do_nothing(sidecar_at, host) -> None:
    plain, traced = sidecar_at("plain", traced=False), sidecar_at("traced")
    provider, host_spans = host
    with provider.get_tracer("host").start_as_current_span("agent turn"):
        plain.stub.AssembleContext(turn(), metadata=traceparent())
    assert plain.tracing is None and plain.spans() == () and traced.spans() == ()
    assert len(host_spans.get_finished_spans()) == 1  # the host's own, nothing of the sidecar
    assert tracing.phase("select") is tracing.phase("commit")  # the one shared do-nothing
    tracing.set_attributes(iteration=1)  # no call traced: nothing to set, nothing raised


def test_with_tracing_off_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    """A server, tracing off (the default), serves a turn in a process of its own; not one
    OpenTelemetry module is loaded."""
    script = textwrap.dedent(f"""
        import sys
        import grpc
        from context_sidecar_client.v1 import sidecar_pb2 as pb, sidecar_pb2_grpc as pb_grpc
        from sidecar.settings import load_settings
        from sidecar.wire import server as server_module
        settings = load_settings(None, env={{}}, overrides={{("server", "listen"): "127.0.0.1:0",
                                                            ("storage", "path"): {str(tmp_path / "lmdb")!r}}})
        services = server_module.Services.open(settings)
        server, port, health_servicer = server_module.build_server(settings, services, server_module.InFlightCalls())
        server_module.start(server, health_servicer)
        stub = pb_grpc.ContextSidecarStub(grpc.insecure_channel(f"127.0.0.1:{{port}}"))
        answer = stub.AssembleContext(pb.AssembleContextRequest(run_id="r", iteration=1, render="openai_responses",
            append_events=[pb.Event(event_id="u1", role="user", content="hello")]),
            metadata=(("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),))
        assert answer.rendered
        print(sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry"))
        server.stop(None).wait()
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_tracing_on_without_the_extra_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    """OpenTelemetry made unimportable, as where the otel extra is not installed: the sidecar
    says so and exits 2 before it opens the store."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        class NoOpenTelemetry:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "opentelemetry":
                    raise ImportError(f"No module named {name!r}")
        sys.meta_path.insert(0, NoOpenTelemetry())
    """))
    data = tmp_path / "data"
    done = run_cli(tmp_path, "serve", "--tracing", "--listen", "127.0.0.1:0", "--storage-path", str(data),
                   env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert done.returncode == 2, done.stderr
    assert "configuration error: [tracing] enabled needs the otel extra" in done.stderr
    assert "pip install 'context-sidecar[otel]'" in done.stderr
    assert not data.exists()


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver, as a collector has one."""

    def __init__(self) -> None:
        self.received: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.arrived = threading.Event()

    def Export(self, request, context):  # noqa: N802 (the service's method name)
        self.received.append(request)
        self.arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()


def test_a_sidecar_with_an_otlp_endpoint_exports_its_spans_there(tmp_path: Path) -> None:
    collector = Collector()
    receiver = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, receiver)
    port = receiver.add_insecure_port("127.0.0.1:0")
    receiver.start()
    try:
        sidecar = Sidecar(tmp_path, "--tracing", "--otlp-endpoint", f"http://127.0.0.1:{port}")
        trace_id = "0af7651916cd43dd8448eb211c80319c"
        sidecar.stub.AssembleContext(turn(), metadata=(("traceparent", f"00-{trace_id}-b7ad6b7169203331-01"),))
        code, stderr = sidecar.stop()  # a stop exports what is still batched
        assert code == 0, stderr
        assert collector.arrived.wait(10)
    finally:
        receiver.stop(None)
    exported = [(resource.resource, span) for request in collector.received for resource in request.resource_spans
                for scope in resource.scope_spans for span in scope.spans]
    assert {attribute.value.string_value for resource, _ in exported for attribute in resource.attributes
            if attribute.key == "service.name"} == {"context-sidecar"}
    server = [span for _, span in exported if span.name == ASSEMBLE]
    assert len(server) == 1 and server[0].trace_id.hex() == trace_id and server[0].parent_span_id.hex() == \
        "b7ad6b7169203331"
    assert {span.name for _, span in exported if span.parent_span_id == server[0].span_id} == {
        "commit", "count", "read", "render", "select"}


def test_a_sidecar_with_the_console_exporter_prints_its_spans(tmp_path: Path) -> None:
    sidecar = Sidecar(tmp_path, "--tracing", "--tracing-exporter", "console")
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    sidecar.stub.AssembleContext(turn(), metadata=(("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),))
    sidecar.process.send_signal(signal.SIGTERM)
    printed, _ = sidecar.process.communicate(timeout=60)
    sidecar.channel.close()
    assert sidecar.process.returncode == 0, sidecar.log()
    # One JSON object a line, each a span (stdout's banner was read before the call).
    spans = [json.loads(line) for line in printed.splitlines()]
    server = [span for span in spans if span["name"] == ASSEMBLE]
    assert len(server) == 1, printed
    assert server[0]["context"]["trace_id"] == f"0x{trace_id}"
    assert server[0]["parent_id"] == "0x00f067aa0ba902b7"
    assert server[0]["resource"]["attributes"]["service.name"] == "context-sidecar"
    assert {span["name"] for span in spans if span["parent_id"] == server[0]["context"]["span_id"]} == {
        "commit", "count", "read", "render", "select"}
