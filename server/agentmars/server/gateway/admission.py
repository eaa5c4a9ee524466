"""The gateway's admission of sessions: the host of the policy's admission half, the
external control plane (seed 000 Algorithm 1; docs/policies.md). A session's first
call waits here until the half's ``admit`` lets the session in (the call's metadata,
who it belongs to, comes from ``call_meta``); an admitted session stays admitted
until it ends. A session ends at the gateway on the first of:

- a ``session_end`` event (the SDK posts one to ``POST /v1/events``);
- a client disconnecting in the middle of one of its calls (the agent is gone);
- ``idle_timeout_s`` without any LLM call in flight or tool call queued or running
  (by the tool events; an agent that died without a ``session_end`` must not hold
  its place in the window forever);
- the end of its only call, for a request that names no session (it is a
  one-call session of its own).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentmars.sdk.events import AnyEvent, SessionEnd, ToolEnd, ToolEnqueue, ToolStart
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.policies.admission_view import StreamAdmissionView
from agentmars.server.policies.feed import EventFeed
from agentmars.server.policies.interface import AdmissionHalf
from agentmars.server.policies.views import SessionView

SessionStatus = Literal["ok", "error", "cancelled"]


@dataclass(slots=True)
class WaitingSession:
    """A session whose first call waits at the gateway (a ``SessionView``)."""

    session_id: str
    agent: str
    arrival_s: float
    prompt_tokens: int
    admitted: asyncio.Future[None]
    calls: int = 0
    """Calls of the session waiting on ``admitted``."""


@dataclass(slots=True)
class AdmittedSession:
    in_flight: int = 0
    last_active_s: float = field(default_factory=time.monotonic)
    next_turn: int = 0
    ephemeral: bool = False


class Admission:
    """Holds sessions until the admission half admits them; all methods run on one
    event loop. Each boundary of the stream reaches the half once (``EventFeed``)."""

    def __init__(
        self,
        half: AdmissionHalf,
        view: StreamAdmissionView,
        *,
        policy_name: str = "",
        idle_timeout_s: float = 300.0,
        publish: Callable[[Sequence[AnyEvent]], None] = lambda events: None,
    ) -> None:
        if not idle_timeout_s > 0 or math.isinf(idle_timeout_s):
            raise ValueError(f"idle_timeout_s must be a finite number > 0, got {idle_timeout_s}")
        self.half = half
        self.policy_name = policy_name
        self.publish = publish
        """Puts the ``session_end`` of a session the gateway ends itself on the stream
        (the hub), so both halves forget it as they forget one the SDK ended."""
        self.view = view
        self.feed = EventFeed(self._deliver)
        self.idle_timeout_s = idle_timeout_s
        self.waiting: list[WaitingSession] = []
        self.admitted: dict[str, AdmittedSession] = {}
        self.agents: dict[str, str] = {}
        """Agent names from ``session_start`` events, for the policy's ``SessionView``."""
        view.active_sessions_of = lambda: len(self.admitted)

    async def enter(self, meta: CallMeta) -> int:
        """Wait until ``meta``'s session is admitted, then count the call in flight;
        returns the call's turn (the client's, else the gateway's count)."""
        if meta.session_id not in self.admitted:
            await self._wait_for_admission(meta)
        # setdefault: a session_end may have raced the admission; the call still runs.
        session = self.admitted.setdefault(meta.session_id, AdmittedSession())
        session.in_flight += 1
        session.last_active_s = time.monotonic()
        turn = meta.turn if meta.turn is not None else session.next_turn
        session.next_turn = turn + 1
        return turn

    def leave(self, session_id: str, *, session_over: bool = False) -> None:
        """A call of the session finished; ``session_over`` ends the session too."""
        session = self.admitted.get(session_id)
        if session is None:
            return
        session.in_flight -= 1
        session.last_active_s = time.monotonic()
        if session_over:
            self.end(session_id, "cancelled", "the client disconnected")
        elif session.ephemeral:
            self.end(session_id, "ok")

    def end(self, session_id: str, status: SessionStatus, error: str | None = None) -> None:
        """The gateway ends the session: it frees its place, says so on the stream, and
        lets the policy admit others."""
        session = self.admitted.pop(session_id, None)
        if session is not None:
            self._announce_end(session_id, session, status, error)
            self.admit()

    def _announce_end(
        self, session_id: str, session: AdmittedSession, status: SessionStatus, error: str | None
    ) -> None:
        self.agents.pop(session_id, None)
        ended = SessionEnd(
            session_id=session_id, status=status, error=error, turns=session.next_turn,
            source="gateway",
        )  # fmt: skip
        self.publish([ended])

    async def _wait_for_admission(self, meta: CallMeta) -> None:
        waiting = next((w for w in self.waiting if w.session_id == meta.session_id), None)
        if waiting is None:
            future = asyncio.get_running_loop().create_future()
            agent = self.agents.get(meta.session_id, meta.agent or "")
            waiting = WaitingSession(
                meta.session_id, agent, self.view.now, meta.prompt_tokens, future
            )
            self.waiting.append(waiting)
            self.admit()
        waiting.calls += 1
        try:
            # shield: one cancelled call must not cancel a future its siblings await.
            await asyncio.shield(waiting.admitted)
        except asyncio.CancelledError:
            self._call_gave_up(waiting)
            raise
        self.admitted.setdefault(meta.session_id, AdmittedSession()).ephemeral = meta.ephemeral

    def _call_gave_up(self, waiting: WaitingSession) -> None:
        """A waiting call was cancelled (its client left): a session with no call
        left waiting leaves the queue."""
        waiting.calls -= 1
        if waiting.calls == 0 and waiting in self.waiting:
            self.waiting.remove(waiting)

    def admit(self) -> None:
        """Ask the policy whom to admit now, and let them in."""
        self._expire_idle()
        if self.waiting:
            chosen = self.half.admit(list(self.waiting), self.view)
            for session in chosen:
                self._let_in(session)

    def _let_in(self, session: SessionView) -> None:
        waiting = next((w for w in self.waiting if w.session_id == session.session_id), None)
        if waiting is None:  # a policy that returns something it was not given
            raise RuntimeError(f"policy admitted {session.session_id!r}, which is not waiting")
        self.waiting.remove(waiting)
        self.admitted[waiting.session_id] = AdmittedSession()
        if not waiting.admitted.done():
            waiting.admitted.set_result(None)

    def _expire_idle(self) -> None:
        cutoff = time.monotonic() - self.idle_timeout_s
        for session_id, session in list(self.admitted.items()):
            idle = session.in_flight == 0 and not self.view.runs_tools(session_id)
            if idle and session.last_active_s < cutoff:
                del self.admitted[session_id]
                error = f"no call or tool for {self.idle_timeout_s:g} s"
                self._announce_end(session_id, session, "cancelled", error)

    def on_events(self, events: Sequence[AnyEvent]) -> None:
        """Hand each event to the policy and the view, follow the sessions it names,
        then re-run admission (an event may have changed the policy's mind)."""
        for event in events:
            self.feed(event)
        self.admit()

    def _deliver(self, event: AnyEvent) -> None:
        self.half.on_event(event)
        self.view.observe(event)
        self._follow(event)

    def _follow(self, event: AnyEvent) -> None:
        """Agent names, session ends, and tool activity (which keeps a session from
        idling out)."""
        if isinstance(event, ToolEnqueue | ToolStart | ToolEnd):
            session = self.admitted.get(event.session_id)
            if session is not None:
                session.last_active_s = time.monotonic()
        elif event.kind == "session_start" and event.agent:
            self.agents[event.session_id] = event.agent
        elif event.kind == "session_end":
            self.admitted.pop(event.session_id, None)
            self.agents.pop(event.session_id, None)
