"""Traces with OpenTelemetry, the optional extra ``otel`` (``pip install 'context-sidecar[otel]'``).

Off (``[tracing] enabled = false``, the default), nothing of OpenTelemetry is imported: the server
composes no wrap, and :func:`phase` and :func:`set_attributes`, which the areas call, find no
traced call in progress (one context-variable read) and do nothing.

On, :meth:`Tracing.start` makes a TracerProvider of the sidecar's own (``service.name``
context-sidecar; the process's global provider is left alone), exporting over OTLP/gRPC to
``[tracing] otlp_endpoint`` in batches when one is set (spans are made but go nowhere otherwise),
or with ``[tracing] exporter = "console"`` printing each span on stdout as it ends.
Each RPC is then one SERVER span named ``<service>/<method>`` with the RPC semantic conventions'
attributes (``rpc.system``, ``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``), whose
parent is the caller's span when the call's metadata carries a W3C ``traceparent`` (and
``tracestate``). A unary call's phases that cost are its child spans (:func:`phase`), and the
figures of its answer are the span's attributes (:func:`set_attributes`, as ``contextsidecar.*``).
A call the caller's trace did not sample records nothing. Spans carry no run ids, texts or tokens.

This module imports nothing of grpc: the call's context is read through its ServicerContext
methods (``invocation_metadata``, ``code``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.settings import ConfigError, TracingSettings

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

SERVICE_NAME = "context-sidecar"
ATTRIBUTE_PREFIX = "contextsidecar."
# The W3C Trace Context headers, as gRPC metadata keys (lowercase).
TRACE_HEADERS = ("traceparent", "tracestate")
# The status of a call that raised without setting one: grpc answers UNKNOWN then; a stream
# closed by the caller (GeneratorExit) ends CANCELLED.
UNKNOWN, CANCELLED = (2, "UNKNOWN"), (1, "CANCELLED")

Behavior = Callable[[Any, Any], Any]


@dataclass(slots=True)
class _Call:
    """A traced call in progress: its span, and the context its phases are children in."""

    tracing: Tracing
    span: Span
    context: Context


# The traced call the current thread serves (gRPC serves a unary call in one pool thread).
_CALL: ContextVar[_Call | None] = ContextVar("contextsidecar_traced_call", default=None)
_NO_PHASE: AbstractContextManager[None] = nullcontext()


def phase(name: str) -> AbstractContextManager[None]:
    """A child span of the traced call for the work inside ``with``; nothing when no call is
    traced. One per phase of a call (never one per event)."""
    call = _CALL.get()
    if call is None:
        return _NO_PHASE
    return _Phase(call, name)


def set_attributes(**figures: int | str) -> None:
    """The traced call's span gets each figure as ``contextsidecar.<name>``; nothing when no call
    is traced. Figures only: never ids, texts or anything of a tenant's."""
    call = _CALL.get()
    if call is not None:
        call.span.set_attributes({ATTRIBUTE_PREFIX + name: value for name, value in figures.items()})


class _Phase:
    __slots__ = ("_call", "_name", "_span")

    def __init__(self, call: _Call, name: str) -> None:
        self._call, self._name = call, name

    def __enter__(self) -> None:
        self._span = self._call.tracing.tracer.start_span(self._name, context=self._call.context)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: Any) -> None:
        if kind is not None:
            self._call.tracing.failed(self._span, kind.__name__)
        self._span.end()


class Tracing:
    """The sidecar's tracer: made by :meth:`start` when ``[tracing] enabled``; :meth:`rpcs` gives
    the wrap the server composes; :meth:`shutdown` exports what is batched."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        from opentelemetry.trace.status import Status, StatusCode

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("sidecar.telemetry.tracing")
        self._propagator = TraceContextTextMapPropagator()
        self._server_kind = trace.SpanKind.SERVER
        self._in_context = trace.set_span_in_context
        self._status, self._error = Status, StatusCode.ERROR

    @classmethod
    def start(cls, settings: TracingSettings, processor: SpanProcessor | None = None) -> Tracing | None:
        """None when tracing is off (and then nothing of OpenTelemetry is imported). Raises
        ConfigError, naming the extra, when it is on and OpenTelemetry is not installed.
        ``processor``: a span processor of the caller's (a test's in-memory exporter), beside the
        OTLP exporter that ``otlp_endpoint`` configures."""
        if not settings.enabled:
            return None
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
            if settings.otlp_endpoint:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as error:
            raise ConfigError(
                f"[tracing] enabled needs the otel extra, which is not installed ({error}): "
                "pip install 'context-sidecar[otel]'") from None
        provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        if settings.exporter == "console":  # each span as it ends: for a person reading them
            # One line a span (the exporter indents by default): stdout stays one JSON object a
            # line, as the JSON log format promises, and a reader can take it line by line.
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
                formatter=lambda span: span.to_json(indent=None) + "\n")))
        elif settings.otlp_endpoint:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint)))
        if processor is not None:
            provider.add_span_processor(processor)
        return cls(provider)

    def shutdown(self) -> None:
        """Export the spans still batched, then stop the exporter."""
        self.provider.shutdown()

    def failed(self, span: Span, description: str) -> None:
        span.set_status(self._status(self._error, description))

    def rpcs(self, service: str) -> Callable[[Behavior], Behavior]:
        """The wrap of ``service``'s methods: each call a SERVER span, joined to the caller's trace."""

        def wrap(behavior: Behavior) -> Behavior:
            method = behavior.__name__
            name = f"{service}/{method}"
            attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
            if inspect.isgeneratorfunction(behavior):
                def traced_stream(request: Any, context: Any) -> Iterator[Any]:
                    # A stream's span covers it whole; its messages are not phases.
                    span = self._server_span(name, attributes, context)
                    try:
                        yield from behavior(request, context)
                    except GeneratorExit:
                        self._end(span, context.code(), CANCELLED)
                        raise
                    except BaseException:
                        self._end(span, context.code(), UNKNOWN)
                        raise
                    # A stream that ended because its caller went away (a watch cancelled) says so.
                    self._end(span, context.code(), None if context.is_active() else CANCELLED)
                return traced_stream

            def traced(request: Any, context: Any) -> Any:
                span = self._server_span(name, attributes, context)
                token = _CALL.set(_Call(self, span, self._in_context(span)) if span.is_recording() else None)
                try:
                    answer = behavior(request, context)
                except BaseException:
                    self._end(span, context.code(), UNKNOWN)
                    raise
                finally:
                    _CALL.reset(token)
                self._end(span, context.code(), None)
                return answer
            return traced

        return wrap

    def _server_span(self, name: str, attributes: dict[str, str], context: Any) -> Span:
        carrier = {key: value for key, value in context.invocation_metadata() or () if key in TRACE_HEADERS}
        parent = self._propagator.extract(carrier) if carrier else None
        return self.tracer.start_span(name, context=parent, kind=self._server_kind, attributes=attributes)

    def _end(self, span: Span, code: Any, otherwise: tuple[int, str] | None) -> None:
        """``code``: the grpc.StatusCode the call set (an abort sets it, then raises); None: OK,
        or ``otherwise`` (when the call raised, or its caller went away)."""
        number, status = (code.value[0], code.name) if code is not None else otherwise or (0, "OK")
        span.set_attribute("rpc.grpc.status_code", number)
        if number:
            self.failed(span, status)
        span.end()
