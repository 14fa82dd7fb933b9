"""A session of the OpenAI Agents SDK (``openai-agents``) kept by the sidecar: the agent's history
is the run's transcript, and what the agent is given back is the sidecar's window, bounded by
the run's token budget and cache-stable (docs/transcript.md). Install with the extra ``agents``.

    async with AsyncClient("127.0.0.1:50051") as sidecar:
        session = AgentsSession("chat-1", sidecar, settings={"transcript_token_budget": 8000})
        result = await Runner.run(agent, "What does the refund policy say?", session=session)

The session is the run ``session_id`` (opened on first use with ``settings``, the fields of
OpenRun). Each ``Runner.run`` is one iteration of the run: ``get_items`` assembles it
(AssembleContext) and answers its window as input items, and ``add_items`` records the run's
new items in it. Kept: messages (text), function calls and their outputs; reasoning items are
not kept (the transcript holds what the model is fed); any other item is refused with a
ValueError, before anything is written. A tool's output comes back inside the sidecar's
untrusted-data fence, and an old one may come back cleared to a placeholder: what the model is
fed is what the sidecar counted.

The transcript is append-only (a window once fed never changes), so ``pop_item`` raises
NotImplementedError, and ``clear_session`` deletes the run (DeleteRun): the next call starts a
new one under the same id.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import TYPE_CHECKING, Any, cast

from context_sidecar_client import fields as messages
from context_sidecar_client.aio import AsyncClient
from context_sidecar_client.errors import NotFoundError
from context_sidecar_client.v1 import sidecar_pb2 as pb

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings

__all__ = ["AgentsSession"]

# Text parts of a message's content, as input and as output.
TEXT_PARTS = ("input_text", "output_text")


class AgentsSession:
    """The OpenAI Agents SDK's ``Session`` protocol over a run of the sidecar."""

    def __init__(self, session_id: str, sidecar: AsyncClient, *, settings: messages.OpenRunRequest | None = None,
                 max_transcript_tokens: int | None = None, session_settings: SessionSettings | None = None) -> None:
        """``settings``: OpenRun's fields for the run (its counter, budget, ...; run_id is
        ``session_id``). ``max_transcript_tokens``: a tighter budget for each window than the run's."""
        self.session_id = session_id
        self.session_settings = session_settings
        self._sidecar = sidecar
        self._settings: messages.OpenRunRequest = {**(settings or {}), "run_id": session_id}
        self._assembly: messages.AssembleContextRequest = {"run_id": session_id}
        if max_transcript_tokens is not None:
            self._assembly["max_transcript_tokens"] = max_transcript_tokens
        self._lock = asyncio.Lock()
        self._opened = False
        self._assembled = 0  # the iteration this session assembled last (0: none yet)
        self._latest = 0  # the run's newest iteration with events
        self.last_window: pb.AssembleContextResponse | None = None  # the last get_items' answer

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The window of the run's next iteration (the latest ``limit`` items of it, if given)."""
        async with self._lock:
            await self._open()
            # Nothing recorded since the last assembly: the same iteration again (the same window).
            iteration = self._assembled if self._assembled > self._latest else self._latest + 1
            request: messages.AssembleContextRequest = {**self._assembly, "iteration": iteration}
            window = await self._sidecar.assemble_context(**request)
            self._assembled, self.last_window = iteration, window
        items = [item_of(entry) for entry in window.entries]
        return items if limit is None else items[-limit:] if limit > 0 else []

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Record the items in the iteration the last ``get_items`` assembled (a new one if none)."""
        async with self._lock:
            await self._open()
            iteration = self._assembled if self._assembled and self._assembled >= self._latest else self._latest + 1
            events = [event for item in items if (event := event_of(item, iteration)) is not None]
            if events:
                await self._sidecar.append_events(run_id=self.session_id, events=events)
                self._latest = iteration

    async def pop_item(self) -> TResponseInputItem | None:
        raise NotImplementedError("the sidecar's transcript is append-only: a window once fed never changes; "
                                  "clear_session() deletes the run, ForkRun branches it")

    async def clear_session(self) -> None:
        """Delete the run and all it holds; the next call opens it anew."""
        async with self._lock:
            try:
                await self._sidecar.delete_run(run_id=self.session_id)
            except NotFoundError:
                pass  # never opened, or deleted already: cleared either way
            self._opened, self._assembled, self._latest, self.last_window = False, 0, 0, None

    async def _open(self) -> None:
        """Open the run (or confirm it), and learn its newest iteration: the events page by page."""
        if self._opened:
            return
        await self._sidecar.open_run(**self._settings)
        from_seq: int | None = 0
        while from_seq is not None:
            page = await self._sidecar.list_run_events(run_id=self.session_id, from_seq=from_seq, limit=1000)
            if page.events:
                self._latest = page.events[-1].iteration
            from_seq = page.next_from_seq if page.HasField("next_from_seq") else None
        self._opened = True


def event_of(item: TResponseInputItem, iteration: int) -> messages.Event | None:
    """The event an input item is recorded as (None: an item the transcript does not keep)."""
    fields = cast(dict[str, Any], item)
    kind = fields.get("type", "message")
    event: messages.Event = {"event_id": uuid.uuid4().hex, "iteration": iteration}
    if kind == "message":
        role = "system" if fields["role"] == "developer" else fields["role"]
        return {**event, "role": role, "content": text_of(fields["content"], kind)}
    if kind == "function_call":
        return {**event, "role": "assistant", "type": "tool_call", "call_id": fields["call_id"],
                "tool_name": fields["name"], "content": fields["arguments"]}
    if kind == "function_call_output":
        return {**event, "role": "tool", "type": "tool_result", "call_id": fields["call_id"],
                "content": text_of(fields["output"], kind)}
    if kind == "reasoning":
        return None
    raise ValueError(f"a {kind} item cannot be kept in the sidecar's transcript (messages and function calls can)")


def text_of(content: Any, kind: str) -> str:
    """A message's or a tool output's text: a string, or text parts joined."""
    if isinstance(content, str):
        return content
    parts = list(content)
    if all(part.get("type") in TEXT_PARTS for part in parts):
        return "".join(part["text"] for part in parts)
    if kind == "message" and all(part.get("type") in (*TEXT_PARTS, "refusal") for part in parts):
        return "".join(part.get("text", part.get("refusal", "")) for part in parts)
    raise ValueError(f"a {kind} with {json.dumps(sorted({part.get('type') for part in parts}))} parts cannot be "
                     "kept in the sidecar's transcript (text only)")


def item_of(entry: pb.WindowEntry) -> TResponseInputItem:
    """A window entry as the input item the model is given: its text as fed."""
    if entry.type == "tool_call":
        return cast("TResponseInputItem", {"type": "function_call", "call_id": entry.call_id, "name": entry.tool_name,
                                           "arguments": entry.text})
    if entry.type == "tool_result":
        return cast("TResponseInputItem", {"type": "function_call_output", "call_id": entry.call_id,
                                           "output": entry.text})
    # A message, or a summary standing in for older turns: its role, or the user's.
    role = entry.role if entry.role in ("user", "assistant", "system") else "user"
    return cast("TResponseInputItem", {"role": role, "content": entry.text})
