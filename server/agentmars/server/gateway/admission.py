"""The gateway's admission of sessions: the host of the policy's admission half, the
external control plane (seed 000 Algorithm 1; docs/policies.md). A session's call
waits here until the half's ``admit`` gives the session a seat (the call's metadata,
who it belongs to, comes from ``call_meta``).

A session holds its seat while it has a call in flight or a tool call the stream
shows queued or running, and for a gap after that (``gaps``: a high quantile of the
gaps the gateway has measured between calls). Past the gap it gives the seat back
but stays open: the admission half drops what it reserved for it (``release``), the
engine half hears nothing (its pins and priority stay). Its next call is seated at
once if the stream shows its KV pinned in the engine (``seated``: making it wait would
hold the pin hostage, and a policy that fits prompts into the free KV would wait for
blocks the session holds itself); else it waits for a seat again with its first
arrival, so it keeps its place in the queue. Clients
that send no tool events and never say goodbye (an unmodified OpenHands, the openai
client, LiteLLM) then strand no capacity.

A session ends at the gateway on the first of:

- a ``session_end`` event (the SDK posts one to ``POST /v1/events``);
- a client disconnecting in the middle of one of its calls (the agent is gone);
- ``session_idle_s`` with nothing in flight and no tool call queued or running (an
  agent that died without a ``session_end``), or ``tool_silence_s`` without a call
  and with no news of the tool calls it has not ended (one that died in a tool);
- the end of its only call, for a request that names no session (it is a one-call
  session of its own).

A session the gateway knows only from the stream (a ``session_start`` or tool events,
no call yet) ends the same way, so that what both halves keep for it is dropped too.
The ``session_end`` the gateway publishes says how long the session lasted: from when
the gateway first heard of it to its last activity, not to the expiry.

Every per-client structure here is bounded (docs/gateway.md, "Bounds"), and the work
of one call or one event is O(what it changes) (amortised): sessions that wait for a
timeout sit in lists ordered by when they went quiet, or in a heap by when their seat
is due back, so expiry reads only the ones due, and no pass walks the admitted
sessions.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentmars.sdk.events import (
    AnyEvent,
    KVPin,
    KVUnpin,
    SessionEnd,
    SessionMove,
    SessionStart,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
)
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.gateway.gaps import Gaps, own_gaps
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
"""Seats, whatever the policy says. Past this, the seats of sessions with nothing open
are given back, least recently active first; with none such, a new session's call
gets 429 at once."""

MAX_KNOWN_SESSIONS = 16_384
"""Sessions open without a seat (known only from the stream, gave up waiting, or gave
their seat back); past this, the one heard of least recently is ended (its
``session_end`` goes on the stream)."""

TOOL_SILENCE_S = 3600.0
"""How long a session with no call in flight stays on the strength of tool calls it
has not ended, with no tool event (ours: a client that never sends ``tool_end`` must
not hold its seat for good)."""

RETRY_AFTER_S = 1
"""``Retry-After`` of the 429 past ``MAX_ADMITTED_SESSIONS`` (ours: about when a busy
session's call or gap ends)."""


@dataclass(slots=True)
class GatewaySession:
    """What the gateway keeps of a session from when it first hears of it to its end."""

    heard_s: float
    """When the gateway first heard of it: where its recorded duration starts."""
    agent: str = ""
    arrival_s: float | None = None
    """Its first call's arrival: its place in the admission queue, kept when it gives
    its seat back and comes again."""
    last_active_s: float = 0.0
    """Its last call's arrival or end, or tool event: where its recorded duration ends."""
    next_turn: int = 0
    in_flight: int = 0
    ephemeral: bool = False
    quiet_since: float | None = None
    """Since when nothing of it is open (None: something is): its next gap starts."""
    gaps: deque[float] = field(default_factory=own_gaps)

    def __post_init__(self) -> None:
        self.last_active_s = self.last_active_s or self.heard_s


@dataclass(slots=True)
class WaitingSession:
    """A session whose call waits at the gateway for a seat (a ``SessionView``)."""

    session_id: str
    agent: str
    arrival_s: float
    prompt_tokens: int
    task_id: str
    prompt_text: str
    admitted: asyncio.Future[None]
    session: GatewaySession
    called_s: float
    """When the call that made it wait arrived (``arrival_s`` is its first call's)."""
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


class IdleSeats:
    """Seated sessions with nothing open, least recently active first, each with when
    its seat is due back (a heap of due times beside the order; stale heap entries are
    skipped)."""

    def __init__(self) -> None:
        self._due: OrderedDict[str, float] = OrderedDict()
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._due)

    def add(self, session_id: str, due: float) -> None:
        self._due.pop(session_id, None)
        self._due[session_id] = due
        heapq.heappush(self._heap, (due, session_id))
        if len(self._heap) > 2 * len(self._due) + 64:  # drop the stale entries
            self._heap = [(d, s) for s, d in self._due.items()]
            heapq.heapify(self._heap)

    def discard(self, session_id: str) -> None:
        self._due.pop(session_id, None)

    def due(self, now: float) -> list[str]:
        """Remove and return the sessions whose seat is due back."""
        expired = []
        while self._heap and self._heap[0][0] <= now:
            due, session_id = heapq.heappop(self._heap)
            if self._due.get(session_id) == due:
                del self._due[session_id]
                expired.append(session_id)
        return expired

    def least_recent(self) -> str | None:
        return next(iter(self._due), None)


