"""Prometheus metrics: each server's own registry, the RPC wrap, the areas' recording functions,
and the HTTP endpoint that serves /metrics (``[metrics] listen``; off by default).

A server with metrics on builds one :class:`Metrics` (its own ``CollectorRegistry``, never the
global default, so several servers in one process, tests among them, never share a figure).
The areas do not hold it: they call this module's functions (``turn_fed``, ``summary_recorded``,
...), which record into the metrics of the server whose call is running. :meth:`Metrics.wrap`
binds them around each RPC (a context variable, so the binding follows the call's thread and
nothing else), and :meth:`Metrics.bound` around what a server starts itself (the background
job's thread). With metrics off nothing binds them, and each function is one failed check.

A figure recorded inside a write transaction counts only once that transaction commits: the
store holds it (:func:`transaction_begins`, :func:`transaction_ends`), so a transaction that
fails or is run again (the map grew) counts once or not at all.

Labels stay bounded: RPC names and status codes, detector kinds, who summarised, a compaction's
trigger, the job's name, a cache break's reason; never a tenant, run id, ref, secret id or text.
What is read, not counted (the store's map, live watchers), is read at scrape time by a
collector, so the hot path keeps no books for it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

import sidecar

PREFIX = "context_sidecar_"
RPC_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
               10.0, 30.0, 60.0)
TOKENS = tuple(float(1 << n) for n in range(8, 21))  # 256 .. 1,048,576
RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
SUMMARISERS = ("host", "built-in", "plugin", "replay")  # who recorded a summary (a compaction record's "by")
COMPACTION_TRIGGERS = ("client-requested", "host-managed")
JOBS = ("memory_compaction",)
REGISTERED = "registered"  # the kind of every registered secret: its id is the host's, so never a label

_current: ContextVar[Metrics | None] = ContextVar("context_sidecar_metrics", default=None)
_held: ContextVar[list | None] = ContextVar("context_sidecar_metrics_held", default=None)


class CacheFigures(Protocol):
    """What one in-process cache reports (sidecar.caching.CacheFigures, read at scrape time)."""

    @property
    def name(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def entries(self) -> int: ...
    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...
    @property
    def evictions(self) -> int: ...


class Metrics:
    """One server's metrics: its registry, its metric objects, the state it reads at scrape time."""

    def __init__(self, store_usage: Callable[[], tuple[int, int]] | None = None, store_max_bytes: int = 0,
                 live_watches: Callable[[], int] | None = None,
                 caches: Callable[[], Iterable[CacheFigures]] | None = None) -> None:
        """``store_usage``: (bytes in use, map size) of the store; ``store_max_bytes``: the most
        the map may grow to (0: the disk); ``live_watches``: how many WatchEvents streams are open;
        ``caches``: each in-process cache's figures."""
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # process_*: CPU seconds, resident memory, open files
        # context_sidecar_build_info{version,python,grpc} 1: what runs, for a dashboard to group by.
        # grpc's version is its installed distribution's (only the wire imports grpc itself).
        Info(PREFIX + "build", "The versions running: the sidecar's, Python's and grpcio's",
             registry=registry).info({"version": sidecar.__version__, "python": platform.python_version(),
                                      "grpc": importlib.metadata.version("grpcio")})
        self._rpc = Histogram(PREFIX + "rpc_duration_seconds", "Time to serve one RPC, by method and final status "
                              "code (a WatchEvents stream: its whole life)", ("method", "code"),
                              buckets=RPC_SECONDS, registry=registry)
        self._rpc_children: dict[tuple[str, str], Any] = {}
        self._transcript = Histogram(PREFIX + "turn_transcript_tokens", "Transcript tokens fed by one AssembleContext "
                                     "answer (its token_count)", buckets=TOKENS, registry=registry)
        self._window = Histogram(PREFIX + "turn_window_tokens", "Everything one AssembleContext answer feeds: "
                                 "sections, tools and transcript (its window_tokens)", buckets=TOKENS,
                                 registry=registry)
        self._fill = Histogram(PREFIX + "turn_window_fill_ratio", "The share of the transcript budget one "
                               "AssembleContext answer uses (token_count / token_budget)", buckets=RATIOS,
                               registry=registry)
        self._stable_share = Histogram(PREFIX + "turn_stable_prefix_ratio", "The share of one AssembleContext "
                                       "request that repeats the previous one (cache.stable_prefix_tokens / "
                                       "cache.request_tokens)", buckets=RATIOS, registry=registry)
        self._stable_tokens = Counter(PREFIX + "turn_stable_prefix_tokens_total", "Tokens of AssembleContext "
                                      "requests that repeat the previous request (cache.stable_prefix_tokens)",
                                      registry=registry)
        self._breaks = Counter(PREFIX + "turn_cache_breaks_total", "AssembleContext requests that do not repeat "
                               "all of the previous one, by cache.break_reason (up to its ':')", ("reason",),
                               registry=registry)
        self._summaries = Counter(PREFIX + "summaries_total", "Summaries recorded, by who made them: host "
                                  "(RecordSummary), built-in (the extractive summariser), plugin, replay (a "
                                  "replay fork recording its source's)", ("by",), registry=registry)
        self._clearings = Counter(PREFIX + "clearings_total", "Tool-result clearings recorded", registry=registry)
        self._cleared_results = Counter(PREFIX + "cleared_tool_results_total", "Tool results cleared",
                                        registry=registry)
        self._cleared_tokens = Counter(PREFIX + "cleared_tokens_total", "Tokens freed by clearings (the results' "
                                       "tokens less their placeholders')", registry=registry)
        self._compactions = Counter(PREFIX + "memory_compactions_total", "Memory compactions recorded, by "
                                    "trigger (client-requested: CompactMemory; host-managed: the background job)",
                                    ("trigger",), registry=registry)
        self._compacted = Counter(PREFIX + "memory_compacted_entries_total", "Memory entries distilled away "
                                  "by compactions (their sources)", registry=registry)
        self._redactions = Counter(PREFIX + "redactions_total", "Secrets redacted, by kind: a detector's kind, or "
                                   "'registered' for any registered secret", ("kind",), registry=registry)
        self._job_runs = Counter(PREFIX + "background_job_runs_total", "Rounds a background job ran", ("job",),
                                 registry=registry)
        self._job_failures = Counter(PREFIX + "background_job_failures_total", "Rounds of a background job that "
                                     "failed (an exception ended the round)", ("job",), registry=registry)
        for by in SUMMARISERS:
            self._summaries.labels(by)
        for trigger in COMPACTION_TRIGGERS:
            self._compactions.labels(trigger)
        for job in JOBS:
            self._job_runs.labels(job)
            self._job_failures.labels(job)
        registry.register(_StateCollector(store_usage, store_max_bytes, live_watches))
        if caches is not None:
            registry.register(_CacheCollector(caches))

    # -- the RPC wrap ---------------------------------------------------------------------------

    def wrap(self, behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """``behavior`` (a servicer's bound method, its __name__ the RPC's) timed by final status
        code, with this server's metrics bound while it runs (streams: while they yield)."""
        method = behavior.__name__
        if inspect.isgeneratorfunction(behavior):
            @functools.wraps(behavior)
            def observed_stream(request: Any, context: Any) -> Iterator[Any]:
                bound = _current.set(self)
                start = time.perf_counter()
                code = "OK"
                try:
                    yield from behavior(request, context)
                    # A stream that ends because its caller left (cancelled, or past its deadline)
                    # ended for the caller with that, not with OK.
                    code = _code_after(context) if context.is_active() else "CANCELLED"
                except GeneratorExit:  # the caller went away: grpc stops asking for messages
                    code = "CANCELLED"
                    raise
                except BaseException:
                    code = _code_raised(context)
                    raise
                finally:
                    self._observe(method, code, time.perf_counter() - start)
                    _unbind(bound)
            return observed_stream

        @functools.wraps(behavior)
        def observed(request: Any, context: Any) -> Any:
            bound = _current.set(self)
            start = time.perf_counter()
            try:
                answer = behavior(request, context)
            except BaseException:
                self._observe(method, _code_raised(context), time.perf_counter() - start)
                raise
            finally:
                _current.reset(bound)
            self._observe(method, _code_after(context), time.perf_counter() - start)
            return answer
        return observed

    def _observe(self, method: str, code: str, seconds: float) -> None:
        child = self._rpc_children.get((method, code))
        if child is None:
            child = self._rpc_children.setdefault((method, code), self._rpc.labels(method, code))
        child.observe(seconds)

    @contextmanager
    def bound(self) -> Iterator[None]:
        """Bind these metrics in this thread (a thread started inside inherits them if it runs in a
        copy of this context: see the background job)."""
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)

    # -- the recordings, called by the module's functions below -----------------------------------

    def _turn(self, transcript_tokens: int, transcript_budget: int, window_tokens: int, stable_prefix_tokens: int,
              request_tokens: int, break_reason: str) -> None:
        self._transcript.observe(transcript_tokens)
        self._window.observe(window_tokens)
        if transcript_budget:
            self._fill.observe(transcript_tokens / transcript_budget)
        if request_tokens:
            self._stable_share.observe(stable_prefix_tokens / request_tokens)
        self._stable_tokens.inc(stable_prefix_tokens)
        if break_reason:
            self._breaks.labels(break_reason.partition(":")[0]).inc()

    def _cleared(self, results: int, tokens_freed: int) -> None:
        self._clearings.inc()
        self._cleared_results.inc(results)
        self._cleared_tokens.inc(tokens_freed)

    def _memory_compacted(self, trigger: str, sources: int) -> None:
        self._compactions.labels(trigger).inc()
        self._compacted.inc(sources)

    def _redacted(self, kinds: tuple[str, ...], registered: int) -> None:
        if registered:
            self._redactions.labels(REGISTERED).inc(registered)
        for kind in kinds:
            self._redactions.labels(kind).inc()

    def _job_ran(self, job: str, failed: bool) -> None:
        self._job_runs.labels(job).inc()
        if failed:
            self._job_failures.labels(job).inc()

    # -- the endpoint ---------------------------------------------------------------------------

    def serve(self, listen: str) -> Endpoint:
        """Serve /metrics over HTTP on ``listen`` (host:port; port 0 picks a free one), on a thread."""
        host, _, port = listen.rpartition(":")
        bare = host.strip("[]")
        family = socket.getaddrinfo(bare, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
        app = _only_metrics(make_wsgi_app(self.registry))
        try:
            httpd: ThreadingWSGIServer = make_server(bare, int(port), app, server_class, handler_class=_QuietHandler)
        except OSError as error:
            raise OSError(f"cannot serve metrics on {listen}: {error.strerror or error}") from None
        thread = threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True)
        thread.start()
        return Endpoint(f"http://{host}:{httpd.server_port}/metrics", httpd, thread)


