"""A real OpenHands Conversation in replay mode (``ScriptedLLM``) on ``AgentmarsRuntime``,
through the gateway to vLLM CPU with the plugin (MARS), its terminal commands in the
sandbox pool whose events go to the gateway: the gateway sees one session (the
workload's), the calls and tools in the order the agent made them, the engine generating
each turn's scripted output; every call after a tool resumes warm (vLLM's prefix cache
holds the context the previous call left, as ``cached_tokens`` in its usage)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("openhands.tools.terminal")

from openhands.sdk import Agent, Tool

from agentmars.runtime.openhands import AgentmarsRuntime
from agentmars.runtime.openhands.scripted import ScriptedLLM, script_of
from agentmars.runtime.replay.repository import write_repository
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.events import LLMEnd, LLMSubmit, SessionEnd, ToolEnd, ToolEnqueue
from agentmars.sdk.sinks.http import HttpSink
from agentmars.server.engines.vllm.launch import CPU_BLOCK_SIZE, SERVED_MODEL_NAME
from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec
from tests.server.engines.vllm.helpers import LinkedEngine, linked_gateway, linked_vllm

TOKEN = "openhands-token"
SESSION = "replayed-on-vllm"
SPEC = SessionSpec(
    session_id=SESSION,
    turns=(
        TurnSpec(append_tokens=1, output_tokens=8, tool=ToolSpec(kind="read", wall_s=0.3)),
        TurnSpec(
            append_tokens=1, output_tokens=6, tool=ToolSpec(kind="test", wall_s=0.5, cpu_s=0.2)
        ),
        TurnSpec(append_tokens=1, output_tokens=4),
    ),
)  # fmt: skip


@pytest.fixture(scope="module")
def mars(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinkedEngine]:
    folder = tmp_path_factory.mktemp("openhands-vllm")
    # OpenHands' system prompt is some thousands of the tiny tokenizer's tokens.
    with linked_vllm(vllm_python, folder, "mars", num_blocks=320, max_model_len=16384) as engine:
        yield engine


@pytest.mark.slow
def test_a_replayed_openhands_conversation_on_vllm(mars: LinkedEngine, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    write_repository(repository, seed=3)
    with linked_gateway(mars, TOKEN, "mars") as (client, gateway):
        base = str(client.base_url).rstrip("/")

        async def replay() -> str:
            sink = HttpSink(base + "/v1/events", token=TOKEN)
            config = SandboxConfig(workspace_root=tmp_path / "ws")
            try:
                async with SandboxPool(config, emitter=Emitter([sink])) as pool:
                    runtime = AgentmarsRuntime(base, pool)
                    llm = ScriptedLLM.of(
                        script_of(SPEC), model=f"openai/{SERVED_MODEL_NAME}", usage_id="replay"
                    )
                    agent = Agent(llm=llm, tools=[Tool(name="terminal")])

                    def converse() -> str:
                        with runtime.conversation(
                            agent,
                            files=repository,
                            conversation_id=uuid.uuid4(),
                            session_id=SESSION,
                            visualizer=None,
                        ) as conversation:
                            conversation.send_message("replay")
                            conversation.run()
                            return str(conversation.state.execution_status.value)

                    return await asyncio.to_thread(converse)
            finally:
                sink.close()

        assert asyncio.run(replay()) == "finished"
        events = [e for e in gateway.hub.events() if getattr(e, "session_id", None) == SESSION]

    order = [(type(e).__name__, getattr(e, "turn", None)) for e in events
             if isinstance(e, LLMSubmit | LLMEnd | ToolEnqueue | ToolEnd | SessionEnd)]  # fmt: skip
    assert order == [
        ("LLMSubmit", 0), ("LLMEnd", 0), ("ToolEnqueue", 0), ("ToolEnd", 0),
        ("LLMSubmit", 1), ("LLMEnd", 1), ("ToolEnqueue", 1), ("ToolEnd", 1),
        ("LLMSubmit", 2), ("LLMEnd", 2), ("SessionEnd", None),
    ]  # fmt: skip
    submits = [e for e in events if isinstance(e, LLMSubmit)]
    assert [e.follows_tool for e in submits] == [False, True, True]
    ends = [e for e in events if isinstance(e, LLMEnd)]
    assert [(e.status, e.output_tokens) for e in ends] == [("ok", 8), ("ok", 6), ("ok", 4)]
    assert all(e.status == "ok" for e in events if isinstance(e, ToolEnd))
    # Warm resumes: each call after a tool finds the previous call's prompt in the
    # prefix cache, all its full blocks.
    for before, after in itertools.pairwise(ends):
        assert before.prompt_tokens is not None and after.cached_tokens is not None
        assert after.cached_tokens >= before.prompt_tokens // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE
