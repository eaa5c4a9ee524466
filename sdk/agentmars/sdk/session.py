"""Agent sessions and the context that attributes every event to one.

The current session lives in a ``contextvars.ContextVar``: asyncio tasks
inherit the session of the code that created them and cannot leak theirs back;
a new thread starts with no session (Python gives threads an empty context),
so each thread opens its own, or joins an existing one with ``attach()``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from typing import Self

from agentmars.sdk.emitter import Emitter, default_emitter
from agentmars.sdk.events import Event, SessionEnd, SessionStart, check_id, new_id
from agentmars.sdk.scope import Scope, outcome_of

_CURRENT: ContextVar[Session | None] = ContextVar("agentmars_session", default=None)


class NoActiveSession(RuntimeError):
    """An LLM or tool call was recorded outside any session."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} needs an active agentmars session: wrap the agent's work in "
            "`with agentmars.sdk.session(): ...` (or decorate it with @session()), "
            "or call `existing_session.attach()` in this thread / task"
        )


def current_session() -> Session | None:
    """The session of the calling thread / task, or None."""
    return _CURRENT.get()


def require_session(what: str) -> Session:
    found = _CURRENT.get()
    if found is None:
        raise NoActiveSession(what)
    return found


class Session(Scope):
    """One agent session: emits ``session_start`` on entry and ``session_end`` on exit,
    numbers the session's LLM calls (turns) and tracks the tool transitions that
    become ``follows_tool`` on the next LLM call.

    ``agent`` names the kind of agent (``coder``); ``task_id`` the agent instance
    (seed 004): the task that the sessions of a fan-out agent's branches share. Both
    go to the engine with every LLM call; ``task_id`` is also in ``session_start``'s
    metadata (as ``task_id``).

    Use it as ``with session(...) as s``, ``async with``, or ``@session(...)``.
    """

    def __init__(
        self,
        session_id: str | None = None,
        *,
        agent: str | None = None,
        task_id: str | None = None,
        metadata: dict[str, str] | None = None,
        emitter: Emitter | None = None,
    ) -> None:
        self._given_id = session_id
        # ``is not None``: an empty id is invalid, not a request for a random one.
        self.session_id = check_id(session_id, "session_id") if session_id is not None else new_id()
        self.agent = check_id(agent, "agent") if agent is not None else None
        self.task_id = check_id(task_id, "task_id") if task_id is not None else None
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ValueError("session metadata must map strings to strings")
        self.metadata = dict(metadata or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.metadata.items()):
            raise ValueError("session metadata must map strings to strings")
        if self.task_id is not None:
            self.metadata["task_id"] = self.task_id
        self.emitter = emitter or default_emitter()
        self.turns = 0
        self.tool_priority: int | None = None
        """The newest tool priority the gateway answered with (``X-Agentmars-Tool-
        Priority``; None before any): its ``ToolCall``s' default."""
        self._tool_result_pending = False
        self._lock = threading.Lock()
        self._started_ns: int | None = None
        self._ended = False
        self._token: Token[Session | None] | None = None

    def fresh(self) -> Self:
        return type(self)(
            self._given_id,
            agent=self.agent,
            task_id=self.task_id,
            metadata=self.metadata,
            emitter=self.emitter,
        )

    # --- lifecycle -----------------------------------------------------------

    def _open(self) -> None:
        if self._started_ns is not None:
            raise RuntimeError(f"session {self.session_id} was already started; open a new one")
        self._started_ns = time.monotonic_ns()
        self._token = _CURRENT.set(self)
        self.emit(
            SessionStart(session_id=self.session_id, agent=self.agent, metadata=self.metadata)
        )

    def _close(self, exc: BaseException | None) -> None:
        assert self._token is not None and self._started_ns is not None
        status, error = outcome_of(exc)
        self._ended = True
        self.emit(
            SessionEnd(
                session_id=self.session_id,
                status=status,
                error=error,
                turns=self.turns,
                duration_s=(time.monotonic_ns() - self._started_ns) / 1e9,
            )
        )
        # Closed from another context (e.g. a generator finalised elsewhere): the
        # context that opened it is gone, nothing to restore.
        with contextlib.suppress(ValueError):
            _CURRENT.reset(self._token)

    @contextlib.contextmanager
    def attach(self) -> Iterator[Self]:
        """Make this (already started) session current in another thread or task."""
        if self._started_ns is None or self._ended:
            state = "has ended" if self._ended else "has not started"
            raise RuntimeError(f"cannot attach to session {self.session_id}: it {state}")
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    @property
    def ended(self) -> bool:
        return self._ended

    # --- bookkeeping used by calls -------------------------------------------

    def emit(self, event: Event) -> None:
        self.emitter.emit(event)

    def begin_llm_call(self) -> tuple[int, bool]:
        """Allocate the next turn index; returns it and whether a tool result
        arrived since the previous LLM call."""
        with self._lock:
            turn = self.turns
            self.turns += 1
            follows_tool, self._tool_result_pending = self._tool_result_pending, False
        return turn, follows_tool

    def current_turn(self) -> int | None:
        """The turn of the latest LLM call (the one a tool call answers)."""
        return self.turns - 1 if self.turns else None

    def note_tool_result(self) -> None:
        with self._lock:
            self._tool_result_pending = True


session = Session
"""``session(...)``: the lower-case spelling reads better as a context manager."""
