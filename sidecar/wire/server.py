"""The gRPC server: built by a function that returns (server, port), health and reflection
registered under names read from the descriptors, SIGTERM handled gracefully.

Reflection answers under both names clients use: grpc.reflection.v1alpha.ServerReflection
(grpcio-reflection's) and grpc.reflection.v1.ServerReflection (grpcurl, Postman and grpc-java's
tools ask for v1 first; grpcio-reflection has no v1 yet, grpc/grpc#38576). The two protocols are
the same messages under another package name, so one handler serves both. Its descriptors are the
ones protoc wrote with source comments (sidecar_descriptors.binpb), so a reflection client shows
each RPC's and field's documentation."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
from context_sidecar_client.v1 import sidecar_pb2 as pb
from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from sidecar.caching import Caches
from sidecar.context_window.policy import load_policy
from sidecar.context_window.state import StateSchemas
from sidecar.errors import SharedStoreUnavailable, SidecarError
from sidecar.memory.api import Memories
from sidecar.memory.compaction import BackgroundJob, Compactor
from sidecar.settings import ConfigError, Settings, unix_path, unix_socket_gid, unix_socket_mode
from sidecar.storage.environment import Store
from sidecar.storage.shared import SharedStore
from sidecar.telemetry import logs
from sidecar.telemetry.metrics import Metrics
from sidecar.telemetry.tracing import Tracing
from sidecar.tenant_events.log import TenantEventLog
from sidecar.text.counting import Counters
from sidecar.text.redaction import Redactor
from sidecar.transcript.reassembly import REASSEMBLIES
from sidecar.transcript.run_context import RunContexts
from sidecar.transcript.transcripts import Transcripts
from sidecar.wire.auth import TenantOf
from sidecar.wire.capabilities import capability_document
from sidecar.wire.freshness import freshening
from sidecar.wire.servicer import ContextSidecarServicer, add_servicer_to_server
from sidecar.wire.tls import ServerCertificates

log = logging.getLogger(__name__)
SIGNAL_POLL_SECONDS = 0.2  # at most this long between SIGTERM and the start of the drain
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ContextSidecar"].full_name
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
# The API's FileDescriptorSet and google/rpc's (so a reflection client decodes error details),
# imports and source comments included (scripts/generate_stubs.py).
DESCRIPTORS = resources.files("sidecar.pb.contextsidecar.v1").joinpath("sidecar_descriptors.binpb")


@dataclass
class Services:
    """The domain, opened and ready: store open, both encodings loaded."""

    store: Store
    counters: Counters
    transcripts: Transcripts
    memories: Memories
    redactor: Redactor
    events: TenantEventLog
    compactor: Compactor | None  # the memory compactor; None: [memory.compaction] is off
    caches: Caches = field(default_factory=Caches)  # every in-process cache (docs/caches.md)

    @classmethod
    def open(cls, settings: Settings) -> Services:
        storage = settings.storage
        counters = Counters(Path(settings.context.encodings_dir) if settings.context.encodings_dir else None)
        shared = None
        try:
            if storage.shared:
                shared = SharedStore(storage.shared, storage.shared_pool_size, storage.shared_timeout)
            store = Store(storage.path, storage.map_size, storage.max_map_size, storage.sync, shared)
        except SharedStoreUnavailable as error:  # unreachable, or a schema this sidecar does not know
            raise ConfigError(f"[storage] shared: {error.message}") from None
        except ValueError as error:  # a store of another layout or another shared store: say which
            if shared:
                shared.close()
            raise ConfigError(str(error)) from None
        return cls.build(settings, store, counters)

    @classmethod
    def build(cls, settings: Settings, store: Store, counters: Counters,
              clock: Callable[[], float] = time.time) -> Services:
        """The domain over ``store``; ``clock`` tells the turns the time (a test's own, to pause
        for minutes without waiting)."""
        caches = caches_of(settings)
        redactor = Redactor(settings.redaction.detectors, caches)
        memories = Memories(store, counters, settings.memory, redactor)
        # Each open watch holds one of the server's threads: at most half of them, so that the
        # other calls are always served (a single thread serves no watch).
        events = TenantEventLog(store, settings.server.max_workers // 2)
        memory_compactor = (Compactor(memories, events, settings.memory_compaction)
                            if settings.memory_compaction.enabled else None)
        try:
            policy = load_policy(settings.context.plugin)
            schemas = StateSchemas.load(settings.context.state_schemas_dir, policy.state_schemas)
        except (ValueError, ImportError, SidecarError) as error:  # a plugin or schema that cannot serve
            store.close()
            raise ConfigError(str(error)) from None
        run_contexts = RunContexts(store, counters, settings.context, redactor, policy, schemas, caches)
        transcripts = Transcripts(store, counters, settings.context, redactor, run_contexts,
                                  settings.context_clearing, settings.render, clock, caches)
        return cls(store, counters, transcripts, memories, redactor, events, memory_compactor, caches)

    def close(self) -> None:
        self.store.close()


def caches_of(settings: Settings) -> Caches:
    """The server's caches: on unless ``[cache] enabled = false``; the re-assemblies' bound is a setting."""
    return Caches(settings.cache.enabled, {REASSEMBLIES.name: settings.context.reassembly_cache})


class InFlightCalls:
    """Counts the sidecar's calls being served, so a shutdown can wait for exactly those (and not
    for long-lived health Watch streams, which would hold every stop for the full drain).
    A WatchEvents stream counts until its last message: a stop closes the watches first, so they
    end with OK rather than being cut off."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._count = 0

    def track(self, behavior: Callable[[Any, grpc.ServicerContext], Any]
              ) -> Callable[[Any, grpc.ServicerContext], Any]:
        # A call counts until gRPC has finished it, not until its handler returns: the status is
        # sent after the handler, and a stop that cut in between reset the stream (a watch ended
        # with RST_STREAM instead of OK on a loaded machine).
        if inspect.isgeneratorfunction(behavior):
            def tracked_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                self._enter(context)
                yield from behavior(request, context)
            return tracked_stream

        def tracked(request: Any, context: grpc.ServicerContext) -> Any:
            self._enter(context)
            return behavior(request, context)
        return tracked

    def _enter(self, context: grpc.ServicerContext) -> None:
        with self._idle:
            self._count += 1
        if not context.add_callback(self._leave):  # the call has already ended
            self._leave()

    def _leave(self) -> None:
        with self._idle:
            self._count -= 1
            if not self._count:
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: not self._count, timeout)


