"""``AgentmarsRuntime``: OpenHands conversations served by agentmars.

``runtime.conversation(agent)`` makes an OpenHands ``Conversation`` of an unchanged
``Agent`` in which:

- the LLM is a fresh copy of the agent's (one per conversation: OpenHands keeps
  telemetry on the LLM object) pointed at the gateway (``base_url``), its
  ``litellm_extra_body`` carrying the conversation's session markers
  (``markers.SessionMarkers``, moved on by a conversation callback);
- the terminal, file editor and task tracker run under the sandbox pool, in a sandbox
  session named by the conversation id (``tools``), whose workspace is the
  conversation's;
- closing it (the ``with`` block's end) closes the sandbox session (its running
  commands killed, its workspace removed) and sends ``session_end`` to the pool's
  event stream (the gateway's, when the pool's emitter goes there), which ends the
  session for the gateway's admission half.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from openhands.sdk import LLM, Agent, Conversation, LocalConversation
from openhands.sdk.conversation.state import ConversationExecutionStatus
from pydantic import SecretStr

from agentmars.runtime.openhands.binding import SandboxSession
from agentmars.runtime.openhands.markers import SessionMarkers
from agentmars.runtime.openhands.tools import bind, sandboxed_specs, session_of, unbind
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import SandboxError
from agentmars.sandbox.threads import in_thread
from agentmars.sdk.events import SessionEnd

API_KEY = "agentmars"
"""Sent when the agent's LLM has no key: the gateway's LLM routes need none, LiteLLM's
OpenAI provider needs one."""


class AgentmarsRuntime:
    """Make it inside the event loop that runs ``pool``; run conversations in other
    threads (``await asyncio.to_thread(conversation.run)``)."""

    def __init__(self, gateway: str, pool: SandboxPool) -> None:
        self.gateway = gateway.rstrip("/")
        self.pool = pool
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "make AgentmarsRuntime inside the event loop that runs its SandboxPool "
                "(in `async with SandboxPool(...) as pool:`)"
            ) from None

    @contextlib.contextmanager
    def conversation(
        self,
        agent: Agent,
        *,
        files: Path | None = None,
        conversation_id: uuid.UUID | None = None,
        session_id: str | None = None,
        callbacks: Sequence[Any] = (),
        **options: Any,
    ) -> Iterator[LocalConversation]:
        """An OpenHands conversation of ``agent`` on agentmars; ``files`` are copied
        into its workspace first; ``session_id`` names its session (default: the
        conversation id; a replayed workload's own names); ``options`` go to
        ``Conversation``."""
        if "workspace" in options:
            raise ValueError(
                "the conversation works in its sandbox session's workspace: give files= "
                "to copy a folder into it, not workspace="
            )
        conversation_id = conversation_id or uuid.uuid4()
        session_id = session_id or str(conversation_id)
        workspace = self._call(in_thread(self.pool.open_session, session_id))
        started = time.monotonic()
        conversation: LocalConversation | None = None
        try:
            if files is not None:
                shutil.copytree(files, workspace, dirs_exist_ok=True)
            llm = self._gateway_llm(agent.llm)
            markers = SessionMarkers(session_id, llm.litellm_extra_body)
            bind(
                str(conversation_id),
                SandboxSession(self.pool, self._loop, session_id, workspace, markers),
            )
            served = agent.model_copy(update={"llm": llm, "tools": sandboxed_specs(agent.tools)})
            made = Conversation(
                agent=served,
                workspace=str(workspace),
                conversation_id=conversation_id,
                callbacks=[markers.on_event, *callbacks],
                **options,
            )
            assert isinstance(made, LocalConversation)
            conversation = made
            yield conversation
        finally:
            self._close(str(conversation_id), session_id, conversation, started)

    def markers(self, conversation: LocalConversation) -> SessionMarkers:
        """The markers of a conversation made here (to say which tool comes next)."""
        return session_of(conversation.state).markers

    def _gateway_llm(self, llm: LLM) -> LLM:
        """The agent's LLM pointed at the gateway, with a body of its own for the
        markers and metrics of its own (``reset_metrics``: a copy shares them). A copy
        is not validated: values go in as the fields keep them (a ``SecretStr`` key)."""
        served = llm.model_copy(
            update={
                "base_url": f"{self.gateway}/v1",
                "api_key": llm.api_key or SecretStr(API_KEY),
                "litellm_extra_body": dict(llm.litellm_extra_body or {}),
            }
        )
        served.reset_metrics()
        return served

    def _call(self, work: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def _close(
        self,
        conversation_id: str,
        session_id: str,
        conversation: LocalConversation | None,
        started: float,
    ) -> None:
        status, turns = "error", 0
        error: str | None = "the conversation could not start"
        if conversation is not None:
            state = conversation.state.execution_status
            status = "ok" if state == ConversationExecutionStatus.FINISHED else "error"
            error = None if status == "ok" else f"the conversation ended {state.value}"
            turns = self.markers(conversation).turn
            conversation.close()
        unbind(conversation_id)
        # One that cannot be closed is unmounted when the pool closes.
        with contextlib.suppress(SandboxError):
            self._call(self.pool.close_session(session_id))
        self.pool.emitter.emit(
            SessionEnd(
                session_id=session_id,
                status=status,
                error=error,
                turns=turns,
                duration_s=time.monotonic() - started,
            )
        )
