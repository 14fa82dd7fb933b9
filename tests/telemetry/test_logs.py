"""The log (issue 13): ``[log] format`` text or JSON, one DEBUG line per call (method, status,
duration, the trace id of its ``traceparent``), and no content or secret in any warning or error.

The promise is checked on a real sidecar process, at DEBUG, in both formats, driven through
every way a call warns or fails (malformed requests, refused fields, a wrong token, a plugin that
raises, a plugin that breaks the sidecar itself, a full store) with the SR-1 canaries and a plain
content marker in every text field; and, in process, at each place the sidecar logs a failure,
under a stock ``logging.Formatter`` (what a host or a test installs), which the sidecar's own
formatters do not protect."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc

from sidecar.context_window.policy import Policy, TriggerInput
from sidecar.errors import PluginFailed, StoreFull
from sidecar.memory.compaction import BackgroundJob, Compactor
from sidecar.telemetry import logs
from sidecar.wire.status import answers_errors
from tests.helpers import DETECTED, Sidecar, rich_error

SECRET = "tw-canary-logs-0001"  # registered as the tenant's secret
UNREGISTERED_KEY = "sk-proj-logsAbCdEfGhIjKlMnOpQrStUv0123"  # an OpenAI-shaped key the detectors know
CONTENT = "content-canary-logs-0003"  # no secret: plain content, which no warning may quote either
CANARIES = [SECRET, UNREGISTERED_KEY, CONTENT, *DETECTED.values()]
LEAK = "logs leak " + " | ".join(CANARIES)
TOKEN = "token-of-acme-logs"
CONFIG = f"""
[[auth.tenants]]
id = "acme"
token_sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"
"""
LEAKY_PLUGIN = '''"""A compaction policy whose failures quote content in their messages."""
import os

LEAK = os.environ["LEAKY_PLUGIN_TEXT"]


class Unhashable(str):
    def __hash__(self):
        raise ValueError("a section name that cannot be hashed: " + LEAK)


class Leaky:
    def trigger(self, call):
        if call.input.task_id == "plugin-raises":  # raises in the plugin: plugin_failed
            raise RuntimeError("the trigger choked on " + LEAK)

    def keep(self, call):
        if any(section.name == "skill:crash" for section in call.input.sections):
            call.result = [Unhashable("system_prompt")]  # passes the check, then breaks the sidecar: internal
'''
LINE_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$")
CALL_LINE = re.compile(r"^(\w+) ([A-Z_]+) (\d+\.\d{3}) ms(?: trace ([0-9a-f]{32}))?$")
JSON_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ALARMS = ("WARNING", "ERROR", "CRITICAL")


def spellings(plaintext: str) -> list[str]:
    """A canary as it is, and as a JSON string body (newlines and non-ASCII escaped)."""
    return list(dict.fromkeys([plaintext, json.dumps(plaintext)[1:-1],
                               json.dumps(plaintext, ensure_ascii=False)[1:-1]]))


def canaries_in(text: str) -> list[str]:
    return [needle for canary in CANARIES for needle in spellings(canary) if needle in text]


def records(log: str, format: str) -> list[dict]:
    """The log's records as dicts (level, logger, message, exception, ...; "text": all of it). A
    JSON log must be one object per line; a text record runs until the next line with a time."""
    found: list[dict] = []
    for line in log.splitlines():
        if format == "json":
            entry = json.loads(line)  # every line: a whole JSON object
            assert isinstance(entry, dict) and {"time", "level", "logger", "message"} <= set(entry), line
            assert JSON_TIME.match(entry["time"]), entry["time"]
            found.append({**entry, "text": line})
        elif (start := LINE_START.match(line)) is not None:
            found.append({"level": start[1], "logger": start[2], "message": start[3], "exception": "", "text": line})
        else:  # a traceback's line: part of the record above (a line before any record would fail here)
            assert found, f"a line outside any record: {line!r}"
            found[-1]["exception"] += line + "\n"
            found[-1]["text"] += "\n" + line
    return found


def call_lines(found: list[dict], format: str) -> list[tuple[str, str, str]]:
    """(method, status, trace id) of each per-call line, checking its duration and fields."""
    calls = []
    for record in found:
        if record["logger"] != "sidecar.requests" or record["level"] != "DEBUG":
            continue
        line = CALL_LINE.match(record["message"])
        assert line is not None, record["message"]
        if format == "json":
            assert (record["method"], record["status"], record["trace_id"]) == (line[1], line[2], line[4] or "")
            assert isinstance(record["duration_ms"], float) and record["duration_ms"] == float(line[3])
        calls.append((line[1], line[2], line[4] or ""))
    return calls


def write_leaky_plugin(site: Path) -> None:
    """An installed plugin, as pip would leave it: the module and its dist-info's entry point."""
    info = site / "leaky_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "leaky_plugin.py").write_text(LEAKY_PLUGIN)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: leaky-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[context_sidecar.plugins]\nleaky = leaky_plugin:Leaky\n")