class Admission:
    """Holds sessions until the admission half seats them; all methods run on one
    event loop. Each boundary of the stream reaches the half once (``EventFeed``)."""

    def __init__(
        self,
        half: AdmissionHalf,
        view: StreamAdmissionView,
        *,
        policy_name: str = "",
        session_idle_s: float = 300.0,
        tool_silence_s: float = TOOL_SILENCE_S,
        publish: Callable[[Sequence[AnyEvent]], None] = lambda events: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (("session_idle_s", session_idle_s), ("tool_silence_s", tool_silence_s)):
            if not value > 0 or math.isinf(value):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        self.half = half
        self.policy_name = policy_name
        self.publish = publish
        """Puts the ``session_end`` of a session the gateway ends itself on the stream
        (the hub), so both halves forget it as they forget one the SDK ended."""
        self.on_admit: Callable[[WaitingSession], None] = lambda session: None
        """Told of each session as it is seated (the operator's admission wait,
        ``operator_state``)."""
        self.view = view
        self.feed = EventFeed(self._deliver)
        self.session_idle_s = session_idle_s
        self._clock = clock
        self.waiting: dict[str, WaitingSession] = {}
        """In arrival order."""
        self.admitted: dict[str, GatewaySession] = {}
        """The sessions holding a seat."""
        self.known: OrderedDict[str, GatewaySession] = OrderedDict()
        """Open sessions that neither wait nor hold a seat, least recently heard of
        first."""
        self.gaps = Gaps(cap_s=session_idle_s)
        self._quiet = QuietSessions(session_idle_s)
        """Seated or known sessions with no call in flight and no tool call open."""
        self._in_tools = QuietSessions(tool_silence_s)
        """Seated or known sessions with no call in flight but a tool call open."""
        self._idle_seats = IdleSeats()
        """Seated sessions with nothing open, until their seat is due back."""
        self._pinned: set[str] = set()
        """Open sessions whose KV the engine has pinned (``kv_pin``, until ``kv_unpin``)."""
        self.placed: dict[str, int] = {}
        """Behind several engine replicas: the replica of each session placed (kept
        while it is open, seated or not: its KV lives there)."""
        self._on = Counter[int]()
        view.active_sessions_of = lambda: len(self.admitted)
        view.sessions_on = lambda index: self._on[index]

    def replica_of(self, session_id: str) -> int:
        """The replica the session's calls go to (0 behind one engine; also for a
        session whose end raced its admission: it no longer has a place)."""
        return self.placed.get(session_id, 0)

    def _session(self, session_id: str) -> GatewaySession | None:
        if (session := self.admitted.get(session_id)) is not None:
            return session
        if (waiting := self.waiting.get(session_id)) is not None:
            return waiting.session
        return self.known.get(session_id)

    async def enter(self, meta: CallMeta) -> int:
        """Wait until ``meta``'s session holds a seat, then count the call in flight;
        returns the call's turn (the client's, else the gateway's count)."""
        now = self._clock()
        self._gap_ends(meta.session_id, now)
        waited = meta.session_id not in self.admitted
        if waited:
            await self._wait_for_admission(meta)
        elif self.view.replica_count > 1:
            self._move_if_asked(meta)
        # setdefault: a session_end may have raced the admission; the call still runs.
        session = self.admitted.setdefault(meta.session_id, GatewaySession(heard_s=now))
        if waited:
            session.ephemeral = meta.ephemeral
        session.in_flight += 1
        session.last_active_s = self._clock()
        self._settle(meta.session_id)
        turn = meta.turn if meta.turn is not None else session.next_turn
        session.next_turn = turn + 1
        return turn

    def _gap_ends(self, session_id: str, now: float) -> None:
        """A call of the session arrives: the gap since it had nothing open is over;
        measure it if it followed a call of its own."""
        session = self._session(session_id)
        if session is None or session.quiet_since is None:
            return
        if session.next_turn > 0:
            self.gaps.record(session.gaps, now - session.quiet_since)
        session.quiet_since = None

    def leave(self, session_id: str, *, session_over: bool = False) -> None:
        """A call of the session finished; ``session_over`` ends the session too."""
        session = self.admitted.get(session_id)
        if session is None:
            return
        session.in_flight -= 1
        session.last_active_s = self._clock()
        self._settle(session_id)
        if session_over:
            self.end(session_id, "cancelled", "the client disconnected")
        elif session.ephemeral:
            self.end(session_id, "ok")

    def end(self, session_id: str, status: SessionStatus, error: str | None = None) -> None:
        """The gateway ends the session: it frees its seat, says so on the stream, and
        lets the policy admit others."""
        if session_id in self.admitted:
            self._end(session_id, status, error)
            self.admit()

    def _end(self, session_id: str, status: SessionStatus, error: str | None) -> None:
        session = self._session(session_id)
        self._forget(session_id)
        lasted = session.last_active_s - session.heard_s if session is not None else 0.0
        ended = SessionEnd(
            session_id=session_id, status=status, error=error,
            turns=session.next_turn if session is not None else 0,
            duration_s=max(lasted, 0.0), source="gateway",
        )  # fmt: skip
        self.publish([ended])

    def _forget(self, session_id: str) -> None:
        self.admitted.pop(session_id, None)
        if (replica := self.placed.pop(session_id, None)) is not None:
            self._on[replica] -= 1
        self.known.pop(session_id, None)
        self._quiet.discard(session_id)
        self._in_tools.discard(session_id)
        self._idle_seats.discard(session_id)
        self._pinned.discard(session_id)

    def _settle(self, session_id: str) -> None:
        """Put a seated or known session where its activity says, as of now."""
        self._quiet.discard(session_id)
        self._in_tools.discard(session_id)
        self._idle_seats.discard(session_id)
        seated = self.admitted.get(session_id)
        session = seated or self.known.get(session_id)
        if session is None:
            return
        if session.in_flight > 0:
            session.quiet_since = None  # its gap starts when its calls have ended
            return
        now = self._clock()
        if self.view.runs_tools(session_id):
            session.quiet_since = None
            self._in_tools.add(session_id, now)
            return
        self._quiet.add(session_id, now)
        if session.quiet_since is None:
            session.quiet_since = now
        if seated is not None:
            due = session.quiet_since + self.gaps.limit_s(session.gaps)
            self._idle_seats.add(session_id, due)

    async def _wait_for_admission(self, meta: CallMeta) -> None:
        waiting = self.waiting.get(meta.session_id)
        if waiting is None:
            self._check_room_to_wait()
            future = asyncio.get_running_loop().create_future()
            now = self.view.now
            session = self.known.pop(meta.session_id, None) or GatewaySession(heard_s=now)
            session.agent = session.agent or meta.agent or ""
            if session.arrival_s is None:
                session.arrival_s = now
            waiting = WaitingSession(
                meta.session_id, session.agent, session.arrival_s, meta.prompt_tokens,
                meta.task_id or meta.session_id, meta.prompt_text, future, session, now,
            )  # fmt: skip
            self.waiting[meta.session_id] = waiting
            self._settle(meta.session_id)
            if session.next_turn > 0 and meta.session_id in self._pinned:
                self._let_in(waiting)
                self.half.seated(waiting, self.view)
            else:
                self.admit()
        waiting.calls += 1
        try:
            # shield: one cancelled call must not cancel a future its siblings await.
            await asyncio.shield(waiting.admitted)
        except asyncio.CancelledError:
            self._call_gave_up(waiting)
            raise

    def _check_room_to_wait(self) -> None:
        """A new session's call may wait unless the queue is full, or every seat is
        taken by a session with something open (no seat can be given back soon)."""
        if len(self.waiting) >= MAX_WAITING_SESSIONS:
            raise GatewayError(
                429, f"{MAX_WAITING_SESSIONS} sessions already wait for admission",
                kind="rate_limit_error",
            )  # fmt: skip
        if len(self.admitted) >= MAX_ADMITTED_SESSIONS and not self._idle_seats:
            raise GatewayError(
                429,
                f"all {MAX_ADMITTED_SESSIONS} seats are held by sessions with a call or "
                "a tool open",
                kind="rate_limit_error",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

    def _call_gave_up(self, waiting: WaitingSession) -> None:
        """A waiting call was cancelled (its client left): a session with no call
        left waiting leaves the queue."""
        waiting.calls -= 1
        if waiting.calls == 0 and self.waiting.get(waiting.session_id) is waiting:
            del self.waiting[waiting.session_id]
            self._know(waiting.session_id, waiting.session)
            self._settle(waiting.session_id)

    def admit(self) -> None:
        """Give back the seats that are due, then ask the policy whom to seat now,
        and let them in."""
        self._expire_quiet()
        if not self.waiting:
            return
        self._make_room(len(self.waiting))
        for oversized in self._never_fitting():
            self._let_in(oversized)
        if self.waiting and len(self.admitted) < MAX_ADMITTED_SESSIONS:
            chosen = self.half.admit(list(self.waiting.values()), self.view)
            for session in chosen[: MAX_ADMITTED_SESSIONS - len(self.admitted)]:
                self._let_in(session)

    def _make_room(self, wanted: int) -> None:
        """Past ``MAX_ADMITTED_SESSIONS``, give back the seats of sessions with nothing
        open, least recently active first, for up to ``wanted`` waiting sessions."""
        while len(self.admitted) > MAX_ADMITTED_SESSIONS - wanted:
            session_id = self._idle_seats.least_recent()
            if session_id is None:
                return
            self._idle_seats.discard(session_id)
            self._give_back_seat(session_id)

    def _never_fitting(self) -> list[WaitingSession]:
        """Waiting sessions whose prompt needs more KV than any replica has: no policy
        can ever fit them, so they go in at once and the engine answers with its own
        4xx, rather than their calls hanging until the idle expiry."""
        figures = [replica.kv for replica in self.view.replicas]
        if any(kv is None for kv in figures):
            return []
        largest = max(kv.total_blocks for kv in figures if kv is not None)
        return [
            waiting
            for waiting in self.waiting.values()
            if self.view.blocks_for(waiting.prompt_tokens) > largest
        ]

    def _let_in(self, session: SessionView) -> None:
        waiting = self.waiting.pop(session.session_id, None)
        if waiting is None:  # a policy that returns something it was not given
            raise RuntimeError(f"policy admitted {session.session_id!r}, which is not waiting")
        self.admitted[waiting.session_id] = waiting.session
        if self.view.replica_count > 1 and waiting.session_id not in self.placed:
            self._place(waiting)
        self.on_admit(waiting)
        self._settle(waiting.session_id)
        if not waiting.admitted.done():
            waiting.admitted.set_result(None)

    def _give_back_seat(self, session_id: str) -> None:
        """The session keeps nothing open past its gap (or past the seats' bound): it
        stays open without a seat, and the policy drops what it reserved for it."""
        session = self.admitted.pop(session_id)
        self._know(session_id, session)
        self.half.release(session_id)

    def _place(self, session: WaitingSession) -> None:
        """Put a session just seated on the replica the policy chooses, for good."""
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
            self._end(session_id, "cancelled", f"no call or tool for {self.session_idle_s:g} s")
        for session_id in self._in_tools.due(now):
            error = f"no call and no tool event for {self._in_tools.limit_s:g} s"
            self._end(session_id, "cancelled", error)
        for session_id in self._idle_seats.due(now):
            self._give_back_seat(session_id)

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
        session's seat and keeps it from idling out; a session first seen here is
        known until it ends)."""
        if event.kind == "session_end":
            self._forget(event.session_id)
        elif isinstance(event, KVPin) and self._session(event.session_id) is not None:
            self._pinned.add(event.session_id)
        elif isinstance(event, KVUnpin | SessionMove):
            self._pinned.discard(event.session_id)
        elif isinstance(event, ToolEnqueue | ToolStart | ToolEnd | SessionStart):
            agent = event.agent if isinstance(event, SessionStart) else None
            session = self._session(event.session_id)
            if session is None:
                session = GatewaySession(heard_s=self._clock(), agent=agent or "")
                self._know(event.session_id, session)
            else:
                session.agent = session.agent or agent or ""
                if event.session_id in self.known:
                    self.known.move_to_end(event.session_id)
            session.last_active_s = self._clock()
            self._settle(event.session_id)

    def _know(self, session_id: str, session: GatewaySession) -> None:
        """Keep an open session that has no seat and waits for none, most recent last;
        past ``MAX_KNOWN_SESSIONS``, end the one heard of least recently."""
        if session_id not in self.known and len(self.known) >= MAX_KNOWN_SESSIONS:
            error = f"more than {MAX_KNOWN_SESSIONS} sessions open without a seat"
            self._end(next(iter(self.known)), "cancelled", error)
        self.known.pop(session_id, None)
        self.known[session_id] = session
