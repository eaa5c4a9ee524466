"""OpenHands' terminal, file editor and task tracker, run under the sandbox pool.

Each is the SDK's own tool class, subclassed under the same name the LLM sees
(``terminal``, ``file_editor``, ``task_tracker``) and registered under another
(``agentmars_terminal``...) that an agent's ``Tool`` specs name instead
(``sandboxed_specs``). Its ``create`` finds the conversation's sandbox session by the
conversation's id (``bind`` / ``unbind``, done by ``AgentmarsRuntime``):

- the terminal gets ``SandboxTerminal`` as its executor (``TerminalTool.create(...,
  executor=...)``): its commands run in the sandbox;
- the file editor and the task tracker keep their executors, which must run in the
  agent's process (the editor's undo history, the tracker's list), each call admitted
  by the pool and pinned to a slot's cores there (``SandboxPool.run_in_process``), with
  the pool's tool events and a span like the terminal's.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from openhands.sdk import Tool
from openhands.sdk.tool import Action, Observation, ToolDefinition, ToolExecutor, register_tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.task_tracker import TaskTrackerTool
from openhands.tools.terminal import TerminalTool

from agentmars.runtime.openhands.binding import SandboxSession
from agentmars.runtime.openhands.terminal import SandboxTerminal

if TYPE_CHECKING:
    from openhands.sdk.conversation import LocalConversation
    from openhands.sdk.conversation.state import ConversationState

T = TypeVar("T", bound=ToolDefinition[Any, Any])
_SESSIONS: dict[str, SandboxSession] = {}
_SESSIONS_LOCK = threading.Lock()


def bind(conversation_id: str, session: SandboxSession) -> None:
    with _SESSIONS_LOCK:
        _SESSIONS[conversation_id] = session


def unbind(conversation_id: str) -> None:
    with _SESSIONS_LOCK:
        _SESSIONS.pop(conversation_id, None)


def session_of(conv_state: ConversationState) -> SandboxSession:
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(str(conv_state.id))
    if session is None:
        raise ValueError(
            f"conversation {conv_state.id} has no sandbox session: agentmars' tools are for "
            "conversations made by AgentmarsRuntime.conversation(...)"
        )
    return session


class InProcess(ToolExecutor[Action, Observation]):
    """A tool executor of the agent's process, each call admitted by the pool."""

    def __init__(self, inner: ToolExecutor[Any, Any], session: SandboxSession, tool: str) -> None:
        self._inner = inner
        self._session = session
        self._tool = tool
        self._calls = itertools.count(1)

    def __call__(
        self, action: Action, conversation: LocalConversation | None = None
    ) -> Observation:
        call_id = f"{self._tool}-{next(self._calls)}"
        with self._session.span(self._tool, call_id):
            result: Observation = self._session.run_in_process(
                lambda: self._inner(action, conversation), tool=self._tool, call_id=call_id
            )
        return result

    def close(self) -> None:
        self._inner.close()


def _admitted(tools: Sequence[T], session: SandboxSession) -> list[T]:
    return [
        tool.set_executor(InProcess(tool.executor, session, tool.name))
        for tool in tools
        if tool.executor is not None
    ]


class SandboxTerminalTool(TerminalTool):
    name: ClassVar[str] = TerminalTool.name

    @classmethod
    def create(  # type: ignore[override]
        cls, conv_state: ConversationState, **params: Any
    ) -> Sequence[TerminalTool]:
        session = session_of(conv_state)
        timeout = params.get("no_change_timeout_seconds")
        terminal = (
            SandboxTerminal(session)
            if timeout is None
            else SandboxTerminal(session, no_change_timeout_s=float(timeout))
        )
        return super().create(conv_state, executor=terminal)


class SandboxFileEditorTool(FileEditorTool):
    name: ClassVar[str] = FileEditorTool.name

    @classmethod
    def create(cls, conv_state: ConversationState) -> Sequence[FileEditorTool]:  # type: ignore[override]
        return _admitted(super().create(conv_state), session_of(conv_state))


class SandboxTaskTrackerTool(TaskTrackerTool):
    name: ClassVar[str] = TaskTrackerTool.name

    @classmethod
    def create(cls, conv_state: ConversationState) -> Sequence[TaskTrackerTool]:  # type: ignore[override]
        return _admitted(super().create(conv_state), session_of(conv_state))


SANDBOXED: dict[str, type[ToolDefinition[Any, Any]]] = {
    f"agentmars_{tool.name}": tool
    for tool in (SandboxTerminalTool, SandboxFileEditorTool, SandboxTaskTrackerTool)
}
_REGISTERED_AS = {tool.name: registered for registered, tool in SANDBOXED.items()}
for _registered, _tool in SANDBOXED.items():
    register_tool(_registered, _tool)


def sandboxed_specs(specs: Sequence[Tool]) -> list[Tool]:
    """An agent's tool specs with the terminal, file editor and task tracker replaced by
    their sandboxed kin; other tools as they are."""
    return [
        spec.model_copy(update={"name": _REGISTERED_AS[spec.name]})
        if spec.name in _REGISTERED_AS
        else spec
        for spec in specs
    ]
