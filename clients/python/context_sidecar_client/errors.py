"""What a failed call raises: ``SidecarCallError``, or its subclass for the call's gRPC status
(``NotFoundError``, ``InvalidArgumentError``, ``UnavailableError``, ...), each with the sidecar's
reason, the bad fields and the ErrorInfo metadata decoded from the call's rich status.

    try:
        sidecar.get_transcript_window(run_id="run-1", iteration=9)
    except NotFoundError as error:
        print(error.reason)  # "not_found"
"""

from __future__ import annotations

from typing import Any, NamedTuple

import grpc

from context_sidecar_client import wire_pb2

__all__ = [
    "AbortedError", "AlreadyExistsError", "CallCancelledError", "DataLossError", "DeadlineExceededError",
    "FailedPreconditionError", "FieldViolation", "InternalError", "InvalidArgumentError", "NotFoundError",
    "OutOfRangeError", "PermissionDeniedError", "ResourceExhaustedError", "SidecarCallError",
    "UnauthenticatedError", "UnavailableError", "UnimplementedError", "UnknownError", "call_error",
]

# The type URLs of the two details the sidecar sends (google.rpc's; wire.proto has their fields).
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"


class FieldViolation(NamedTuple):
    """A bad field of the request (``"append_events[2].iteration"``) and what is wrong with it."""

    field: str
    description: str


class SidecarCallError(Exception):
    """A call the sidecar (or the channel) refused; a subclass names its gRPC status. ``code`` is
    that status; ``reason`` the sidecar's machine code (google.rpc.ErrorInfo.reason:
    "validation_error", "not_found", ...; empty when the call never reached the sidecar);
    ``field_violations`` each bad field with what is wrong with it (google.rpc.BadRequest);
    ``metadata`` the ErrorInfo metadata (``{"events_needed": "3"}``); ``method`` the RPC."""

    def __init__(self, method: str, code: grpc.StatusCode, message: str, reason: str = "",
                 field_violations: list[FieldViolation] | None = None, metadata: dict[str, str] | None = None) -> None:
        super().__init__(f"{method}: {code.name}{f' ({reason})' if reason else ''}: {message}")
        self.method, self.code, self.message, self.reason = method, code, message, reason
        self.field_violations = field_violations or []
        self.metadata = metadata or {}


class CallCancelledError(SidecarCallError):
    """CANCELLED: the call was cancelled (by the host, or its channel closed)."""


class UnknownError(SidecarCallError):
    """UNKNOWN."""


class InvalidArgumentError(SidecarCallError):
    """INVALID_ARGUMENT: bad input; ``field_violations`` says which fields."""


class DeadlineExceededError(SidecarCallError):
    """DEADLINE_EXCEEDED: the call's ``timeout`` passed, its retries included."""


class NotFoundError(SidecarCallError):
    """NOT_FOUND: no such run, iteration, artifact or entry (another tenant's answers the same)."""


class AlreadyExistsError(SidecarCallError):
    """ALREADY_EXISTS: the id is taken by something else."""


class PermissionDeniedError(SidecarCallError):
    """PERMISSION_DENIED."""


class ResourceExhaustedError(SidecarCallError):
    """RESOURCE_EXHAUSTED: over a limit (docs/limits.md)."""


class FailedPreconditionError(SidecarCallError):
    """FAILED_PRECONDITION: refused in the run's present state (a turn that cannot fit, ...)."""


class AbortedError(SidecarCallError):
    """ABORTED."""


class OutOfRangeError(SidecarCallError):
    """OUT_OF_RANGE."""


class UnimplementedError(SidecarCallError):
    """UNIMPLEMENTED: the sidecar has no such method or feature."""


class InternalError(SidecarCallError):
    """INTERNAL: a defect of the sidecar."""


class UnavailableError(SidecarCallError):
    """UNAVAILABLE: the sidecar could not be reached (after the retries of a call safe to repeat)."""


class DataLossError(SidecarCallError):
    """DATA_LOSS."""


class UnauthenticatedError(SidecarCallError):
    """UNAUTHENTICATED: no token, or one no tenant has, while the sidecar has tenants."""


BY_CODE: dict[grpc.StatusCode, type[SidecarCallError]] = {
    grpc.StatusCode.CANCELLED: CallCancelledError, grpc.StatusCode.UNKNOWN: UnknownError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError, grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.NOT_FOUND: NotFoundError, grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError, grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRangeError, grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
    grpc.StatusCode.INTERNAL: InternalError, grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DATA_LOSS: DataLossError, grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def call_error(method: str, error: grpc.RpcError) -> SidecarCallError:
    """The rich status of a failed call (its grpc-status-details-bin trailer) decoded, as the
    class of its code."""
    reason, violations, metadata = "", [], {}
    trailers: Any = error.trailing_metadata() or ()  # (key, value) pairs, whatever the stubs say
    for key, value in trailers:
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            for detail in wire_pb2.Status.FromString(value).details:
                if detail.type_url == ERROR_INFO:
                    info = wire_pb2.ErrorInfo.FromString(detail.value)
                    reason, metadata = info.reason, dict(info.metadata)
                elif detail.type_url == BAD_REQUEST:
                    violations = [FieldViolation(v.field, v.description)
                                  for v in wire_pb2.BadRequest.FromString(detail.value).field_violations]
    code: grpc.StatusCode = error.code()
    return BY_CODE.get(code, SidecarCallError)(method, code, error.details() or "", reason, violations, metadata)