class Caller:
    """Calls with the tenant's token and a traceparent of their own; remembers each call's
    (method, final status, trace id), as the sidecar's per-call lines should say."""

    def __init__(self, sidecar: Sidecar) -> None:
        self.channel = sidecar.channel
        self.expected: list[tuple[str, str, str]] = []

    def __call__(self, method: str, request: object, *, token: str = TOKEN, traceparent: str | None = None,
                 raw: bool = False) -> tuple[grpc.StatusCode, str]:
        trace = f"{len(self.expected) + 1:032x}"
        metadata = [("authorization", f"Bearer {token}"),
                    ("traceparent", traceparent if traceparent is not None else f"00-{trace}-00f067aa0ba902b7-01")]
        path = f"/contextsidecar.v1.ContextSidecar/{method}"
        stub = self.channel.unary_unary(path) if raw else self.channel.unary_unary(
            path, request_serializer=lambda message: message.SerializeToString())
        try:
            stub(request, metadata=metadata, timeout=30)
            code, reason = grpc.StatusCode.OK, ""
        except grpc.RpcError as error:
            code, reason, _ = rich_error(error)
        self.expected.append((method, code.name, trace if traceparent is None else ""))
        return code, reason


def drive(call: Caller) -> None:
    """Every way a call warns or fails, canaries in every text field it has."""
    invalid = (grpc.StatusCode.INVALID_ARGUMENT, "validation_error")
    assert call("RegisterSecrets", pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id="s", value=SECRET)])) == (
        grpc.StatusCode.OK, "")
    # A wrong bearer token (a secret itself), and a traceparent that is not one.
    assert call("CountTokens", pb.CountTokensRequest(texts=[LEAK]), token=SECRET)[0] == grpc.StatusCode.UNAUTHENTICATED
    assert call("CountTokens", pb.CountTokensRequest(token_counter="chars", texts=["x"]),
                traceparent=f"00-{SECRET}-{UNREGISTERED_KEY}-{CONTENT}")[0] == grpc.StatusCode.OK
    # Malformed requests: the fields parse up to a cut-off one (logged as a warning, rate-limited).
    for method, message in (("AppendEvents", pb.AppendEventsRequest(run_id=LEAK, events=[pb.Event(content=LEAK)])),
                            ("PutMemory", pb.PutMemoryRequest(memory_ref="mem:a", content=LEAK))):
        assert call(method, message.SerializeToString() + b"\x0a\x7f" + LEAK.encode()[:20], raw=True) == invalid
    # Refused fields.
    assert call("OpenRun", pb.OpenRunRequest(run_id="r", token_counter=LEAK)) == invalid
    assert call("OpenRun", pb.OpenRunRequest(run_id=LEAK)) == invalid  # a newline (the private key's)
    assert call("OpenRun", pb.OpenRunRequest(run_id="r")) == (grpc.StatusCode.OK, "")
    assert call("AppendEvents", pb.AppendEventsRequest(run_id="r", events=[
        pb.Event(event_id="e1", iteration=1, role=LEAK, content=LEAK)])) == invalid
    assert call("AppendEvents", pb.AppendEventsRequest(run_id="r", events=[
        pb.Event(event_id="e2", iteration=1, role="user", content=LEAK * 100)])) == invalid  # > max_event_bytes
    assert call("AppendEvents", pb.AppendEventsRequest(run_id="r", events=[
        pb.Event(event_id="e3", iteration=1, role="assistant", type="tool_call", call_id="k", tool_name="search",
                 content='{"q": "' + LEAK)])) == invalid  # arguments that are not JSON
    assert call("PutStateData", pb.PutStateDataRequest(run_id="r", subset="notes", json='{"a": "' + LEAK))[0] == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert call("UpdateProfile", pb.UpdateProfileRequest(run_id="r", profile=pb.Profile(tools=[pb.ToolDefinition(
        name=SECRET, description=LEAK, parameters_json='{"type": ' + json.dumps(LEAK))]))) == invalid
    assert call("PutMemory", pb.PutMemoryRequest(memory_ref="mem:a", content=LEAK, tags=[SECRET])) == invalid
    assert call("GetMemory", pb.GetMemoryRequest(memory_ref="mem:" + SECRET, entry_id=CONTENT))[0] == \
        grpc.StatusCode.NOT_FOUND
    assert call("CountTokens", pb.CountTokensRequest(token_counter=LEAK, texts=[LEAK])) == invalid
    # A plugin that raises quoting content (plugin_failed), and one that breaks the sidecar (internal).
    assert call("OpenRun", pb.OpenRunRequest(run_id="p1", summarization_supported=True, task=pb.Task(
        task_id="plugin-raises", goal=LEAK))) == (grpc.StatusCode.OK, "")
    assert call("AssembleContext", pb.AssembleContextRequest(run_id="p1", iteration=1, append_events=[
        pb.Event(event_id="u1", role="user", content=LEAK)])) == (grpc.StatusCode.INTERNAL, "plugin_failed")
    assert call("OpenRun", pb.OpenRunRequest(run_id="p2")) == (grpc.StatusCode.OK, "")
    assert call("LoadSkill", pb.LoadSkillRequest(run_id="p2", skill=pb.LoadedSkill(name="crash", body=LEAK))) == (
        grpc.StatusCode.OK, "")
    assert call("AssembleContext", pb.AssembleContextRequest(run_id="p2", iteration=1, append_events=[
        pb.Event(event_id="u1", role="user", content=LEAK)])) == (grpc.StatusCode.INTERNAL, "internal")
    # A full store (the map may not grow past 1 MiB).
    assert call("OpenRun", pb.OpenRunRequest(run_id="full")) == (grpc.StatusCode.OK, "")
    for turn in range(40):
        code, reason = call("AppendEvents", pb.AppendEventsRequest(run_id="full", events=[
            pb.Event(event_id=f"f{turn}-{i}", iteration=1, role="user", content=(LEAK + " ") * 25)
            for i in range(20)]))
        if code != grpc.StatusCode.OK:
            assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "store_full")
            break
    else:
        raise AssertionError("the store never filled up")


