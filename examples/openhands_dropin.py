"""An OpenHands agent served by agentmars: its LLM calls through the gateway, one session
per conversation, its terminal / file editor / task tracker in the sandbox pool.

The agent is plain OpenHands (an ``LLM``, an ``Agent`` with tool specs); two lines make
its conversation an agentmars one: ``AgentmarsRuntime(gateway, pool)`` and
``runtime.conversation(agent)`` in place of ``Conversation(agent=agent, ...)``. The
pool's events (each tool's enqueue, start and end, and the session's end) go to the
gateway's event stream, where its policy reads them, and to a JSONL file here.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

# First: it tells LiteLLM (imported by OpenHands) not to fetch its model-cost map from
# the internet (serving hosts often have no route out).
from agentmars.runtime.openhands import AgentmarsRuntime

# isort: split
# The command line is the OpenAI example's (same folder).
from decorated_agent_loop import parse_args
from openhands.sdk import LLM, Agent, Tool

from agentmars import sdk
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter

TASK = "Look around the working directory with the terminal, then call finish."


async def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    gateway = args.base_url.removesuffix("/").removesuffix("/v1")
    llm = LLM(
        model=f"openai/{args.model}", api_key=args.api_key, usage_id="agent",
        reasoning_effort=None, num_retries=0,
    )  # fmt: skip
    agent = Agent(
        llm=llm, tools=[Tool(name="terminal"), Tool(name="file_editor"), Tool(name="task_tracker")]
    )
    # The gateway's event ingest needs its control token.
    to_gateway = sdk.HttpSink(gateway + "/v1/events", token=os.environ["AGENTMARS_GATEWAY_TOKEN"])
    emitter = Emitter([sdk.JsonlSink(args.events), to_gateway])
    with tempfile.TemporaryDirectory(prefix="agentmars-example-") as workspaces:
        config = SandboxConfig(workspace_root=Path(workspaces))
        async with SandboxPool(config, emitter=emitter) as pool:
            runtime = AgentmarsRuntime(gateway, pool)

            def converse() -> str:
                with runtime.conversation(
                    agent, visualizer=None, max_iteration_per_run=args.max_turns
                ) as conversation:
                    conversation.send_message(TASK)
                    conversation.run()
                    status = conversation.state.execution_status.value
                    return f"conversation {conversation.id}: {status}"

            # OpenHands runs a conversation synchronously; the pool lives on this loop.
            print(await asyncio.to_thread(converse))
    emitter.close()  # flushes the file and the gateway's queue
    print(f"events in {args.events}")


if __name__ == "__main__":
    asyncio.run(main())
