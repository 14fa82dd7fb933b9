"""One turn of a host, and a refused call decoded. The sidecar is at $SIDECAR_ADDRESS
(127.0.0.1:50051 when unset); $SIDECAR_TOKEN is the tenant's token, if it has tenants."""

import os

from context_sidecar_client import Client, InvalidArgumentError

with Client(os.environ.get("SIDECAR_ADDRESS", "127.0.0.1:50051"), token=os.environ.get("SIDECAR_TOKEN")) as sidecar:
    sidecar.open_run(run_id="run-1", token_counter="o200k_base", transcript_token_budget=8000)
    turn = sidecar.assemble_context(run_id="run-1", iteration=1, append_events=[
        {"event_id": "u1", "role": "user", "content": "What does the refund policy say?"},
        {"event_id": "c1", "role": "assistant", "type": "tool_call", "call_id": "k1", "tool_name": "search",
         "content": '{"q": "refund"}'},
        {"event_id": "r1", "role": "tool", "type": "tool_result", "call_id": "k1", "content": "30 days."},
    ])
    for entry in turn.entries:
        print(entry.event_id, entry.tokens, "tokens")

    try:
        sidecar.append_events(run_id="run-1", events=[{"role": "user"}])
    except InvalidArgumentError as error:  # a SidecarCallError: each gRPC code has its subclass
        print(error.code.name, error.reason)
        for field, description in error.field_violations:
            print(field, description)
