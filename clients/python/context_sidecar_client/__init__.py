"""A Python client for the context sidecar (contextsidecar.v1.ContextSidecar).

    from context_sidecar_client import Client
    with Client("127.0.0.1:50051") as sidecar:
        sidecar.open_run(run_id="run-1", token_counter="o200k_base", transcript_token_budget=8000)
        turn = sidecar.assemble_context(run_id="run-1", iteration=1, append_events=[
            {"event_id": "u1", "role": "user", "content": "What does the refund policy say?"}])

One method per RPC, named in snake_case. Its keyword arguments are the request's fields, named
and typed as in the proto (``context_sidecar_client.fields`` has each message's, for a type
checker); a nested message is a dict of its fields or the message itself
(``context_sidecar_client.v1.sidecar_pb2``). It returns the response message; WatchEvents
returns a ``Watch`` to iterate. ``context_sidecar_client.aio.AsyncClient`` is the asyncio twin.

Every call has a deadline: ``timeout`` seconds (the client's, or the call's own ``timeout=``),
retries included. A call that is safe to repeat (``calls.IDEMPOTENT``) is retried on
UNAVAILABLE, up to ``retries`` times with a growing pause; nothing else is retried. A failed
call raises ``SidecarCallError``, as the subclass of its gRPC code (``NotFoundError``,
``InvalidArgumentError``, ...: ``errors``), with the sidecar's reason, the bad fields and the
ErrorInfo metadata.

A sidecar with ``[server.tls]`` is reached with ``tls=ClientTls(ca_file, cert_file=None,
key_file=None)``: the CA its certificate chains to, and under mTLS the client's certificate and
key (``context_sidecar_client.tls``).
"""

from context_sidecar_client.errors import (
    AbortedError,
    AlreadyExistsError,
    CallCancelledError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    FieldViolation,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SidecarCallError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)
from context_sidecar_client.sync import Client, Watch
from context_sidecar_client.tls import ClientTls

__all__ = [
    "AbortedError", "AlreadyExistsError", "CallCancelledError", "Client", "ClientTls", "DataLossError",
    "DeadlineExceededError", "FailedPreconditionError", "FieldViolation", "InternalError", "InvalidArgumentError",
    "NotFoundError", "OutOfRangeError", "PermissionDeniedError", "ResourceExhaustedError", "SidecarCallError",
    "UnauthenticatedError", "UnavailableError", "UnimplementedError", "UnknownError", "Watch",
]
