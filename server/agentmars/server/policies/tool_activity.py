"""The CPU side as the event stream shows it: tool calls queued and running, and the
moving average of each tool kind's duration (``agentmars.sdk.tool_stats``). Every host
of a policy half follows it from the same events (the gateway from what it ingests,
the vLLM plugin from the side channel, the twin from the gateway, the simulator from
what it emits), so both halves see the same tool figures on every engine.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentmars.sdk.events import AnyEvent
from agentmars.sdk.tool_stats import ToolDurations


class ToolActivity:
    """Tool calls in flight, keyed by (session id, call id): call ids are unique only
    within their session."""

    def __init__(self) -> None:
        self._queued: set[tuple[str, str]] = set()
        self._active: set[tuple[str, str]] = set()
        self.durations = ToolDurations()

    @property
    def active_tools(self) -> int:
        return len(self._active)

    @property
    def queued_tools(self) -> int:
        return len(self._queued)

    @property
    def tool_ema_s(self) -> Mapping[str, float]:
        return self.durations.ema_s

    def runs_tools(self, session_id: str) -> bool:
        """The session has a tool call queued or running."""
        return any(s == session_id for s, _ in self._active | self._queued)

    def observe(self, event: AnyEvent) -> None:
        """Follow one event (others than tool and session-end events change nothing)."""
        if event.kind == "session_end":
            # A session's tool that never reported its end is over with the session.
            self._queued = {key for key in self._queued if key[0] != event.session_id}
            self._active = {key for key in self._active if key[0] != event.session_id}
        elif event.kind == "tool_enqueue":
            self._queued.add((event.session_id, event.call_id))
        elif event.kind == "tool_start":
            self._queued.discard((event.session_id, event.call_id))
            self._active.add((event.session_id, event.call_id))
        elif event.kind == "tool_end":
            self._queued.discard((event.session_id, event.call_id))
            self._active.discard((event.session_id, event.call_id))
            self.durations.record(event.tool, event.duration_s)


class FollowsTools:
    """The ``ToolFigures`` of a view answered from its ``tools``; ``tool_cores`` is
    the host's own."""

    tools: ToolActivity

    @property
    def active_tools(self) -> int:
        return self.tools.active_tools

    @property
    def queued_tools(self) -> int:
        return self.tools.queued_tools

    @property
    def tool_ema_s(self) -> Mapping[str, float]:
        return self.tools.tool_ema_s
