"""The admission half's view built from the stream alone, as the gateway builds it and
the simulator's gateway does too (``policies.views.AdmissionView``): the newest
``kv_stats`` figures the engine sent, the tool figures of the tool events, and the
sessions its host admitted. The host says what time it is and how many sessions it
admitted, and may name where the KV figures come from (``kv_source``: the gateway's
side channel to the engine); everything else comes from ``observe``.
"""

from __future__ import annotations

from collections.abc import Callable

from agentmars.sdk.events import (
    AnyEvent,
    KVStats,
    LLMEnd,
    LLMFirstToken,
    SessionEnd,
    ToolStats,
)
from agentmars.server.policies.tool_activity import FollowsTools, ToolActivity


class StreamAdmissionView(FollowsTools):
    def __init__(
        self,
        *,
        clock: Callable[[], float],
        block_size: int,
        tool_cores: int,
        active_sessions: Callable[[], int] = lambda: 0,
        kv_source: Callable[[], KVStats | None] | None = None,
    ) -> None:
        self._clock = clock
        self.block_size = block_size
        self.tool_cores = tool_cores
        self.active_sessions_of = active_sessions
        """Set by the admission that owns the sessions."""
        self.tools = ToolActivity()
        self._kv_source = kv_source
        self._kv_seen: KVStats | None = None

    @property
    def kv(self) -> KVStats | None:
        return self._kv_source() if self._kv_source is not None else self._kv_seen

    @property
    def now(self) -> float:
        return self._clock()

    @property
    def active_sessions(self) -> int:
        return self.active_sessions_of()

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def observe(self, event: AnyEvent) -> None:
        """Follow tool events, keep the newest KV figures and the tool cores the
        sandbox says it has (until it says, the host's own guess)."""
        if isinstance(event, KVStats):
            self._kv_seen = event
        elif isinstance(event, ToolStats) and event.cores is not None:
            self.tool_cores = event.cores
        self.tools.observe(event)

    def runs_tools(self, session_id: str) -> bool:
        """The session has a tool call queued or running."""
        return self.tools.runs_tools(session_id)


class UnstartedPrompts:
    """The prompts of admitted sessions whose call has not started yet (no first token
    and no end): they hold no blocks in the KV figures, so an admission half that fits
    prompts into the free KV counts them against it. NOTE: ours — the figures are
    sampled, so a prompt that started since the last sample is counted in neither for
    that moment."""

    def __init__(self) -> None:
        self._by_session: dict[str, int] = {}
        self.tokens = 0

    def add(self, session_id: str, tokens: int) -> None:
        """A session admitted with this prompt (one admitted again starts afresh)."""
        self.started(session_id)
        self._by_session[session_id] = tokens
        self.tokens += tokens

    def started(self, session_id: str) -> None:
        self.tokens -= self._by_session.pop(session_id, 0)

    def observe(self, event: AnyEvent) -> None:
        # A call answered whole has no first token: its end says it ran.
        if isinstance(event, LLMFirstToken | LLMEnd | SessionEnd):
            self.started(event.session_id)
