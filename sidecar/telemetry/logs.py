"""The sidecar's log: text lines or one JSON object per line (``[log] format``), and one DEBUG line
per call (method, status, duration, trace id).

No line at WARNING or above carries a request's text, stored content or a secret. Call sites log
codes, counts, sizes and names; and a traceback, whoever logs it (the sidecar, grpc, a plugin, an
uncaught exception in a thread), is written by :func:`exception_text`: each exception's type and
where it was raised, never its message, which may quote content (a plugin's ``ValueError``
quoting the event it choked on, a ``KeyError`` holding a stored key).
"""

from __future__ import annotations

import errno
import functools
import inspect
import json
import logging
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TextIO

REQUESTS = logging.getLogger("sidecar.requests")  # the per-call lines, beside the bad requests' warnings
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
WITHHELD = "its message is not logged: it may quote content"
# A LogRecord's own attributes: any other one came in a call's ``extra`` and is a field of its own.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
# W3C Trace Context: version-traceid-parentid-flags, lowercase hex (https://www.w3.org/TR/trace-context/).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_said_as_json = False  # [log] format = "json", as configure() was given it: say()'s lines are JSON too


def _type_name(error: BaseException) -> str:
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(error, OSError) and error.errno is not None and error.errno in errno.errorcode:  # no content
        name += f" [{errno.errorcode[error.errno]}]"
    return name


def exception_text(error: BaseException | None) -> str:
    """A traceback as Python writes it, chained exceptions included, with each exception's
    message left out: its type and the frames it passed through (the sidecar's source lines)."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    link = ""
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append((error, link))
        if error.__cause__ is not None:
            error, link = error.__cause__, "The above exception was the direct cause of the following exception:"
        elif error.__context__ is not None and not error.__suppress_context__:
            error, link = error.__context__, "During handling of the above exception, another exception occurred:"
        else:
            error = None
    lines: list[str] = []
    for number, (current, _) in enumerate(reversed(chain)):
        if number:
            lines.append(f"\n{chain[len(chain) - number][1]}\n\n")
        if current.__traceback__ is not None:
            lines.append("Traceback (most recent call last):\n")
            lines += traceback.format_list(traceback.extract_tb(current.__traceback__))
        lines.append(f"{_type_name(current)} ({WITHHELD})\n")
    return "".join(lines).rstrip("\n")


def failure(error: BaseException) -> dict[str, str]:
    """A log call's ``extra`` for a failure: ``exception``, its :func:`exception_text`. The sidecar
    logs its own failures so rather than with ``exc_info``, which every handler (any formatter a
    host or test installs) would write with the exception's message."""
    return {"exception": exception_text(error)}


def _exception_text_of(record: logging.LogRecord) -> str:
    if record.exc_info and record.exc_info[1] is not None:
        return exception_text(record.exc_info[1])
    given = getattr(record, "exception", None)  # logged with extra=failure(error)
    return given if isinstance(given, str) else ""


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, as the sidecar always logged; tracebacks by
    :func:`exception_text` (never the cached ``exc_text`` another formatter may have written)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        failed = _exception_text_of(record)
        if failed:
            line += "\n" + failed
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line, ASCII only: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, each field the call passed in ``extra`` (``method``, ``status``, ``duration_ms``,
    ``trace_id`` on a call's line), and ``exception`` (:func:`exception_text`) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace(
                "+00:00", "Z"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for name, value in vars(record).items():
            if name not in _RECORD_ATTRIBUTES and name not in entry:
                entry[name] = value
        failed = _exception_text_of(record)
        if failed:
            entry["exception"] = failed
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, default=str)


def formatter(format: str) -> logging.Formatter:
    """The formatter of ``[log] format``: "text" or "json"."""
    return JsonFormatter() if format == "json" else TextFormatter()