@pytest.mark.parametrize("format", ["text", "json"])
def test_no_warning_or_error_holds_content_or_a_secret_and_each_call_has_its_line(tmp_path: Path, format: str) -> None:
    site = tmp_path / "site"
    write_leaky_plugin(site)
    config = tmp_path / "sidecar.toml"
    config.write_text(CONFIG)
    sidecar = Sidecar(tmp_path, "--config", str(config), "--log-level", "DEBUG", "--log-format", format,
                      "--plugin", "leaky", "--token-counter", "chars", "--max-event-bytes", "16KiB",
                      "--map-size", "1MiB", "--max-map-size", "1MiB", "--no-sync",
                      env={"PYTHONPATH": f"{site}:{Path(__file__).resolve().parents[2]}", "LEAKY_PLUGIN_TEXT": LEAK})
    try:
        call = Caller(sidecar)
        drive(call)
    finally:
        code, log = sidecar.stop()
    assert code == 0, log
    found = records(log, format)

    alarms = [record for record in found if record["level"] in ALARMS]
    leaked = [(record["text"][:200], canaries_in(record["text"])) for record in alarms if canaries_in(record["text"])]
    assert not leaked, leaked
    # Nor anything else in the log: the per-call lines, INFO, DEBUG.
    assert not canaries_in(log)
    # Each failure was logged, with the frames of its traceback and never its message.
    messages = [(record["level"], record["message"]) for record in alarms]
    for name in ("AppendEventsRequest", "PutMemoryRequest"):
        assert any(level == "WARNING" and re.fullmatch(f"refused a request of \\d+ bytes that is not a valid {name}", m)
                   for level, m in messages), messages
    plugin = next(r for r in alarms if r["message"] == "plugin 'leaky': compaction.trigger raised")
    assert plugin["level"] == "ERROR"
    assert 'leaky_plugin.py", line' in plugin["exception"] and f"RuntimeError ({logs.WITHHELD})" in plugin["exception"]
    internal = next(r for r in alarms if r["message"] == "internal error in AssembleContext")
    assert internal["level"] == "ERROR" and f"ValueError ({logs.WITHHELD})" in internal["exception"]
    assert "sidecar/context_window/policy.py" in internal["exception"]
    # One DEBUG line per call, in order: its method, final status and the trace id it was sent.
    assert call_lines(found, format) == call.expected
    assert ("CountTokens", "UNAUTHENTICATED", "00000000000000000000000000000002") in call.expected
    assert ("AssembleContext", "INTERNAL", "") not in call.expected


