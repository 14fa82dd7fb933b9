"""An OpenAI Agents SDK agent whose history the sidecar keeps: bounded, cache-stable, shared."""

import asyncio

from agents import Agent, Model, Runner
from context_sidecar_client.agents import AgentsSession
from context_sidecar_client.aio import AsyncClient


async def chat(target: str, questions: list[str], model: str | Model = "gpt-4.1") -> None:
    async with AsyncClient(target) as sidecar:
        session = AgentsSession("chat-1", sidecar, settings={"transcript_token_budget": 8000})
        agent = Agent(name="Assistant", instructions="Answer briefly.", model=model)
        for question in questions:
            result = await Runner.run(agent, question, session=session)  # history: the sidecar's window
            print(result.final_output)


if __name__ == "__main__":
    asyncio.run(chat("127.0.0.1:50051", ["What does the refund policy say?", "And for opened items?"]))
