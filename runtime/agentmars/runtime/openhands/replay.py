"""Trace-replay agents as OpenHands conversations: each session of a workload is a real
OpenHands ``Conversation`` on ``AgentmarsRuntime`` whose model is the session's script
(``ScriptedLLM``: the workload's tools as terminal commands, every call's work done by
the engine behind the gateway).

The run's records are the agents' view, as for the plain replay agents: the SDK's LiteLLM
instrumentation (``instrument_litellm``) records each call's submit, first token and
end (streamed: OpenHands streams when the conversation takes tokens), within an SDK
session named like the workload's session; the pool records the tools. The session
markers on the wire are the runtime's and the SDK's alike (one call, one turn; a call
after a tool follows it), so either may write them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from litellm.exceptions import OpenAIError as LiteLLMError
from openhands.sdk import Agent, Tool
from openhands.sdk.conversation.exceptions import ConversationRunError
from openhands.sdk.conversation.state import ConversationExecutionStatus

from agentmars import sdk
from agentmars.runtime.openhands.runtime import AgentmarsRuntime
from agentmars.runtime.openhands.scripted import ScriptedLLM, script_of
from agentmars.runtime.replay.agent import ReplayError, ReplayOptions, WorkloadReplay
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.integrations.litellm import instrument_litellm, uninstrument_litellm
from agentmars.sdk.sinks import MemorySink
from agentmars.server.workloads.model import SessionSpec, Workload

TASK = "Work on the repository in the working directory, then finish."


def _ignore_tokens(_chunk: Any) -> None:
    """A token callback: with one, OpenHands streams its calls (first tokens seen)."""


class OpenHandsReplayAgents(WorkloadReplay):
    FAILURES = (*WorkloadReplay.FAILURES, ConversationRunError, LiteLLMError)

    def __init__(
        self, gateway: str, pool: SandboxPool, events: MemorySink, options: ReplayOptions
    ) -> None:
        super().__init__(pool, events, options)
        self._runtime = AgentmarsRuntime(gateway, pool)
        # The gateway records its own LLM events: the SDK's go to the run's record only.
        self._emitter = Emitter([events])
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        instrument_litellm()

    async def run(self, workload: Workload, on_done: Any = None) -> Any:
        # One thread per session: a conversation blocks its thread for its whole life,
        # and must not take the loop's default executor, which the pool uses.
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=len(workload.sessions), thread_name_prefix="openhands-replay"
        )
        try:
            return await super().run(workload, on_done)
        finally:
            self._threads.shutdown(wait=True)

    async def close(self) -> None:
        uninstrument_litellm()

    async def _agent(self, spec: SessionSpec) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._threads, self._converse, spec)

    def _converse(self, spec: SessionSpec) -> None:
        script = script_of(spec)
        llm = ScriptedLLM.of(
            script, model=f"openai/{self._options.model}", usage_id=spec.session_id, stream=True
        )
        agent = Agent(llm=llm, tools=[Tool(name="terminal")])
        with (
            sdk.session(
                spec.session_id, agent=spec.agent, task_id=spec.task_id, emitter=self._emitter
            ),
            self._runtime.conversation(
                agent,
                session_id=spec.session_id,
                visualizer=None,
                token_callbacks=[_ignore_tokens],
                max_iteration_per_run=len(script) + 1,
            ) as conversation,
        ):
            # Through Any: mypy, checking for Python 3.11, reads OpenHands' `@observe`
            # (PEP 695 generics) as taking and returning Never.
            driven: Any = conversation
            driven.send_message(TASK)
            driven.run()
            status = conversation.state.execution_status
        if status != ConversationExecutionStatus.FINISHED:
            raise ReplayError(f"the conversation ended {status.value}")