def test_the_per_call_line_needs_debug_and_reads_the_status_and_the_trace_id() -> None:
    class Code:  # as grpc.StatusCode: an enum member with a name
        def __init__(self, name: str) -> None:
            self.name = name

    asked: list[str] = []  # what the wrap asked of a context

    class Context:
        def __init__(self, traceparent: str = "", code: Code | None = None) -> None:
            self._metadata = (("traceparent", traceparent),) if traceparent else ()
            self._code = code

        def invocation_metadata(self) -> tuple:
            asked.append("metadata")
            return self._metadata

        def code(self) -> Code | None:
            asked.append("code")
            return self._code

    def Echo(request: str, context: Context) -> str:
        if request == "fail":
            raise RuntimeError(LEAK)
        return request

    def Watch(request: str, context: Context) -> Iterator[str]:
        yield from [request] * 3

    captured: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = captured.append  # type: ignore[method-assign]
    logs.REQUESTS.addHandler(handler)
    level = logs.REQUESTS.level
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    try:
        echo, watch = logs.logged(Echo), logs.logged(Watch)
        assert echo.__name__ == "Echo" and watch.__name__ == "Watch"  # outer wraps still see the RPC's name
        logs.REQUESTS.setLevel(logging.INFO)
        assert echo(LEAK, Context(parent)) == LEAK and list(watch("x", Context())) == ["x"] * 3
        assert captured == [] and asked == []  # DEBUG off: no line, nothing read for one
        logs.REQUESTS.setLevel(logging.DEBUG)  # asked on every call: no restart needed
        assert echo(LEAK, Context(parent)) == LEAK
        assert echo("x", Context(code=Code("NOT_FOUND"))) == "x"  # a status set on the context
        with pytest.raises(RuntimeError):
            echo("fail", Context())
        assert list(watch("x", Context(parent))) == ["x"] * 3
        stream = watch("x", Context())
        next(stream)
        stream.close()  # the caller went away
        fields = [(r.method, r.status, r.trace_id) for r in captured]  # type: ignore[attr-defined]
        assert fields == [("Echo", "OK", "4bf92f3577b34da6a3ce929d0e0e4736"), ("Echo", "NOT_FOUND", ""),
                          ("Echo", "UNKNOWN", ""), ("Watch", "OK", "4bf92f3577b34da6a3ce929d0e0e4736"),
                          ("Watch", "CANCELLED", "")]
        assert re.fullmatch(r"Echo OK \d+\.\d{3} ms trace 4bf92f3577b34da6a3ce929d0e0e4736", captured[0].getMessage())
        assert all(isinstance(r.duration_ms, float) and r.duration_ms >= 0 for r in captured)  # type: ignore
        assert not canaries_in(" ".join(f"{r.getMessage()} {vars(r)}" for r in captured))
    finally:
        logs.REQUESTS.removeHandler(handler)
        logs.REQUESTS.setLevel(level)


