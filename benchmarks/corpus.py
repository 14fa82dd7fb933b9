"""Deterministic transcript events of about 200 o200k tokens each: prose, JSON and code.

A turn is four events: the user's prose, the assistant's tool call (JSON), the tool's result
(JSON or code, tied to the call by call_id) and the assistant's answer (prose or code). The same
seed always gives the same events, so two runs of a benchmark load identical transcripts.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import NamedTuple

EVENTS_PER_TURN = 4
_WORDS = ("the agent reads the file and calls a tool to search for the refund policy then it summarises "
          "what the customer asked about shipping invoices latency budget context window token cache "
          "prefix replay summary memory tenant error retry timeout result value config index").split()
_NAMES = ("user_id", "order", "status", "items", "total", "currency", "created_at", "notes", "tags", "score")
_CODE = [
    "def {name}(items, limit={n}):\n    seen = set()\n    out = []\n    for item in items:\n"
    "        if item.key in seen:\n            continue\n        seen.add(item.key)\n        out.append(item)\n"
    "        if len(out) >= limit:\n            break\n    return out\n",
    "async function {name}(client, id) {{\n  const res = await client.get(`/v1/items/${{id}}?limit={n}`);\n"
    "  if (!res.ok) throw new Error(`status ${{res.status}}`);\n"
    "  return (await res.json()).items.map((x) => x.name);\n}}\n",
    "SELECT o.id, o.total, c.name FROM orders o JOIN customers c ON c.id = o.customer_id\n"
    "WHERE o.created_at > now() - interval '{n} days' AND o.status = '{name}'\nORDER BY o.total DESC LIMIT 50;\n",
]


class CorpusEvent(NamedTuple):
    event_id: str
    iteration: int
    role: str
    type: str
    content: str
    call_id: str


def prose(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(195)).capitalize() + "."


def json_document(rng: random.Random) -> str:
    rows = [{name: rng.choice((rng.randrange(10_000), rng.choice(_WORDS), rng.random() < 0.5))
             for name in rng.sample(_NAMES, 6)} for _ in range(5)]
    return json.dumps({"tool": "search", "ok": True, "rows": rows})


def code(rng: random.Random) -> str:
    return "".join(rng.choice(_CODE).format(name=rng.choice(_WORDS) + "_" + rng.choice(_WORDS), n=rng.randrange(100))
                   for _ in range(3))


def events(count: int, seed: int = 1) -> Iterator[CorpusEvent]:
    """``count`` events of a run, turn after turn from iteration 1."""
    rng = random.Random(seed)
    for seq in range(count):
        turn, step = divmod(seq, EVENTS_PER_TURN)
        call_id = f"call-{turn}"
        if step == 0:
            role, type_, content, call_id = "user", "message", prose(rng), ""
        elif step == 1:
            role, type_, content = "assistant", "tool_call", json_document(rng)
        elif step == 2:
            role, type_, content = "tool", "tool_result", rng.choice((json_document, code))(rng)
        else:
            role, type_, content, call_id = "assistant", "message", rng.choice((prose, code))(rng), ""
        yield CorpusEvent(f"e{seq}", turn + 1, role, type_, content, call_id)


def contents(count: int, seed: int) -> list[str]:
    """``count`` more ~200-token texts, for the events a benchmark appends turn by turn."""
    rng = random.Random(seed)
    return [rng.choice((prose, json_document, code))(rng) for _ in range(count)]
