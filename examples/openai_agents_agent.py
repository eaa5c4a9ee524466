"""The OpenAI Agents SDK, unmodified, served through agentmars: an Agent with one
function tool, run to its final answer.

Nothing of agentmars is imported: the SDK's client is pointed at the gateway, and its
turns are chained (``auto_previous_response_id``: each Responses call continues the
previous response), which the gateway reads as one session.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess

from agents import (
    Agent,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


@function_tool
def terminal(command: str) -> str:
    """Run a read-only shell command (a few are allowed) and return its output."""
    allowed = {"ls", "pwd", "date", "whoami"}
    program = command.split()[0] if command.split() else ""
    if program not in allowed:
        return f"not allowed: {program!r}; use one of {sorted(allowed)}"
    done = subprocess.run(command.split(), capture_output=True, text=True, timeout=10)
    return done.stdout or done.stderr


async def solve(base_url: str, api_key: str, model: str, max_turns: int) -> str:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    agent = Agent(
        name="coder",
        instructions="Answer with the help of the terminal.",
        model=OpenAIResponsesModel(model=model, openai_client=client),
        tools=[terminal],
    )
    result = await Runner.run(
        agent, "What is in this folder?", max_turns=max_turns, auto_previous_response_id=True
    )
    return str(result.final_output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--model", default="cpu-tiny")
    parser.add_argument("--max-turns", type=int, default=10)
    args = parser.parse_args()
    set_tracing_disabled(True)  # the SDK would export its traces to OpenAI's platform
    answer = asyncio.run(solve(args.base_url, args.api_key, args.model, args.max_turns))
    print(f"final answer: {answer}")


if __name__ == "__main__":
    main()