@pytest.mark.parametrize("value, trace_id", [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"),
    (" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ", "4bf92f3577b34da6a3ce929d0e0e4736"),
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later-fields", "4bf92f3577b34da6a3ce929d0e0e4736"),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more", ""),  # version 00 has exactly 4 fields
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", ""),
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""),  # lowercase hex only
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""),  # an all-zero trace id
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", ""),  # an all-zero parent id
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""),  # version ff
    ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", ""),
    ("", ""), (LEAK, ""), (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""),
])
def test_a_trace_id_comes_from_a_w3c_traceparent_only(value: object, trace_id: str) -> None:
    assert logs.trace_id(value) == trace_id
    assert logs.trace_id_of([("authorization", "Bearer x"), ("traceparent", value)]) == trace_id


def leaky_failure() -> ValueError:
    try:
        try:
            {}[SECRET]
        except KeyError as missing:
            raise ValueError(f"could not read {LEAK}") from missing
    except ValueError as error:
        return error
    raise AssertionError


@pytest.mark.parametrize("format", ["text", "json"])
def test_a_traceback_names_types_and_frames_never_messages(format: str) -> None:
    record = logging.LogRecord("grpc._server", logging.ERROR, __file__, 1, "Exception calling application", (),
                               (ValueError, leaky_failure(), leaky_failure().__traceback__))
    logging.Formatter().format(record)  # another handler first: it caches the traceback, messages and all
    assert SECRET in (record.exc_text or "")
    line = logs.formatter(format).format(record)
    text = json.loads(line)["exception"] if format == "json" else line
    assert ("\n" not in line) if format == "json" else (line.count("\n") > 4)
    assert not canaries_in(line) and not canaries_in(text)
    assert text.index(f"KeyError ({logs.WITHHELD})") < text.index("direct cause") < text.index(
        f"ValueError ({logs.WITHHELD})")
    assert 'test_logs.py", line' in text and "in leaky_failure" in text
    missing = logs.exception_text(FileNotFoundError(2, "No such file", LEAK))
    assert missing == f"FileNotFoundError [ENOENT] ({logs.WITHHELD})"  # an errno names no content


def test_the_json_format_is_one_object_per_line_with_the_calls_fields() -> None:
    record = logging.LogRecord("sidecar.requests", logging.DEBUG, __file__, 1, "%s %s", ("OpenRun", "OK"), None)
    record.__dict__.update(method="OpenRun", status="OK", duration_ms=0.25, trace_id="")
    entry = json.loads(logs.JsonFormatter().format(record))
    assert entry.keys() == {"time", "level", "logger", "message", "method", "status", "duration_ms", "trace_id"}
    assert (entry["level"], entry["logger"], entry["message"]) == ("DEBUG", "sidecar.requests", "OpenRun OK")
    assert JSON_TIME.match(entry["time"])
    assert logs.JsonFormatter().format(logging.LogRecord("x", 20, "", 1, "caf\u00e9\n", (), None)).isascii()


