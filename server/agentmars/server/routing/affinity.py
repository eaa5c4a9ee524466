"""Session affinity over engine replicas with the policy's placement, without Ray: what
``routing.ray_router.SessionAffinityRouter`` decides, kept apart from Ray's classes so
that it is tested (and type-checked) where Ray is not installed (docs/ray-serve.md).

A session's first call is placed by the policy's admission half as the simulator's
gateway places one (``sim/engine.py``): ``admit`` on the session, then ``place`` for
it if admitted. Its later calls go to the same replica while that replica is among the
live ones, and are placed afresh when it is gone. A session the half does not admit
yet gets no replica (the caller retries later: the first call waits, as at the
gateway). Nothing here chooses a replica itself.

What the half sees (``StreamAdmissionView``, the gateway's own view): the replicas in
the order the caller gives (stable: Ray's replica ids sorted), each with the KV figures
it last reported and its sessions (those it reported, plus those placed on it since
that report), and their sum as ``kv``. Each replica reports ``routing_stats(kv,
sessions)``: its ``kv_stats`` event and the sessions it holds. The
half is told of each call's end (``LLMEnd``), as the gateway's stream tells it, so
that a prompt it counted against a replica's room until the figures show it
(``UnstartedPrompts``) is released.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentmars.sdk.events import KVStats, LLMEnd
from agentmars.server.gateway.call_meta import BadRequest, CallMeta, call_metadata
from agentmars.server.gateway.llm_apis import CHAT, LLM_APIS
from agentmars.server.policies.admission_view import StreamAdmissionView
from agentmars.server.policies.capabilities import Capability, refuse_unless
from agentmars.server.policies.interface import AdmissionHalf
from agentmars.server.policies.registry import make_policy

ROUTER_PROVIDES = frozenset({Capability.KV_FIGURES})
"""What the router gives an admission half: the replicas' KV figures. Not the tool
figures (no tool events reach it), so a half that needs them is refused at start."""
HOST = "the Ray Serve session-affinity router"
MAX_SESSIONS = 16_384
"""Sessions whose replica is remembered (the gateway's bound on admitted sessions);
past it the one that called least recently is forgotten (no ``session_end`` reaches
the router) and placed afresh should it call again."""


def routing_stats(kv: KVStats, sessions: int) -> dict[str, Any]:
    """What a replica answers Ray Serve's ``record_routing_stats`` with: its newest
    ``kv_stats`` figures (as the event's JSON fields) and the sessions it holds now."""
    return {"kv": kv.model_dump(mode="json"), "sessions": sessions}


def figures_of(stats: Mapping[str, Any], index: int) -> tuple[KVStats | None, int]:
    """A replica's KV figures (named as replica ``index``) and sessions from its routing
    stats; (None, 0) before it reported any."""
    kv = stats.get("kv")
    figures = (
        None if kv is None else KVStats.model_validate(kv).model_copy(update={"replica": index})
    )
    return figures, int(stats.get("sessions", 0))


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One OpenAI-style call as the ingress hands it to an engine replica (and the
    router reads it): the route, the headers (lower-case names) and the JSON body."""

    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]

    def meta(self) -> CallMeta | None:
        """The session, call id and projected prompt as the gateway reads them
        (``call_metadata``); None for a body the gateway would refuse (the replica
        answers it with its own 400)."""
        api = next((api for api in LLM_APIS if api.path == self.path), CHAT)
        try:
            return call_metadata(self.headers, self.body, api)
        except BadRequest:
            return None


@dataclass(frozen=True, slots=True)
class NewSession:
    """A session whose first call asks for a replica (a ``SessionView``)."""

    session_id: str
    agent: str
    arrival_s: float
    prompt_tokens: int
    task_id: str
    prompt_text: str


class SessionPlacer:
    """Which replica serves each session (module docstring). Replicas are named by a
    key of the caller's (Ray's replica id); ``choose`` is given the live ones."""

    def __init__(
        self, policy: str, *, block_size: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        made = make_policy(policy)
        self.half: AdmissionHalf = made.admission()
        refuse_unless(made.name, self.half.needs, ROUTER_PROVIDES, HOST)
        self.block_size = block_size
        self._clock = clock
        self._placed: OrderedDict[str, str] = OrderedDict()
        """Session -> the key of the replica that serves it, least recently called
        first."""
        self._placed_ns: dict[str, list[int]] = {}
        """Replica key -> when (wall clock) sessions were placed on it, until its
        figures are newer."""

    def replica_of(self, session_id: str) -> str | None:
        return self._placed.get(session_id)

    def choose(
        self, meta: CallMeta, replicas: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> str | None:
        """The key of the replica for this call, given the live replicas as (key,
        routing stats) in a stable order; None: the half does not admit the session
        yet (ask again later)."""
        keys = [key for key, _ in replicas]
        placed = self._placed.get(meta.session_id)
        if placed in keys:
            self._placed.move_to_end(meta.session_id)
            return placed
        view = self._view(replicas)
        session = NewSession(
            meta.session_id, meta.agent or "", self._clock(), max(meta.prompt_tokens, 1),
            meta.task_id or meta.session_id, meta.prompt_text,
        )  # fmt: skip
        if not any(admitted is session for admitted in self.half.admit([session], view)):
            return None
        index = self.half.place(session, view)
        if not 0 <= index < len(keys):
            raise ValueError(
                f"the policy placed session {meta.session_id!r} on replica {index!r}; "
                f"there are {len(keys)}"
            )
        self._placed.pop(meta.session_id, None)
        self._placed[meta.session_id] = keys[index]
        if len(self._placed) > MAX_SESSIONS:
            self._placed.popitem(last=False)
        self._placed_ns.setdefault(keys[index], []).append(time.time_ns())
        return keys[index]

    def call_ended(self, meta: CallMeta) -> None:
        """The call has been answered (or failed): tell the half, as the gateway's
        stream does. A call that named no session was a session of its own: it is
        forgotten."""
        self.half.on_event(
            LLMEnd(session_id=meta.session_id, call_id=meta.call_id, source="gateway")
        )
        if meta.ephemeral:
            self._placed.pop(meta.session_id, None)

    def forget(self, key: str) -> None:
        """A replica is gone: its sessions are placed afresh at their next call."""
        for session_id in [sid for sid, placed in self._placed.items() if placed == key]:
            del self._placed[session_id]
        self._placed_ns.pop(key, None)

    def _sessions_on(self, key: str, kv: KVStats | None, reported: int) -> int:
        """The sessions a replica reported, plus those placed on it since."""
        since = -1 if kv is None else kv.wall_ns
        recent = [ns for ns in self._placed_ns.get(key, []) if ns > since]
        self._placed_ns[key] = recent
        return reported + len(recent)

    def _view(self, replicas: Sequence[tuple[str, Mapping[str, Any]]]) -> StreamAdmissionView:
        figures = [figures_of(stats, index) for index, (_, stats) in enumerate(replicas)]
        sessions = [
            self._sessions_on(key, kv, reported)
            for (key, _), (kv, reported) in zip(replicas, figures, strict=True)
        ]
        view = StreamAdmissionView(
            clock=self._clock,
            block_size=self.block_size,
            tool_cores=0,
            active_sessions=lambda: sum(sessions),
            replicas=len(replicas),
            sessions_on=lambda index: sessions[index],
        )
        for kv, _ in figures:
            if kv is not None:
                view.observe(kv)
        return view