@dataclass(frozen=True)
class Endpoint:
    """The running /metrics endpoint: its URL (the port chosen for :0) and how to stop it."""

    url: str
    _httpd: ThreadingWSGIServer
    _thread: threading.Thread

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def _only_metrics(app: Callable) -> Callable:
    def serve(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/metrics":
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"the sidecar's metrics are at /metrics\n"]
    return serve


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape every few seconds is no news
        pass


class _StateCollector(Collector):
    """What is read rather than counted, at scrape time: the store's map, the live watches."""

    def __init__(self, store_usage: Callable[[], tuple[int, int]] | None, store_max_bytes: int,
                 live_watches: Callable[[], int] | None) -> None:
        self._store_usage, self._store_max, self._live_watches = store_usage, store_max_bytes, live_watches

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self._store_usage is not None:
            used, size = self._store_usage()
            yield GaugeMetricFamily(PREFIX + "store_used_bytes", "Bytes of the LMDB map in use", value=used)
            yield GaugeMetricFamily(PREFIX + "store_map_size_bytes", "The LMDB map's size now (it grows by itself)",
                                    value=size)
            yield GaugeMetricFamily(PREFIX + "store_max_map_size_bytes", "The most the map may grow to "
                                    "([storage] max_map_size; 0: as large as the disk allows)", value=self._store_max)
        if self._live_watches is not None:
            yield GaugeMetricFamily(PREFIX + "watchers", "WatchEvents streams open now", value=self._live_watches())