class Lines(logging.Handler):
    """What a stock formatter writes: the sidecar's call sites alone keep messages out."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def stock_log() -> Iterator[Lines]:
    handler, root = Lines(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_the_sidecars_failures_are_logged_without_their_messages_under_any_formatter(stock_log: Lines) -> None:
    class Aborted(Exception):
        pass

    class Context:
        def time_remaining(self) -> None:
            return None

        def abort_with_status(self, status: object) -> None:
            raise Aborted

    class Servicer:
        @answers_errors
        def AssembleContext(self, request: object, context: object) -> None:
            raise leaky_failure()

    class Plugin:
        def trigger(self, call: object) -> None:
            raise RuntimeError(f"choked on {LEAK}")

    with pytest.raises(Aborted):  # wire/status.py: an internal error
        Servicer().AssembleContext(None, Context())
    with pytest.raises(PluginFailed):  # context_window/policy.py: a plugin that raised
        Policy(Plugin(), "leaky").trigger(TriggerInput(1, "t", 1, 1, 1, 1, 0.5))

    # memory/compaction.py: a ref skipped by a round (the error's code, not its message), a failed round.
    class Memories:
        def refs_over(self, count: int) -> list[tuple[str, str]]:
            return [("acme", f"mem:{SECRET}")]

    def refuse(*args: object, **kwargs: object) -> None:
        raise StoreFull(f"no room for {LEAK}")

    compactor = Compactor.__new__(Compactor)
    compactor._memories, compactor._settings = Memories(), type("Settings", (), {"min_entries": 1})()  # type: ignore
    compactor.compact = refuse  # type: ignore[method-assign]
    assert compactor.run_round() == []

    class BrokenCompactor:
        def run_round(self) -> None:
            raise leaky_failure()

    job = BackgroundJob(BrokenCompactor(), 0.001)  # type: ignore[arg-type]
    job.start()
    deadline = time.monotonic() + 10
    while not any("compaction round failed" in line for line in stock_log.lines) and time.monotonic() < deadline:
        time.sleep(0.01)
    job.stop()

    alarms = [line for line in stock_log.lines if line.split(" ", 1)[0] in ALARMS]
    assert not [line for line in alarms if canaries_in(line)]
    started = [line.split("\n", 1)[0] for line in alarms]
    assert "ERROR sidecar.wire.status: internal error in AssembleContext" in started
    assert "ERROR sidecar.context_window.policy: plugin 'leaky': compaction.trigger raised" in started
    assert "WARNING sidecar.memory.compaction: compaction of a memory ref of tenant acme skipped: store_full" in started
    assert "ERROR sidecar.memory.compaction: compaction round failed" in started


def run_python(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python *args`` in a process of its own, importing this tree's sidecar."""
    return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def test_an_uncaught_exception_is_a_line_of_the_log_too(tmp_path: Path) -> None:
    """In a thread or in the main thread: written by the log's formatter, not Python's hook."""
    program = (
        "import sys, threading\nfrom sidecar.telemetry import logs\n"
        "logs.configure('INFO', 'json')\nleak = sys.argv[1]\n"
        "def run():\n    raise ValueError(leak)\n"
        "thread = threading.Thread(target=run, name='worker')\nthread.start()\nthread.join()\n"
        "raise KeyError(leak)\n")
    result = run_python(tmp_path, "-c", program, LEAK)
    assert result.returncode == 1
    found = records(result.stderr, "json")
    assert [(r["level"], r["message"]) for r in found] == [
        ("ERROR", "uncaught exception in thread worker"), ("CRITICAL", "uncaught exception")]
    assert f"ValueError ({logs.WITHHELD})" in found[0]["exception"]
    assert f"KeyError ({logs.WITHHELD})" in found[1]["exception"]
    assert not canaries_in(result.stderr)


# The process's every line: the start banner (stdout) and the log (stderr), in the format asked for.

BANNER_TEXT = (re.compile(r"^context-sidecar serving on (127\.0\.0\.1:\d+)$"),
               re.compile(r"^context-sidecar metrics on (http://127\.0\.0\.1:\d+/metrics)$"),
               re.compile(r"^context-sidecar inspector on (http://127\.0\.0\.1:\d+/?)$"))


