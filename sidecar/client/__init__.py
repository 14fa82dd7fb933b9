"""A Python client for the context sidecar (contextsidecar.v1.ContextSidecar).

    from sidecar.client import Client
    with Client("127.0.0.1:50051") as sidecar:
        sidecar.open_run(run_id="run-1", token_counter="o200k_base", transcript_token_budget=8000)
        turn = sidecar.assemble_context(run_id="run-1", iteration=1, append_events=[
            {"event_id": "u1", "role": "user", "content": "What does the refund policy say?"}])

One method per RPC, named in snake_case. Its keyword arguments are the request's fields, named
as in the proto; a nested message is a dict of its fields or the message itself
(``sidecar.pb.contextsidecar.v1.sidecar_pb2``). It returns the response message; WatchEvents
returns a ``Watch`` to iterate. ``sidecar.client.aio.AsyncClient`` is the asyncio twin.

Every call has a deadline: ``timeout`` seconds (the client's, or the call's own ``timeout=``),
retries included. A call that is safe to repeat (``calls.IDEMPOTENT``) is retried on
UNAVAILABLE, up to ``retries`` times with a growing pause; nothing else is retried. A failed
call raises ``SidecarCallError`` with the gRPC code, the sidecar's reason, the bad fields and
the ErrorInfo metadata.
"""

from sidecar.client.calls import SidecarCallError
from sidecar.client.sync import Client, Watch

__all__ = ["Client", "SidecarCallError", "Watch"]
