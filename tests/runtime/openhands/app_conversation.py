"""Run by ``test_openhands_app.py`` with the OpenHands application's Python (openhands-ai
1.11 on openhands-sdk 1.34, ``scripts/openhands-env.sh``): a scripted conversation on
AgentmarsRuntime, printed as JSON (the SDK's version, each observation's text and exit
code, the tool events' tools and turns). Argument: a folder for the pool's workspaces."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

# isort: split
import asyncio
import json
import sys
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any

from openhands.sdk import Agent, Tool
from openhands.sdk.event import ObservationEvent
from openhands.sdk.llm import Message, MessageToolCall, TextContent
from openhands.sdk.testing import TestLLM

from agentmars.runtime.openhands import AgentmarsRuntime
from agentmars.sandbox.config import SandboxConfig, allowed_cores
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.events import ToolEnd
from agentmars.sdk.sinks.memory import MemorySink

COMMANDS = [
    "grep Cpus_allowed_list /proc/self/status; readlink /proc/self/ns/pid; mkdir sub && cd sub",
    "pwd; exit 3",
]


def scripted_call(index: int, tool: str, arguments: dict[str, Any]) -> Message:
    """An assistant message calling ``tool`` (a step of a ``TestLLM`` script)."""
    call = MessageToolCall(
        id=f"call-{index}", name=tool, arguments=json.dumps(arguments), origin="completion"
    )
    return Message(role="assistant", content=[TextContent(text="")], tool_calls=[call])


async def main(root: Path) -> None:
    events = MemorySink()
    core = allowed_cores()[-1]
    config = SandboxConfig(workspace_root=root, tool_cores=[core], engine_cores=[], slots=1)
    steps = [scripted_call(i, "terminal", {"command": c}) for i, c in enumerate(COMMANDS)]
    llm = TestLLM.from_messages([*steps, scripted_call(9, "finish", {"message": "done"})])
    observations: list[dict[str, Any]] = []

    def collect(event: Any) -> None:
        if isinstance(event, ObservationEvent) and event.tool_name == "terminal":
            observation = event.observation
            observations.append({"text": observation.text, "exit_code": observation.exit_code})

    async with SandboxPool(config, emitter=Emitter([events])) as pool:
        runtime = AgentmarsRuntime("http://127.0.0.1:9", pool)
        conversation_id = uuid.uuid4()

        def converse() -> str:
            with runtime.conversation(
                Agent(llm=llm, tools=[Tool(name="terminal")]),
                conversation_id=conversation_id,
                callbacks=[collect],
                visualizer=None,
            ) as conversation:
                conversation.send_message("work")
                conversation.run()
                return str(conversation.state.execution_status.value)

        status = await asyncio.to_thread(converse)
    tool_ends = [e for e in events.events if isinstance(e, ToolEnd)]
    print(
        json.dumps(
            {
                "sdk": version("openhands-sdk"),
                "status": status,
                "core": core,
                "workspace": str(root / str(conversation_id)),
                "host_pid_namespace": os.readlink("/proc/self/ns/pid"),
                "observations": observations,
                "tools": [
                    [e.tool, e.turn, e.session_id == str(conversation_id)] for e in tool_ends
                ],
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
