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
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from openhands.sdk import LLM, Agent, LocalConversation
from openhands.sdk.conversation.state import ConversationExecutionStatus
from pydantic import SecretStr

from agentmars.runtime.openhands.binding import SandboxSession
from agentmars.runtime.openhands.hosted import HostedPool
from agentmars.runtime.openhands.markers import SessionMarkers
from agentmars.runtime.openhands.tools import bind, sandboxed_specs, session_of, unbind
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import SandboxError
from agentmars.sandbox.threads import in_thread
from agentmars.sdk.auth import GATEWAY_TOKEN_ENV
from agentmars.sdk.events import SessionEnd

GATEWAY_ENV = "AGENTMARS_GATEWAY_URL"
DEFAULT_GATEWAY = "http://127.0.0.1:8080"
"""``agentmars serve``'s own default."""
API_KEY = "agentmars"
"""Sent when the agent's LLM has no key: the gateway's LLM routes need none, LiteLLM's
OpenAI provider needs one."""


class AgentmarsRuntime:
    """Conversations of OpenHands agents served by agentmars.

    - ``AgentmarsRuntime()``: the runtime starts its own sandbox pool, on an event loop
      of its own, its events posted to the gateway (``gateway``, else
      ``$AGENTMARS_GATEWAY_URL``, else serve's default) with the gateway's token
      (``token``, else ``$AGENTMARS_GATEWAY_TOKEN``). For synchronous programs: the
      drop-in.
    - ``AgentmarsRuntime(gateway, pool)``: conversations on a pool the caller started;
      make it inside the event loop that runs ``pool`` and run conversations in other
      threads (``await asyncio.to_thread(conversation.run)``).
    """

    def __init__(
        self,
        gateway: str | None = None,
        pool: SandboxPool | None = None,
        *,
        token: str | None = None,
        sandbox: SandboxConfig | None = None,
    ) -> None:
        self.gateway = (gateway or os.environ.get(GATEWAY_ENV) or DEFAULT_GATEWAY).rstrip("/")
        self._open: dict[str, LocalConversation] = {}
        self._hosted: HostedPool | None = None
        if pool is not None:
            self.pool = pool
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError(
                    "make AgentmarsRuntime(gateway, pool) inside the event loop that runs "
                    "its SandboxPool (in `async with SandboxPool(...) as pool:`), or "
                    "AgentmarsRuntime() to let it start its own"
                ) from None
            return
        token = token or os.environ.get(GATEWAY_TOKEN_ENV)
        if not token:
            raise ValueError(
                f"the gateway's event endpoint needs its token: give token= or set "
                f"${GATEWAY_TOKEN_ENV} (`agentmars serve` prints the one it made)"
            )
        self._hosted = HostedPool(
            self.gateway, token, sandbox or SandboxConfig(), self._close_open
        ).start()
        self.pool, self._loop = self._hosted.pool, self._hosted.loop

    def Conversation(
        self,
        agent: Agent,
        *,
        workspace: str | Path | None = None,
        conversation_id: uuid.UUID | None = None,
        callbacks: Sequence[Any] = (),
        **options: Any,
    ) -> LocalConversation:
        """OpenHands' ``Conversation(agent=..., workspace=...)`` on agentmars. The agent
        works in its sandbox session's workspace: ``workspace``'s files are copied in
        first, and what the agent wrote is copied back when the conversation closes
        (``close()``, or the program's exit); files it deleted stay."""
        folder = None if workspace is None else Path(workspace)
        return self._start(agent, folder, folder, conversation_id, None, callbacks, options)

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
        """An OpenHands conversation of ``agent`` on agentmars, closed at the block's
        end; ``files`` are copied into its workspace first (nothing is copied back);
        ``session_id`` names its session (default: the conversation id; a replayed
        workload's own names); ``options`` go to ``Conversation``."""
        if "workspace" in options:
            raise ValueError(
                "the conversation works in its sandbox session's workspace: give files= "
                "to copy a folder into it, not workspace= (or runtime.Conversation(agent, "
                "workspace=...), which copies what the agent wrote back)"
            )
        conversation = self._start(
            agent, files, None, conversation_id, session_id, callbacks, options
        )
        try:
            yield conversation
        finally:
            conversation.close()

    def close(self) -> None:
        """Close the conversations still open, then the pool the runtime started (a
        given pool is its owner's to close)."""
        if self._hosted is not None:
            self._hosted.close()
        else:
            self._close_open()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(
        self,
        agent: Agent,
        files: Path | None,
        copy_back: Path | None,
        conversation_id: uuid.UUID | None,
        session_id: str | None,
        callbacks: Sequence[Any],
        options: dict[str, Any],
    ) -> LocalConversation:
        conversation_id = conversation_id or uuid.uuid4()
        session_id = session_id or str(conversation_id)
        workspace = self._call(in_thread(self.pool.open_session, session_id))
        ending = _Ending(str(conversation_id), session_id, workspace, copy_back)
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
            conversation = _ServedConversation(
                agent=served,
                workspace=str(workspace),
                conversation_id=conversation_id,
                callbacks=[markers.on_event, *callbacks],
                **options,
            )
        except BaseException:
            self._end(ending, None)
            raise
        conversation.on_close = lambda: self._end(ending, conversation)
        self._open[ending.conversation_id] = conversation
        return conversation

    def _close_open(self) -> None:
        for conversation in list(self._open.values()):
            conversation.close()

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

    def _end(self, ending: _Ending, conversation: LocalConversation | None) -> None:
        """The conversation's end on agentmars: its files copied back (if asked), its
        sandbox session closed and ``session_end`` sent."""
        status, turns = "error", 0
        error: str | None = "the conversation could not start"
        if conversation is not None:
            state = conversation.state.execution_status
            status = "ok" if state == ConversationExecutionStatus.FINISHED else "error"
            error = None if status == "ok" else f"the conversation ended {state.value}"
            turns = self.markers(conversation).turn
        self._open.pop(ending.conversation_id, None)
        unbind(ending.conversation_id)
        if ending.copy_back is not None:
            # Links copied as links: one made in the sandbox may point anywhere.
            shutil.copytree(ending.workspace, ending.copy_back, symlinks=True, dirs_exist_ok=True)
        # One that cannot be closed is unmounted when the pool closes.
        with contextlib.suppress(SandboxError):
            self._call(self.pool.close_session(ending.session_id))
        self.pool.emitter.emit(
            SessionEnd(
                session_id=ending.session_id,
                status=status,
                error=error,
                turns=turns,
                duration_s=time.monotonic() - ending.started,
            )
        )


_DEFAULT: list[AgentmarsRuntime] = []
_DEFAULT_LOCK = threading.Lock()


def Conversation(  # named as the OpenHands factory it stands in for
    agent: Agent, *, workspace: str | Path | None = None, **options: Any
) -> LocalConversation:
    """OpenHands' ``Conversation`` on agentmars, the drop-in: import it from here instead
    of ``openhands.sdk``. Conversations share one ``AgentmarsRuntime()``, started at
    the first (the gateway from ``$AGENTMARS_GATEWAY_URL`` and
    ``$AGENTMARS_GATEWAY_TOKEN``) and closed when the program exits."""
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            _DEFAULT.append(AgentmarsRuntime())
    return _DEFAULT[0].Conversation(agent, workspace=workspace, **options)


@dataclass
class _Ending:
    """What ending a conversation needs."""

    conversation_id: str
    session_id: str
    workspace: Path
    copy_back: Path | None
    started: float = field(default_factory=time.monotonic)


class _ServedConversation(LocalConversation):
    """OpenHands' local conversation that ends its agentmars session when it closes
    (``close()``, ``with`` or OpenHands' own exit hook)."""

    on_close: Callable[[], None] | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            end, self.on_close = self.on_close, None
            if end is not None:
                end()
