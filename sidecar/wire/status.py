"""Domain errors to gRPC statuses, and the rich details every client can read.

Each error class declares its status beside its code (``sidecar.errors``), so no code can lack
one. The machine code travels as ``google.rpc.ErrorInfo.reason`` (domain ``context-sidecar``);
bad fields as ``google.rpc.BadRequest`` field violations; both packed into the standard
``grpc-status-details-bin`` trailer that every gRPC language reads.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf import message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from sidecar.errors import STATUS_NAMES, Deadline, SidecarError, ValidationError
from sidecar.telemetry import logs

log = logging.getLogger(__name__)
ERROR_DOMAIN = "context-sidecar"

# Checked once here, where grpc is at hand: every status name an error class may declare is one.
_UNKNOWN_NAMES = STATUS_NAMES - {code.name for code in grpc.StatusCode}
if _UNKNOWN_NAMES:
    raise ImportError(f"sidecar.errors.STATUS_NAMES names statuses grpc does not know: {sorted(_UNKNOWN_NAMES)}")


def to_status(error: SidecarError) -> grpc.Status:
    code = grpc.StatusCode[error.status]
    detail = status_pb2.Status(code=code.value[0], message=error.message)
    detail.details.add().Pack(error_details_pb2.ErrorInfo(reason=error.code, domain=ERROR_DOMAIN,
                                                          metadata=error.metadata))
    if error.violations:
        detail.details.add().Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in error.violations]))
    return rpc_status.to_status(detail)


def deadline_of(context: grpc.ServicerContext) -> Deadline:
    """The call's deadline in ``time.monotonic()`` terms, for the domain to check between stages."""
    remaining = context.time_remaining()
    return Deadline(None if remaining is None else time.monotonic() + remaining)


class Malformed:
    """What a request that is not a valid protobuf message deserialises to: the handler answers
    it with INVALID_ARGUMENT (grpc itself would answer INTERNAL and log a traceback per call)."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name




class RateLimitedLog:
    """One short line per event, at most ``per_interval`` lines per ``interval`` seconds; past
    that, a line only at the 100th, 1,000th, ... event of the interval, saying how many were not
    logged one by one (and one more when the interval ends, with the final count). A caller that
    floods the sidecar with bad requests thus cannot flood its log."""

    def __init__(self, logger: logging.Logger, per_interval: int = 10, interval: float = 60.0) -> None:
        self._log, self._per_interval, self._interval = logger, per_interval, interval
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._count = 0

    def warning(self, line: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._started >= self._interval:
                if self._count > self._per_interval:
                    self._log.warning("%d bad requests in the last %.0f s; %d of them not logged one by one",
                                      self._count, now - self._started, self._count - self._per_interval)
                self._started, self._count = now, 0
            self._count += 1
            count = self._count
        if count <= self._per_interval:
            self._log.warning(line)
        elif _is_power_of_ten(count):
            self._log.warning("%d bad requests in the last %.0f s; %d of them not logged one by one "
                              "(the next such line at %d)", count, now - self._started,
                              count - self._per_interval, count * 10)


def _is_power_of_ten(count: int) -> bool:
    while count % 10 == 0:
        count //= 10
    return count == 1


def lenient_deserializer(request_type: type[message.Message],
                         bad_requests: RateLimitedLog) -> Callable[[bytes], message.Message | Malformed]:
    name = request_type.DESCRIPTOR.name

    def deserialize(data: bytes) -> message.Message | Malformed:
        try:
            return request_type.FromString(data)
        except message.DecodeError:
            bad_requests.warning(f"refused a request of {len(data)} bytes that is not a valid {name}")
            return Malformed(name)
    return deserialize


def _refuse_malformed(request: Any) -> None:
    if isinstance(request, Malformed):  # logged (rate-limited) by the deserializer
        raise ValidationError.field("request", f"is not a valid {request.type_name} message")


Handler = TypeVar("Handler", bound=Callable[..., Any])


def answers_errors(method: Handler) -> Handler:
    """Wrap a servicer method, unary or streaming: domain errors become their status, anything
    else INTERNAL; a malformed request or a deadline already past stops the call before any work.

    An unexpected exception is logged here with its traceback but not its message, and answered
    with no internals: its message could quote stored content (``sidecar.telemetry.logs``).
    """

    def abort(error: Exception, context: grpc.ServicerContext) -> None:
        if not isinstance(error, SidecarError):
            log.error("internal error in %s", method.__name__, extra=logs.failure(error))
            error = SidecarError("internal error")
        context.abort_with_status(to_status(error))

    def begin(request: Any, context: grpc.ServicerContext) -> None:
        _refuse_malformed(request)
        deadline_of(context).check("before the call began")

    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def stream(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                begin(request, context)
                yield from method(self, request, context)
            except Exception as error:
                abort(error, context)
        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    def handler(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            begin(request, context)
            return method(self, request, context)
        except Exception as error:
            abort(error, context)

    return handler  # type: ignore[return-value]