class _CacheCollector(Collector):
    """Each in-process cache's bytes, bound and counts, labelled by the cache's name (docs/caches.md)."""

    def __init__(self, caches: Callable[[], Iterable[CacheFigures]]) -> None:
        self._caches = caches

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        figures = list(self._caches())
        gauges = (("bytes", "Bytes an in-process cache holds now, its entries' own included", "bytes"),
                  ("max_bytes", "The most bytes an in-process cache may hold (0: it is off)", "max_bytes"),
                  ("entries", "Entries an in-process cache holds now", "entries"))
        for name, help, field in gauges:
            family = GaugeMetricFamily(PREFIX + "cache_" + name, help, labels=("cache",))
            for figure in figures:
                family.add_metric((figure.name,), getattr(figure, field))
            yield family
        counters = (("hits", "Lookups an in-process cache answered", "hits"),
                    ("misses", "Lookups an in-process cache did not answer (the value was made again)", "misses"),
                    ("evictions", "Entries an in-process cache dropped to stay within its bounds", "evictions"))
        for name, help, field in counters:
            counter = CounterMetricFamily(PREFIX + "cache_" + name, help, labels=("cache",))
            for figure in figures:
                counter.add_metric((figure.name,), getattr(figure, field))
            yield counter


def _code_after(context: Any) -> str:
    """The status a call that returned ends with: OK unless the method set another."""
    code = getattr(context, "code", lambda: None)()
    return "OK" if code is None else code.name


