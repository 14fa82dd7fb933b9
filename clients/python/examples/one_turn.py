"""One turn: open a run, send the turn's events, print the window the sidecar answers."""

import sys

from context_sidecar_client import Client, NotFoundError

target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
with Client(target) as sidecar:
    sidecar.open_run(run_id="one-turn", token_counter="o200k_base", transcript_token_budget=8000)
    turn = sidecar.assemble_context(run_id="one-turn", iteration=1, append_events=[
        {"event_id": "u1", "role": "user", "content": "What does the refund policy say?"},
        {"event_id": "c1", "role": "assistant", "type": "tool_call", "call_id": "k1",
         "tool_name": "search", "content": '{"q": "refund"}'},
        {"event_id": "r1", "role": "tool", "type": "tool_result", "call_id": "k1", "content": "30 days."}])
    print(turn.token_count, turn.token_budget, [(entry.event_id, entry.tokens) for entry in turn.entries])
    try:
        sidecar.get_transcript_window(run_id="one-turn", iteration=9)
    except NotFoundError as error:
        print(error.reason)  # not_found: iteration 9 was never assembled