class SharedStoreHealth:
    """With a shared store: health is NOT_SERVING while it does not answer and SERVING again when
    it does, asked every ``interval`` seconds (and the calls fail UNAVAILABLE meanwhile)."""

    def __init__(self, shared: SharedStore, health_servicer: health.HealthServicer, interval: float = 1.0) -> None:
        self._shared, self._health, self._interval = shared, health_servicer, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shared-store-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No status is set from now on. A probe in progress is not waited for: it may wait on the
        database for up to [storage] shared_timeout, longer than the drain; the store's closing
        ends it (and the health servicer, shutting down by then, ignores what it would set)."""
        self._stop.set()

    def _run(self) -> None:
        serving = True
        while not self._stop.wait(self._interval):
            reachable = self._shared.ping()
            if self._stop.is_set():
                return
            if reachable != serving:
                serving = reachable
                log.warning("the shared store %s", "answers again: SERVING" if serving
                            else "does not answer: NOT_SERVING")
                answer = health_pb2.HealthCheckResponse
                for name in ("", SERVICE_NAME):
                    self._health.set(name, answer.SERVING if serving else answer.NOT_SERVING)


def reflection_v1_file() -> descriptor_pb2.FileDescriptorProto:
    """grpc/reflection/v1/reflection.proto, derived from the v1alpha file grpcio-reflection ships:
    the same messages, field for field, in package grpc.reflection.v1 (and its options likewise)."""
    text = text_format.MessageToString(descriptor_pb2.FileDescriptorProto.FromString(
        reflection_pb2.DESCRIPTOR.serialized_pb)).replace("v1alpha", "v1")
    file = text_format.Parse(text, descriptor_pb2.FileDescriptorProto())
    file.name = "grpc/reflection/v1/reflection.proto"
    file.options.ClearField("deprecated")  # v1alpha is deprecated; v1 is its replacement
    return file


class CommentedReflection:
    """grpcio-reflection's servicer over our own pool, but answering file requests with the files
    as protoc wrote them: a pool built from them forgets their source comments (CopyToProto drops
    source_code_info), so the commented files are kept beside it and sent instead."""

    def __init__(self, service_names: tuple[str, ...]) -> None:
        commented = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes()).file
        self._files_pool = descriptor_pool.DescriptorPool()
        for file in [*commented, reflection_v1_file()]:
            self._files_pool.Add(file)
        for module in (health_pb2, reflection_pb2):
            self._files_pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
        self._commented = {file.name: file.SerializeToString() for file in commented}
        self._others = reflection.ReflectionServicer(service_names, pool=self._files_pool)

    def ServerReflectionInfo(self, request_iterator: Iterator[reflection_pb2.ServerReflectionRequest],
                             context: grpc.ServicerContext) -> Iterator[reflection_pb2.ServerReflectionResponse]:
        for request in request_iterator:
            kind = request.WhichOneof("message_request")
            if kind in ("file_by_filename", "file_containing_symbol"):
                yield self._file_with_dependencies(request, kind)
            else:  # list_services and the extension queries (the API declares no extensions)
                # grpc-stubs types this generator as returning None, hence the ignore.
                answers: Iterator[reflection_pb2.ServerReflectionResponse] = self._others.ServerReflectionInfo(
                    iter((request,)), context)  # type: ignore[func-returns-value, assignment]
                yield from answers

    def _file_with_dependencies(self, request: reflection_pb2.ServerReflectionRequest,
                                kind: str) -> reflection_pb2.ServerReflectionResponse:
        try:
            pending = [self._file_of(kind, getattr(request, kind))]
        except KeyError:
            return reflection_pb2.ServerReflectionResponse(original_request=request, error_response=(
                reflection_pb2.ErrorResponse(error_code=grpc.StatusCode.NOT_FOUND.value[0],
                                             error_message=f"{kind} {getattr(request, kind)!r} not found")))
        found: dict[str, bytes] = {}
        while pending:  # the file and everything it imports, each once
            file = pending.pop()
            if file.name not in found:
                found[file.name] = self._commented.get(file.name) or self._uncommented(file)
                pending += file.dependencies
        return reflection_pb2.ServerReflectionResponse(
            original_request=request,
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(file_descriptor_proto=list(found.values())))

    def _file_of(self, kind: str, name: str) -> Any:
        if kind == "file_by_filename":
            return self._files_pool.FindFileByName(name)
        try:
            return self._files_pool.FindFileContainingSymbol(name)
        except KeyError:  # upb's pool finds no method this way, and grpcurl asks for methods (describe S.M)
            return self._files_pool.FindMethodByName(name).containing_service.file

    @staticmethod
    def _uncommented(file: Any) -> bytes:
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        return proto.SerializeToString()


def add_reflection(server: grpc.Server, service_names: tuple[str, ...]) -> None:
    """Reflection under v1alpha and v1, one servicer: the two protocols differ only in name."""
    reflection_service = CommentedReflection((*service_names, reflection.SERVICE_NAME, REFLECTION_V1))
    handlers = {"ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
        reflection_service.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)}
    for name in (reflection.SERVICE_NAME, REFLECTION_V1):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))


def servicer_for(settings: Settings, services: Services) -> ContextSidecarServicer:
    """The ContextSidecar servicer over ``services``, as every server kind registers it."""
    run_contexts = services.transcripts.contexts
    capabilities = capability_document(settings.context, settings.memory, settings.memory_compaction,
                                       run_contexts.policy.describe(), run_contexts.schemas.subsets)
    return ContextSidecarServicer(services.transcripts, services.memories, services.compactor, services.events,
                                  services.redactor, capabilities, TenantOf(settings.auth.tenants))


def build_server(settings: Settings, services: Services, in_flight: InFlightCalls | None = None,
                 tracing: Tracing | None = None,
                 metrics: Metrics | None = None, certificates: ServerCertificates | None = None,
                 ) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A server bound to ``[server] listen`` (port 0 picks a free port), not yet started.
    ``tracing``: each ContextSidecar call a span (``Tracing.start``; None: no tracing); ``metrics``:
    each call timed, and the areas' figures recorded (None: no metrics). With ``[server.tls]`` set
    the port speaks TLS only, with ``certificates`` (read from the settings when not given; the
    caller keeps them to reload)."""
    limit = settings.server.max_message_bytes
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=settings.server.max_workers, thread_name_prefix="rpc"),
        options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                 # Two sidecars must not silently share a port.
                 ("grpc.so_reuseport", 0)])
    traced = tracing.rpcs(SERVICE_NAME) if tracing else lambda behavior: behavior
    measured = metrics.wrap if metrics else lambda behavior: behavior
    current = freshening(services.store, TenantOf(settings.auth.tenants))

    def wrap(behavior: Callable) -> Callable:  # each wrap is given the servicer's method, named after the RPC
        # The log line's duration and the latency histogram exclude the span's own cost; the
        # tracing wrap goes outside them, as it does not keep the method's name. The shared
        # store's freshening is part of the call's cost, so it goes inside them all.
        observed = traced(measured(logs.logged(services.caches.binding(current(behavior)))))
        return in_flight.track(observed) if in_flight else observed

    add_servicer_to_server(servicer_for(settings, services), server, wrap)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    add_reflection(server, (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name))
    if certificates is None and settings.server_tls.enabled:
        certificates = ServerCertificates(settings.server_tls)
    try:
        if certificates is not None:
            port = server.add_secure_port(settings.server.listen, certificates.credentials())
        else:
            port = server.add_insecure_port(settings.server.listen)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {settings.server.listen}: {exc}") from None
    if settings.server.listen.startswith("unix:"):
        restrict_unix_socket(settings)
    return server, port, health_servicer