def _code_raised(context: Any) -> str:
    """The status a call that raised ends with: what an abort set, else grpc's UNKNOWN."""
    code = getattr(context, "code", lambda: None)()
    return "UNKNOWN" if code is None else code.name


def _unbind(token: Token) -> None:
    try:
        _current.reset(token)
    except ValueError:  # a stream closed from another thread than the one that began it
        pass


# -- what the store calls around each write transaction --------------------------------------------

@dataclass(frozen=True, slots=True)
class Held:
    token: Token
    actions: list


def transaction_begins() -> Held | None:
    """Before a write transaction: what is recorded inside it waits for its end. None: metrics are off."""
    if _current.get() is None:
        return None
    actions: list = []
    return Held(_held.set(actions), actions)


def transaction_ends(held: Held | None, committed: bool) -> None:
    """After it: what it recorded counts if it committed, and is dropped if not."""
    if held is None:
        return
    _held.reset(held.token)
    if committed:
        for action, args in held.actions:
            action(*args)


def _record(action: Callable[..., None], *args: Any) -> None:
    held = _held.get()
    if held is None:
        action(*args)
    else:
        held.append((action, args))


# -- what the areas call: one line each, a failed check when metrics are off -----------------------

def turn_fed(transcript_tokens: int, transcript_budget: int, window_tokens: int, stable_prefix_tokens: int,
             request_tokens: int, break_reason: str) -> None:
    """One AssembleContext answer: its transcript tokens and budget, everything it feeds, the tokens
    that repeat the previous request of the request's (counted as its provider does) and why not
    more ("": all of it is repeated)."""
    metrics = _current.get()
    if metrics is not None:
        _record(metrics._turn, transcript_tokens, transcript_budget, window_tokens, stable_prefix_tokens,
                request_tokens, break_reason)


def summary_recorded(by: str) -> None:
    """A summary was recorded; ``by``: host, built-in, plugin or replay."""
    metrics = _current.get()
    if metrics is not None:
        _record(metrics._summaries.labels(by).inc)


def tool_results_cleared(results: int, tokens_freed: int) -> None:
    """A clearing was recorded: how many tool results it cleared, how many tokens it freed."""
    metrics = _current.get()
    if metrics is not None:
        _record(metrics._cleared, results, tokens_freed)


def memory_compacted(trigger: str, sources: int) -> None:
    """A memory compaction was recorded (client-requested or host-managed), distilling ``sources`` entries."""
    metrics = _current.get()
    if metrics is not None:
        _record(metrics._memory_compacted, trigger, sources)


def secrets_redacted(kinds: Sequence[str], registered: int = 0) -> None:
    """A text was redacted: each detector kind once per occurrence, and ``registered`` occurrences of
    registered secrets (counted under one kind: never their ids)."""
    metrics = _current.get()
    if metrics is not None:
        _record(metrics._redacted, tuple(kinds), registered)


def job_ran(job: str, failed: bool) -> None:
    """A background job's round ended, failed or not."""
    metrics = _current.get()
    if metrics is not None:
        _record(metrics._job_ran, job, failed)

