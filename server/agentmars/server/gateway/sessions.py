"""Session metadata of a request and the gateway's admission of sessions.

``call_metadata`` reads who a request belongs to (header ``X-Session-ID``, body
``session_id``, body ``vllm_xargs``: the SDK's wire contract,
``agentmars.sdk.integrations.request``). ``Admission`` is the policy's external
control plane (seed 000 Algorithm 1): a session's first call waits here until the
policy's ``admit`` lets the session in; an admitted session stays admitted until it
ends. A session ends at the gateway on the first of:

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentmars.sdk.events import AnyEvent, ToolEnd, ToolEnqueue, ToolStart, new_id
from agentmars.sdk.integrations.request import SESSION_HEADER, project_prompt_tokens
from agentmars.server.gateway.telemetry import GatewayView
from agentmars.server.policies.interface import Policy, SessionView


class BadRequest(ValueError):
    """The request's metadata is unusable; the message becomes the 400 body."""


@dataclass(frozen=True, slots=True)
class CallMeta:
    """What the gateway knows of one call before forwarding it."""

    session_id: str
    turn: int | None
    follows_tool: bool
    expects_tool: bool
    prompt_tokens: int
    ephemeral: bool
    """The request named no session: it is a one-call session of its own."""


def _check_session_id(value: object) -> str:
    # It travels to the engine in the X-Session-ID header too: printable ASCII only.
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= 256
        or not (value.isascii() and value.isprintable())
    ):
        raise BadRequest(
            "session_id must be a non-empty string of at most 256 printable ASCII characters"
        )
    return value


def _session_id(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    xargs = body.get("vllm_xargs")
    candidates = [
        headers.get(SESSION_HEADER.lower()),
        body.get("session_id"),
        xargs.get("session_id") if isinstance(xargs, Mapping) else None,
    ]
    ids = sorted({_check_session_id(c) for c in candidates if c is not None})
    if len(ids) > 1:
        raise BadRequest(f"the request names different sessions: {ids}")
    return ids[0] if ids else None


def _flag(xargs: Mapping[str, Any], name: str, default: bool) -> bool:
    value = xargs.get(name, default)
    # vLLM's extra_args carry ints, so the SDK sends 0/1; bools are accepted too.
    if value not in (0, 1) or isinstance(value, float):
        raise BadRequest(f"vllm_xargs.{name} must be 0 or 1, got {value!r}")
    return bool(value)


def _turn(xargs: Mapping[str, Any]) -> int | None:
    turn = xargs.get("turn")
    if turn is None:
        return None
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise BadRequest(f"vllm_xargs.turn must be an integer >= 0, got {turn!r}")
    return turn


def _last_role(body: Mapping[str, Any]) -> object:
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], Mapping):
        return messages[-1].get("role")
    return None


def call_metadata(headers: Mapping[str, str], body: Mapping[str, Any]) -> CallMeta:
    """The session metadata of a request (``headers`` with lower-case names)."""
    xargs = body.get("vllm_xargs", {})
    if not isinstance(xargs, Mapping):
        raise BadRequest("vllm_xargs must be a JSON object")
    session_id = _session_id(headers, body)
    tools_offered = bool(body.get("tools")) and body.get("tool_choice") != "none"
    return CallMeta(
        session_id=session_id or f"call-{new_id()}",
        turn=_turn(xargs),
        follows_tool=_flag(xargs, "follows_tool", _last_role(body) in ("tool", "function")),
        expects_tool=_flag(xargs, "expects_tool", tools_offered),
        # The SDK's own projection (characters / 4); 1 for a body with neither field.
        prompt_tokens=project_prompt_tokens(body) or 1,
        ephemeral=session_id is None,
    )


# --- admission ----------------------------------------------------------------------


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
    """Holds sessions until the policy admits them; all methods run on one event loop."""

    def __init__(
        self,
        policy: Policy,
        view: GatewayView,
        *,
        idle_timeout_s: float = 300.0,
    ) -> None:
        if not idle_timeout_s > 0 or math.isinf(idle_timeout_s):
            raise ValueError(f"idle_timeout_s must be a finite number > 0, got {idle_timeout_s}")
        self.policy = policy
        self.view = view
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
        if session_over or session.ephemeral:
            self.end(session_id)

    def end(self, session_id: str) -> None:
        """The session is over: free its place and let the policy admit others."""
        if self.admitted.pop(session_id, None) is not None:
            self.admit()

    async def _wait_for_admission(self, meta: CallMeta) -> None:
        waiting = next((w for w in self.waiting if w.session_id == meta.session_id), None)
        if waiting is None:
            future = asyncio.get_running_loop().create_future()
            agent = self.agents.get(meta.session_id, "")
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
            chosen = self.policy.admit(list(self.waiting), self.view)
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
                self.agents.pop(session_id, None)

    def on_events(self, events: Sequence[AnyEvent]) -> None:
        """Hand each event to the policy and the view, follow the sessions it names,
        then re-run admission (an event may have changed the policy's mind)."""
        for event in events:
            self.policy.on_event(event)
            self.view.observe(event)
            self._follow(event)
        self.admit()

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