def restrict_unix_socket(settings: Settings) -> None:
    """``[server] unix_socket_mode`` and ``unix_socket_group`` given to the socket file: it exists
    once the server has bound, and no call is accepted before the server starts."""
    path = unix_path(settings.server.listen)
    gid = unix_socket_gid(settings.server.unix_socket_group)
    try:
        if gid is not None:
            os.chown(path, -1, gid)
        mode = unix_socket_mode(settings.server.unix_socket_mode)
        if mode is not None:
            os.chmod(path, mode)
    except OSError as error:  # not this process's to give: a group it is not in
        raise OSError(f"cannot set the mode or group of {path}: {error.strerror}") from None


def metrics_of(settings: Settings, services: Services) -> Metrics | None:
    """The server's metrics with [metrics] listen set (None: off), reading the store and the watches."""
    if not settings.metrics.listen:
        return None
    return Metrics(services.store.map_usage, settings.storage.max_map_size, services.events.live_watches,
                   services.caches.figures)


def start(server: grpc.Server, health_servicer: health.HealthServicer) -> None:
    """Start serving; health turns SERVING only now, after the store and encodings are ready."""
    server.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)


def bound_address(listen: str, port: int) -> str:
    if listen.startswith("unix:"):
        return listen
    host = listen.rpartition(":")[0]
    return f"{host}:{port}"