def configure(level: str, format: str, stream: TextIO | None = None) -> None:
    """The process's logging: ``level`` and ``[log] format`` on stderr (or ``stream``); uncaught
    exceptions, in the main thread or any other, go through it too (so they are written like
    any other line: one JSON object, no exception message), as do Python's warnings. :func:`say`
    writes in ``format`` too."""
    global _said_as_json
    _said_as_json = format == "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(format))
    logging.basicConfig(level=level, handlers=[handler])
    logging.captureWarnings(True)  # a library's warnings.warn: a WARNING line of py.warnings, not Python's text
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def say(message: str, stream: TextIO | None = None, level: int = logging.INFO, **fields: str) -> None:
    """One line on stdout (or ``stream``) whatever the log level: the start banner a supervisor or
    test waits for, or why the process could not start. Under the text format it is ``message``
    as it is; under JSON one object like any log line's (logger ``sidecar``), ``fields`` (the
    address served) among its keys, so that a reader of JSON needs no parsing of the message."""
    if _said_as_json:
        record = logging.makeLogRecord({"name": "sidecar", "levelno": level, "levelname": logging.getLevelName(level),
                                        "msg": message, **fields})
        message = JsonFormatter().format(record)
    print(message, file=stream or sys.stdout, flush=True)


def _log_uncaught(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, error, trace)
        return
    logging.getLogger("sidecar").critical("uncaught exception", exc_info=(kind, error, trace))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if issubclass(args.exc_type, SystemExit) or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("sidecar").error("uncaught exception in thread %s", name,
                                       exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


# One line per call.

def trace_id(traceparent: object) -> str:
    """The trace id of a W3C ``traceparent`` value (``00-<32 hex>-<16 hex>-<2 hex>``, or a later
    version's longer value); "" when it is not one (all-zero ids and version ff are invalid)."""
    if not isinstance(traceparent, str):
        return ""
    value = traceparent.strip()
    found = _TRACEPARENT.match(value)
    if found is None or found[1] == "ff" or found[2] == "0" * 32 or found[3] == "0" * 16:
        return ""
    if len(value) > 55 and (found[1] == "00" or value[55] != "-"):  # a later version may append fields
        return ""
    return found[2]


def trace_id_of(metadata: Iterable[tuple[str, Any]] | None) -> str:
    """The trace id a call's metadata carries in ``traceparent``; "" when none does."""
    for key, value in metadata or ():
        if key == "traceparent":
            return trace_id(value)
    return ""


def _status(context: Any, failed: bool) -> str:
    """The call's final status: what the context holds (grpc's abort sets it before raising),
    else UNKNOWN for an exception and OK for an answer."""
    code = context.code()
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return str(getattr(code, "name", code))


def _log_call(method: str, status: str, started: float, context: Any) -> None:
    duration_ms = round((time.perf_counter() - started) * 1000, 3)
    trace = trace_id_of(context.invocation_metadata())
    REQUESTS.debug("%s %s %.3f ms%s", method, status, duration_ms, f" trace {trace}" if trace else "",
                   extra={"method": method, "status": status, "duration_ms": duration_ms, "trace_id": trace})


Behavior = Callable[[Any, Any], Any]


def logged(behavior: Behavior) -> Behavior:
    """A call's wrap: when DEBUG is on for ``sidecar.requests`` (asked once per call), one line
    once the call ends: the RPC (``behavior.__name__``), its status code's name, its duration in
    ms and the trace id of its ``traceparent`` metadata. Never the request's content. A stream's
    line comes when it ends (CANCELLED when the caller went away first)."""
    method = behavior.__name__
    if inspect.isgeneratorfunction(behavior):
        @functools.wraps(behavior)
        def logged_stream(request: Any, context: Any) -> Iterator[Any]:
            if not REQUESTS.isEnabledFor(logging.DEBUG):
                yield from behavior(request, context)
                return
            started = time.perf_counter()
            try:
                yield from behavior(request, context)
            except GeneratorExit:
                _log_call(method, "CANCELLED", started, context)
                raise
            except BaseException:
                _log_call(method, _status(context, failed=True), started, context)
                raise
            _log_call(method, _status(context, failed=False), started, context)
        return logged_stream

    @functools.wraps(behavior)
    def logged_call(request: Any, context: Any) -> Any:
        if not REQUESTS.isEnabledFor(logging.DEBUG):
            return behavior(request, context)
        started = time.perf_counter()
        try:
            answer = behavior(request, context)
        except BaseException:
            _log_call(method, _status(context, failed=True), started, context)
            raise
        _log_call(method, _status(context, failed=False), started, context)
        return answer
    return logged_call
