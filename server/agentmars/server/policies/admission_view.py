"""The admission half's view built from the stream alone, as the gateway builds it and
the simulator's gateway does too (``policies.views.AdmissionView``): the newest
``kv_stats`` figures the engine sent, the tool figures of the tool events, and the
sessions its host admitted. The host says what time it is and how many sessions it
admitted, and may name where the KV figures come from (``kv_source``: the gateway's
side channel to the engine); everything else comes from ``observe``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentmars.sdk.events import (
    AnyEvent,
    KVStats,
    LLMEnd,
    LLMFirstToken,
    SessionEnd,
    ToolStats,
)
from agentmars.server.policies.tool_activity import FollowsTools, ToolActivity


@dataclass(frozen=True, slots=True)
class Replica:
    """A ``ReplicaView``."""

    index: int
    kv: KVStats | None
    sessions: int


class StreamAdmissionView(FollowsTools):
    def __init__(
        self,
        *,
        clock: Callable[[], float],
        block_size: int,
        tool_cores: int,
        active_sessions: Callable[[], int] = lambda: 0,
        kv_sources: Sequence[Callable[[], KVStats | None]] | None = None,
        replicas: int = 1,
        sessions_on: Callable[[int], int] = lambda index: 0,
    ) -> None:
        """``replicas``: the engine replicas behind the host; ``kv_sources``: where each
        one's KV figures come from (the gateway's side channels), else the ``kv_stats``
        events observed, which say which replica they are of; ``sessions_on(index)``:
        the sessions placed on one replica."""
        if kv_sources is not None and len(kv_sources) != replicas:
            raise ValueError(f"{len(kv_sources)} KV sources for {replicas} replicas")
        self._clock = clock
        self.block_size = block_size
        self.tool_cores = tool_cores
        self.active_sessions_of = active_sessions
        """Set by the admission that owns the sessions."""
        self.sessions_on = sessions_on
        """Set by the admission that places the sessions."""
        self.tools = ToolActivity()
        self._kv_sources = kv_sources
        self._kv_seen: list[KVStats | None] = [None] * replicas

    def _figures(self) -> list[KVStats | None]:
        if self._kv_sources is not None:
            return [source() for source in self._kv_sources]
        return self._kv_seen

    @property
    def replica_count(self) -> int:
        return len(self._kv_seen)

    @property
    def kv(self) -> KVStats | None:
        """The newest figures; behind several replicas, their sum."""
        figures = self._figures()
        return figures[0] if len(figures) == 1 else summed_kv(figures)

    @property
    def replicas(self) -> list[Replica]:
        figures = self._figures()
        if len(figures) == 1:
            return [Replica(0, figures[0], self.active_sessions)]
        return [Replica(i, kv, self.sessions_on(i)) for i, kv in enumerate(figures)]

    @property
    def now(self) -> float:
        return self._clock()

    @property
    def active_sessions(self) -> int:
        return self.active_sessions_of()

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def observe(self, event: AnyEvent) -> None:
        """Follow tool events, keep the newest KV figures (of each replica) and the
        tool cores the sandbox says it has (until it says, the host's own guess)."""
        if isinstance(event, KVStats):
            index = event.replica or 0
            if index < len(self._kv_seen):
                self._kv_seen[index] = event
        elif isinstance(event, ToolStats) and event.cores is not None:
            self.tool_cores = event.cores
        self.tools.observe(event)

    def runs_tools(self, session_id: str) -> bool:
        """The session has a tool call queued or running."""
        return self.tools.runs_tools(session_id)


def summed_kv(figures: Sequence[KVStats | None]) -> KVStats | None:
    """Several replicas' KV figures as one pool (None until each has reported)."""
    if any(kv is None for kv in figures):
        return None
    known = [kv for kv in figures if kv is not None]
    released: dict[str, int] = {}
    for kv in known:
        for reason, count in kv.released.items():
            released[reason] = released.get(reason, 0) + count
    return KVStats(
        total_blocks=sum(kv.total_blocks for kv in known),
        free_blocks=sum(kv.free_blocks for kv in known),
        used_blocks=sum(kv.used_blocks for kv in known),
        pinned_blocks=sum(kv.pinned_blocks for kv in known),
        pins=sum(kv.pins for kv in known),
        released=released,
        cpu_total_blocks=sum(kv.cpu_total_blocks for kv in known),
        cpu_free_blocks=sum(kv.cpu_free_blocks for kv in known),
        mono_ns=max(kv.mono_ns for kv in known),
        wall_ns=max(kv.wall_ns for kv in known),
        source=known[0].source,
    )


class UnstartedPrompts:
    """The prompts of admitted sessions whose call has not started yet (no first token
    and no end): they hold no blocks in the KV figures, so an admission half that fits
    prompts into the free KV counts them against it. NOTE: ours — the figures are
    sampled, so a prompt that started since the last sample is counted in neither for
    that moment."""

    def __init__(self) -> None:
        self._by_session: dict[str, tuple[int, int]] = {}
        """Session -> (its prompt, the replica it was placed on)."""
        self.tokens = 0
        self._on: dict[int, int] = {}

    def add(self, session_id: str, tokens: int, replica: int = 0) -> None:
        """A session admitted with this prompt (one admitted again starts afresh)."""
        self.started(session_id)
        self._by_session[session_id] = (tokens, replica)
        self.tokens += tokens
        self._on[replica] = self._on.get(replica, 0) + tokens

    def on(self, replica: int) -> int:
        """The unstarted prompts placed on one replica."""
        return self._on.get(replica, 0)

    def started(self, session_id: str) -> None:
        tokens, replica = self._by_session.pop(session_id, (0, 0))
        self.tokens -= tokens
        self._on[replica] = self._on.get(replica, 0) - tokens

    def observe(self, event: AnyEvent) -> None:
        # A call answered whole has no first token: its end says it ran.
        if isinstance(event, LLMFirstToken | LLMEnd | SessionEnd):
            self.started(event.session_id)
