"""Domain errors to gRPC statuses: the one table, and the rich details every client can read.

The machine code travels as ``google.rpc.ErrorInfo.reason`` (domain ``context-sidecar``); bad
fields as ``google.rpc.BadRequest`` field violations; both packed into the standard
``grpc-status-details-bin`` trailer that every gRPC language reads.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, TypeVar

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from sidecar.errors import SidecarError

log = logging.getLogger(__name__)
ERROR_DOMAIN = "context-sidecar"

STATUS_BY_CODE: dict[str, grpc.StatusCode] = {
    "validation_error": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "conflict": grpc.StatusCode.ALREADY_EXISTS,
    "token_budget_exceeded": grpc.StatusCode.FAILED_PRECONDITION,
    "store_full": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "replay_context_summary_unavailable": grpc.StatusCode.FAILED_PRECONDITION,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "aborted": grpc.StatusCode.ABORTED,
    "compaction_disabled": grpc.StatusCode.FAILED_PRECONDITION,
    "watch_fell_behind": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "plugin_failed": grpc.StatusCode.INTERNAL,
    "state_invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "internal": grpc.StatusCode.INTERNAL,
}


def to_status(error: SidecarError) -> grpc.Status:
    code = STATUS_BY_CODE[error.code]
    detail = status_pb2.Status(code=code.value[0], message=error.message)
    detail.details.add().Pack(error_details_pb2.ErrorInfo(reason=error.code, domain=ERROR_DOMAIN,
                                                          metadata=error.metadata))
    if error.violations:
        detail.details.add().Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in error.violations]))
    return rpc_status.to_status(detail)


Handler = TypeVar("Handler", bound=Callable[..., Any])


def answers_errors(method: Handler) -> Handler:
    """Wrap a servicer method: domain errors become their status, anything else INTERNAL.

    An unexpected exception is logged with its traceback here and answered with no internals:
    its message could quote stored content.
    """

    @functools.wraps(method)
    def handler(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except SidecarError as error:
            context.abort_with_status(to_status(error))
        except Exception:
            log.exception("internal error in %s", method.__name__)
            context.abort_with_status(to_status(SidecarError("internal error")))

    return handler  # type: ignore[return-value]
