"""The gateway's admission of sessions: the host of the policy's admission half, the
external control plane (seed 000 Algorithm 1; docs/policies.md). A session's first
call waits here until the half's ``admit`` lets the session in (the call's metadata,
who it belongs to, comes from ``call_meta``); an admitted session stays admitted
until it ends. A session ends at the gateway on the first of:

- a ``session_end`` event (the SDK posts one to ``POST /v1/events``);
- a client disconnecting in the middle of one of its calls (the agent is gone);
- ``idle_timeout_s`` without any LLM call in flight or tool call queued or running
  (by the tool events; an agent that died without a ``session_end`` must not hold
  its place in the window forever), or ``tool_silence_s`` without a call and with no
  news of the tool calls it has not ended (one that died in a tool);
- the end of its only call, for a request that names no session (it is a
  one-call session of its own).

A session the gateway knows only from the stream (a ``session_start`` or tool events,
no call yet) ends the same way, so that what both halves keep for it is dropped too.

Every per-client structure here is bounded (docs/gateway.md, "Bounds"), and the work
of one call or one event is O(what it changes): sessions that wait for the idle
timeout sit in lists ordered by when they went quiet, so expiry reads only the ones
due, and no pass walks the admitted sessions.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from agentmars.sdk.events import (
    AnyEvent,
    SessionEnd,
    SessionMove,
    SessionStart,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
)
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.gateway.proxy import GatewayError
from agentmars.server.policies.admission_view import StreamAdmissionView
from agentmars.server.policies.feed import EventFeed
from agentmars.server.policies.interface import AdmissionHalf
from agentmars.server.policies.views import SessionView

SessionStatus = Literal["ok", "error", "cancelled"]

MAX_WAITING_SESSIONS = 16_384
"""Sessions whose first call may wait for admission at once; a new session's call past
this gets 429 (ours: far above any window the policies open on one node)."""

MAX_ADMITTED_SESSIONS = 16_384
"""Sessions admitted at once whatever the policy says; past this, sessions wait."""

MAX_KNOWN_SESSIONS = 16_384
"""Sessions known only from the stream (no call yet); past this, the one quiet longest
is ended (its ``session_end`` goes on the stream)."""

TOOL_SILENCE_S = 3600.0
"""How long a session with no call in flight stays admitted on the strength of tool
calls it has not ended, with no tool event (ours: above any tool timeout the sandbox
allows; a client that never sends ``tool_end`` must not hold its place for good)."""


@dataclass(slots=True)
class WaitingSession:
    """A session whose first call waits at the gateway (a ``SessionView``)."""

    session_id: str
    agent: str
    arrival_s: float
    prompt_tokens: int
    task_id: str
    prompt_text: str
    admitted: asyncio.Future[None]
    calls: int = 0
    """Calls of the session waiting on ``admitted``."""


@dataclass(frozen=True, slots=True)
class CallingSession:
    """An admitted session whose call just came (a ``SessionView`` for ``moves``)."""

    session_id: str
    agent: str
    arrival_s: float
    prompt_tokens: int
    task_id: str
    prompt_text: str


@dataclass(slots=True)
class AdmittedSession:
    in_flight: int = 0
    next_turn: int = 0
    ephemeral: bool = False


class QuietSessions:
    """Sessions with nothing in flight, oldest quiet first, each due to end ``limit_s``
    after it went quiet (the clock is monotonic, so appending keeps the order)."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._since: OrderedDict[str, float] = OrderedDict()

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._since

    def __len__(self) -> int:
        return len(self._since)

    def add(self, session_id: str, now: float) -> None:
        self._since.pop(session_id, None)
        self._since[session_id] = now

    def discard(self, session_id: str) -> None:
        self._since.pop(session_id, None)

    def due(self, now: float) -> list[str]:
        """Remove and return the sessions whose time is up."""
        expired = []
        while self._since:
            session_id, since = next(iter(self._since.items()))
            if since > now - self.limit_s:
                break
            del self._since[session_id]
            expired.append(session_id)
        return expired

    def oldest(self) -> str | None:
        return next(iter(self._since), None)


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
        tool_silence_s: float = TOOL_SILENCE_S,
        publish: Callable[[Sequence[AnyEvent]], None] = lambda events: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (("idle_timeout_s", idle_timeout_s), ("tool_silence_s", tool_silence_s)):
            if not value > 0 or math.isinf(value):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        self.half = half
        self.policy_name = policy_name
        self.publish = publish
        """Puts the ``session_end`` of a session the gateway ends itself on the stream
        (the hub), so both halves forget it as they forget one the SDK ended."""
        self.on_admit: Callable[[WaitingSession], None] = lambda session: None
        """Told of each session as it is let in (the operator's admission wait,
        ``operator_state``)."""
        self.view = view
        self.feed = EventFeed(self._deliver)
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self.waiting: dict[str, WaitingSession] = {}
        """In arrival order."""
        self.admitted: dict[str, AdmittedSession] = {}
        self.known: OrderedDict[str, str] = OrderedDict()
        """Sessions heard of that neither wait nor are admitted, least recently heard
        of first: their agent names (from ``session_start``) for the ``SessionView``."""
        self._quiet = QuietSessions(idle_timeout_s)
        """Admitted or known sessions with no call in flight and no tool call open."""
        self._in_tools = QuietSessions(tool_silence_s)
        """Admitted or known sessions with no call in flight but a tool call open."""
        self.placed: dict[str, int] = {}
        """Behind several engine replicas: the replica of each admitted session."""
        self._on = Counter[int]()
        view.active_sessions_of = lambda: len(self.admitted)
        view.sessions_on = lambda index: self._on[index]

    def replica_of(self, session_id: str) -> int:
        """The replica the session's calls go to (0 behind one engine; also for a
        session whose end raced its admission: it no longer has a place)."""
        return self.placed.get(session_id, 0)

    async def enter(self, meta: CallMeta) -> int:
        """Wait until ``meta``'s session is admitted, then count the call in flight;
        returns the call's turn (the client's, else the gateway's count)."""
        if meta.session_id not in self.admitted:
            await self._wait_for_admission(meta)
        elif self.view.replica_count > 1:
            self._move_if_asked(meta)
        # setdefault: a session_end may have raced the admission; the call still runs.
        session = self.admitted.setdefault(meta.session_id, AdmittedSession())
        session.in_flight += 1
        self._settle(meta.session_id)
        turn = meta.turn if meta.turn is not None else session.next_turn
        session.next_turn = turn + 1
        return turn

    def leave(self, session_id: str, *, session_over: bool = False) -> None:
        """A call of the session finished; ``session_over`` ends the session too."""
        session = self.admitted.get(session_id)
        if session is None:
            return
        session.in_flight -= 1
        self._settle(session_id)
        if session_over:
            self.end(session_id, "cancelled", "the client disconnected")
        elif session.ephemeral:
            self.end(session_id, "ok")

    def end(self, session_id: str, status: SessionStatus, error: str | None = None) -> None:
        """The gateway ends the session: it frees its place, says so on the stream, and
        lets the policy admit others."""
        session = self.admitted.get(session_id)
        if session is not None:
            self._end(session_id, status, error)
            self.admit()

    def _end(self, session_id: str, status: SessionStatus, error: str | None) -> None:
        session = self.admitted.get(session_id)
        self._forget(session_id)
        ended = SessionEnd(
            session_id=session_id, status=status, error=error,
            turns=session.next_turn if session is not None else 0, source="gateway",
        )  # fmt: skip
        self.publish([ended])

    def _forget(self, session_id: str) -> None:
        self.admitted.pop(session_id, None)
        if (replica := self.placed.pop(session_id, None)) is not None:
            self._on[replica] -= 1
        self.known.pop(session_id, None)
        self._quiet.discard(session_id)
        self._in_tools.discard(session_id)

    def _settle(self, session_id: str) -> None:
        """Put an admitted or known session where its activity says, as of now."""
        self._quiet.discard(session_id)
        self._in_tools.discard(session_id)
        session = self.admitted.get(session_id)
        if session is None and session_id not in self.known:
            return
        if (session is not None and session.in_flight > 0) or session_id in self.waiting:
            return
        quiet = self._in_tools if self.view.runs_tools(session_id) else self._quiet
        quiet.add(session_id, self._clock())

    async def _wait_for_admission(self, meta: CallMeta) -> None:
        waiting = self.waiting.get(meta.session_id)
        if waiting is None:
            if len(self.waiting) >= MAX_WAITING_SESSIONS:
                raise GatewayError(
                    429, f"{MAX_WAITING_SESSIONS} sessions already wait for admission",
                    kind="rate_limit_error",
                )  # fmt: skip
            future = asyncio.get_running_loop().create_future()
            agent = self.known.pop(meta.session_id, "") or meta.agent or ""
            waiting = WaitingSession(
                meta.session_id, agent, self.view.now, meta.prompt_tokens,
                meta.task_id or meta.session_id, meta.prompt_text, future,
            )  # fmt: skip
            self.waiting[meta.session_id] = waiting
            self._settle(meta.session_id)
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
        if waiting.calls == 0 and self.waiting.get(waiting.session_id) is waiting:
            del self.waiting[waiting.session_id]
            self._know(waiting.session_id, waiting.agent)
            self._settle(waiting.session_id)

    def admit(self) -> None:
        """Ask the policy whom to admit now, and let them in."""
        self._expire_quiet()
        if self.waiting and len(self.admitted) < MAX_ADMITTED_SESSIONS:
            chosen = self.half.admit(list(self.waiting.values()), self.view)
            for session in chosen[: MAX_ADMITTED_SESSIONS - len(self.admitted)]:
                self._let_in(session)

    def _let_in(self, session: SessionView) -> None:
        waiting = self.waiting.pop(session.session_id, None)
        if waiting is None:  # a policy that returns something it was not given
            raise RuntimeError(f"policy admitted {session.session_id!r}, which is not waiting")
        self.admitted[waiting.session_id] = AdmittedSession()
        if self.view.replica_count > 1:
            self._place(waiting)
        self.on_admit(waiting)
        self._settle(waiting.session_id)
        if not waiting.admitted.done():
            waiting.admitted.set_result(None)

    def _place(self, session: WaitingSession) -> None:
        """Put a session just admitted on the replica the policy chooses, for good."""
        index = self.half.place(session, self.view)
        self._check_replica(index, session.session_id)
        self.placed[session.session_id] = index
        self._on[index] += 1

    def _move_if_asked(self, meta: CallMeta) -> None:
        """Ask the policy whether this call of a placed session goes to another replica
        (``moves``); if so, say so on the stream (``session_move``: the gateway tells
        the replica left that the session ended there)."""
        current = self.placed.get(meta.session_id)
        if current is None:
            return
        calling = CallingSession(
            meta.session_id, meta.agent or "", self.view.now, meta.prompt_tokens,
            meta.task_id or meta.session_id, meta.prompt_text,
        )  # fmt: skip
        index = self.half.moves(calling, current, self.view)
        if index is None or index == current:
            return
        self._check_replica(index, meta.session_id)
        self.placed[meta.session_id] = index
        self._on[current] -= 1
        self._on[index] += 1
        move = SessionMove(
            session_id=meta.session_id, from_replica=current, to_replica=index, source="gateway"
        )
        self.publish([move])

    def _check_replica(self, index: int, session_id: str) -> None:
        if not 0 <= index < self.view.replica_count:
            raise RuntimeError(
                f"policy {self.policy_name!r} placed session {session_id!r} on "
                f"replica {index!r}; there are {self.view.replica_count}"
            )

    def _expire_quiet(self) -> None:
        now = self._clock()
        for session_id in self._quiet.due(now):
            self._end(session_id, "cancelled", f"no call or tool for {self.idle_timeout_s:g} s")
        for session_id in self._in_tools.due(now):
            error = f"no call and no tool event for {self._in_tools.limit_s:g} s"
            self._end(session_id, "cancelled", error)

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
        """Session ends, and the sessions the stream names (tool activity keeps a
        session from idling out; a session first seen here is known until it ends)."""
        if event.kind == "session_end":
            self._forget(event.session_id)
        elif isinstance(event, ToolEnqueue | ToolStart | ToolEnd | SessionStart):
            agent = event.agent if isinstance(event, SessionStart) else None
            self._know(event.session_id, agent or "")
            self._settle(event.session_id)

    def _know(self, session_id: str, agent: str) -> None:
        """Remember a session the stream names that has no place here yet, most recent
        last; past ``MAX_KNOWN_SESSIONS``, end the one heard of least recently."""
        if session_id in self.admitted or session_id in self.waiting:
            return
        if session_id not in self.known and len(self.known) >= MAX_KNOWN_SESSIONS:
            error = f"more than {MAX_KNOWN_SESSIONS} sessions without a call"
            self._end(next(iter(self.known)), "cancelled", error)
        self.known[session_id] = agent or self.known.pop(session_id, "")