def _serve_with_every_banner(tmp_path: Path, format: str) -> tuple[list[str], list[str]]:
    """A real serve with metrics and the inspector on, at DEBUG, in ``format``: each banner line's
    address (gRPC, /metrics, inspector) is used, then SIGTERM; its stdout and stderr lines."""
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "serve", "--storage-path", str(tmp_path / "data"), "--log-level",
             "DEBUG", "--log-format", format, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--inspector-listen", "127.0.0.1:0"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        banner = [process.stdout.readline().rstrip("\n") for _ in BANNER_TEXT]
        if format == "json":
            fields = [json.loads(line) for line in banner]
            address, metrics_url, inspector_url = fields[0]["address"], fields[1]["url"], fields[2]["url"]
        else:
            found = [pattern.match(line) for pattern, line in zip(BANNER_TEXT, banner)]
            assert all(found), banner
            address, metrics_url, inspector_url = (match[1] for match in found if match)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.ContextSidecarStub(channel)
            with pytest.raises(grpc.RpcError) as missing:
                stub.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="no-such-run", iteration=1), timeout=30)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        for url in (metrics_url, inspector_url):
            with urllib.request.urlopen(url, timeout=30) as answer:
                assert answer.status == 200
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr_path.read_text()
    return banner + rest.splitlines(), stderr_path.read_text(encoding="utf-8").splitlines()


def test_under_the_json_format_every_line_is_json_the_banner_too(tmp_path: Path) -> None:
    stdout, stderr = _serve_with_every_banner(tmp_path, "json")
    written = [json.loads(line) for line in stdout + stderr]  # each line: one whole JSON object
    assert all(JSON_TIME.match(entry["time"]) for entry in written)
    banner = [json.loads(line) for line in stdout]
    assert [(entry["level"], entry["logger"]) for entry in banner] == [("INFO", "sidecar")] * 3
    assert [entry["message"] for entry in banner] == [
        f"context-sidecar serving on {banner[0]['address']}", f"context-sidecar metrics on {banner[1]['url']}",
        f"context-sidecar inspector on {banner[2]['url']}"]
    logged = [json.loads(line) for line in stderr]
    assert any((entry.get("method"), entry.get("status")) == ("GetTranscriptWindow", "NOT_FOUND") for entry in logged)
    assert any(entry["message"] == "stopped" for entry in logged)


def test_under_the_text_format_the_banner_is_as_it_always_was(tmp_path: Path) -> None:
    stdout, stderr = _serve_with_every_banner(tmp_path, "text")
    assert len(stdout) == 3  # the banner, matched line by line; nothing else on stdout
    assert all(LINE_START.match(line) for line in stderr if not line.startswith(("Traceback", "  ")))
    assert any(line.endswith(" INFO sidecar.wire.server: stopped") for line in stderr)


def test_under_the_json_format_a_failure_to_start_is_json_too(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = subprocess.run(
            [sys.executable, "-m", "sidecar", "serve", "--storage-path", str(tmp_path / "data"), "--log-format",
             "json", "--metrics-listen", address], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    written = [json.loads(line) for line in (result.stdout + result.stderr).splitlines()]
    assert [(entry["level"], entry["logger"], entry["message"]) for entry in written if entry["level"] == "ERROR"] == [
        ("ERROR", "sidecar", f"context-sidecar: cannot start: cannot serve metrics on {address}: "
                             "Address already in use")]


def test_a_python_warning_is_a_line_of_the_log_too(tmp_path: Path) -> None:
    """A library's warning (warnings.warn) would otherwise be Python's own two lines of text."""
    program = ("import warnings\nfrom sidecar.telemetry import logs\n"
               "logs.configure('INFO', 'json')\nwarnings.warn('an option going away', DeprecationWarning, 1)\n")
    result = run_python(tmp_path, "-W", "default", "-c", program)
    assert result.returncode == 0
    found = records(result.stderr, "json")  # every line: one JSON object
    assert [(r["level"], r["logger"]) for r in found] == [("WARNING", "py.warnings")]
    assert "DeprecationWarning: an option going away" in found[0]["message"]