# What the entry serves beside the gRPC server, over the same domain (the run inspector, which the
# wire does not import): given the opened services, it starts serving and answers what writes the
# line that announces it (after the serving line) and what stops it.
Beside = Callable[[Services], tuple[Callable[[], None], Callable[[], None]]]


def serve(settings: Settings, ready: threading.Event | None = None, beside: Beside | None = None) -> int:
    """Run until SIGTERM or SIGINT: NOT_SERVING first, then in-flight calls get ``[server]
    drain_seconds``, and those still running are cancelled. ``beside``: served too, from before the
    gRPC server starts until after it drained. The caller exits at once after (cli.exit_at_once)."""
    tracing = Tracing.start(settings.tracing)  # enabled without the otel extra: a ConfigError, before anything opens
    # Unusable certificate files, likewise.
    certificates = ServerCertificates(settings.server_tls) if settings.server_tls.enabled else None
    services = Services.open(settings)
    in_flight = InFlightCalls()
    metrics = metrics_of(settings, services)
    server, port, health_servicer = build_server(settings, services, in_flight, tracing, metrics, certificates)
    endpoint = metrics.serve(settings.metrics.listen) if metrics else None
    companion = beside(services) if beside else None
    stopping = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        log.info("received %s: draining", signal.Signals(signum).name)
        stopping.set()

    def reload(signum: int, frame: object) -> None:
        # The operator's usual word for "read your files again"; never a stop (SIGHUP's default).
        if certificates is None:
            log.info("received SIGHUP: nothing to re-read without [server.tls]")
        else:
            certificates.reload()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGHUP, reload)
    start(server, health_servicer)
    shared_health = SharedStoreHealth(services.store.shared, health_servicer) if services.store.shared else None
    if shared_health:
        shared_health.start()
    with metrics.bound() if metrics else contextlib.nullcontext():  # the job's rounds count in them
        job = BackgroundJob(services.compactor, settings.memory_compaction.interval_seconds) \
            if services.compactor else None
    if job:
        job.start()
    # One line on stdout that a supervisor or test can wait for (it names the port chosen for :0),
    # and a second one with metrics on (the URL of /metrics, its port chosen likewise).
    # Under the JSON log format each is a JSON object with the address (url) in a field of its own.
    address = bound_address(settings.server.listen, port)
    if certificates is not None:  # a line of its own: the serving line's form is what clients parse
        log.info("TLS on, certificate %s%s", settings.server_tls.cert_file,
                 "; client certificates required (mTLS)" if certificates.mutual else "")
    logs.say(f"context-sidecar serving on {address}", address=address)
    if endpoint:
        logs.say(f"context-sidecar metrics on {endpoint.url}", url=endpoint.url)
    if companion:
        companion[0]()
    if ready is not None:
        ready.set()
    # Waits with a timeout, woken by the clock: a signal that the kernel hands to another thread
    # (gRPC's, an executor's) only marks Python's handler pending, and an untimed wait in this
    # thread then never returns to run it (a SIGTERM was missed so, now and then).
    while not stopping.wait(SIGNAL_POLL_SECONDS):
        pass
    if job:
        job.stop()  # a round in progress finishes: each compaction is one transaction
    if shared_health:
        shared_health.stop()  # before the drain: it must not turn health SERVING again
    health_servicer.enter_graceful_shutdown()
    drain = settings.server.drain_seconds
    stopped = server.stop(drain)  # refuses new calls from now on
    services.events.close_watches()  # each WatchEvents stream ends with OK: the host re-watches elsewhere
    if not in_flight.wait_idle(drain):
        log.warning("calls still running after the %.1f s drain are cancelled", drain)
    server.stop(0)  # ends what is left: health Watch streams, or calls past the drain
    stopped.wait()
    if companion:
        companion[1]()  # after the drain, before the store closes: a page being served reads it
    if endpoint:
        endpoint.stop()  # before the store closes: a scrape reads its map
    services.close()
    if tracing:
        tracing.shutdown()  # the spans still batched are exported
    log.info("stopped")
    return 0
