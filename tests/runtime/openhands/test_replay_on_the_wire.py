"""An OpenHands Conversation in replay mode (``ScriptedLLM``) through the gateway to the
twin (``agentmars serve --engine sim``), its tools in the sandbox pool whose events go to
the gateway: at the gateway, one session of the conversation's id, its LLM calls and
tool calls in the order the agent made them, each call with its turn, whether it follows
a tool, and the tool its answer calls; the session's end last."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("openhands.tools.terminal")
from openhands.sdk import Agent, Tool

from agentmars.runtime.openhands import AgentmarsRuntime
from agentmars.runtime.openhands.scripted import ScriptedLLM, script_of
from agentmars.runtime.replay.repository import write_repository
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.sinks.http import HttpSink
from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec
from tests.cli.serving import Twin, served_twin

SPEC = SessionSpec(
    session_id="replayed",
    turns=(
        TurnSpec(append_tokens=40, output_tokens=6, tool=ToolSpec(kind="read", wall_s=0.2)),
        TurnSpec(
            append_tokens=30, output_tokens=4, tool=ToolSpec(kind="test", wall_s=0.3, cpu_s=0.1)
        ),
        TurnSpec(append_tokens=20, output_tokens=3),
    ),
)  # fmt: skip


@pytest.fixture(scope="module")
def twin() -> Iterator[Twin]:
    with served_twin() as served:
        yield served


class GatewayEvents:
    """The gateway's event stream (``/v1/events/stream``), read in a thread from
    before the conversation starts until the conversation's session ends."""

    def __init__(self, twin: Twin, session_id: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._ready = threading.Event()
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(twin, session_id), daemon=True)
        self._reader.start()
        assert self._ready.wait(10), "the gateway's event stream did not open"

    def _read(self, twin: Twin, session_id: str) -> None:
        headers = {"Authorization": f"Bearer {twin.token}"}
        with httpx.stream(
            "GET", twin.base + "/v1/events/stream", headers=headers, timeout=60
        ) as response:
            self._ready.set()
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line.removeprefix("data: "))
                if event.get("session_id") != session_id:
                    continue
                self.events.append(event)
                if event["kind"] == "session_end":
                    self._done.set()
                    return

    def wait(self) -> list[dict[str, Any]]:
        assert self._done.wait(30), [e["kind"] for e in self.events]
        return self.events


@pytest.fixture
async def pool(tmp_path: Path, twin: Twin) -> AsyncIterator[SandboxPool]:
    sink = HttpSink(twin.base + "/v1/events", token=twin.token)
    config = SandboxConfig(workspace_root=tmp_path / "ws")
    async with SandboxPool(config, emitter=Emitter([sink])) as started:
        yield started
    sink.close()


async def test_a_replayed_conversation_is_one_session_at_the_gateway(
    twin: Twin, pool: SandboxPool, tmp_path: Path
) -> None:
    served = httpx.get(twin.base + "/v1/models", timeout=5).json()["data"][0]["id"]
    repository = tmp_path / "repository"
    write_repository(repository, seed=1)
    conversation_id = uuid.uuid4()
    session = str(conversation_id)
    stream = GatewayEvents(twin, session)
    runtime = AgentmarsRuntime(twin.base, pool)
    llm = ScriptedLLM.of(script_of(SPEC), model=f"openai/{served}", usage_id="replay")
    agent = Agent(llm=llm, tools=[Tool(name="terminal")])

    def converse() -> str:
        with runtime.conversation(
            agent, files=repository, conversation_id=conversation_id, visualizer=None
        ) as conversation:
            conversation.send_message("replay")
            conversation.run()
            return str(conversation.state.execution_status.value)

    assert await asyncio.to_thread(converse) == "finished"
    events = stream.wait()

    # The boundaries in order; the engine's own pins (kv_pin / kv_unpin) come between
    # them as its policy decides, and first tokens with every streamed call.
    boundaries = [e for e in events if e["kind"] not in ("llm_first_token", "kv_pin", "kv_unpin")]
    kinds = [(e["kind"], e.get("turn")) for e in boundaries]
    assert kinds == [
        ("llm_submit", 0), ("llm_end", 0),
        ("tool_enqueue", 0), ("tool_start", 0), ("tool_end", 0),
        ("llm_submit", 1), ("llm_end", 1),
        ("tool_enqueue", 1), ("tool_start", 1), ("tool_end", 1),
        ("llm_submit", 2), ("llm_end", 2),
        ("session_end", None),
    ]  # fmt: skip
    submits = [e for e in events if e["kind"] == "llm_submit"]
    assert [e["follows_tool"] for e in submits] == [False, True, True]
    assert [e["expects_tool"] for e in submits] == [True, True, True]
    ends = [e for e in events if e["kind"] == "llm_end"]
    assert [e["output_tokens"] for e in ends] == [6, 4, 3]  # the script's, ignore_eos
    assert all(e["status"] == "ok" for e in events if e["kind"] == "tool_end")
    assert events[-1]["status"] == "ok"
