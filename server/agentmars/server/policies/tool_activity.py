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

MAX_OPEN_TOOL_CALLS = 65_536
"""Tool calls queued or running a host keeps track of (ours: far above what one node
runs); past this, the one reported least recently is forgotten, as if it had ended,
so that calls whose end never came cannot grow a host without bound."""


class ToolActivity:
    """Tool calls in flight, keyed by (session id, call id): call ids are unique only
    within their session. Every update and question is O(1) (a session's end: O(its
    calls))."""

    def __init__(self, limit: int = MAX_OPEN_TOOL_CALLS) -> None:
        self.limit = limit
        self._open: dict[tuple[str, str], bool] = {}
        """Open calls, least recently reported first: True once started."""
        self._by_session: dict[str, set[str]] = {}
        self._running = 0
        self.durations = ToolDurations()

    @property
    def active_tools(self) -> int:
        return self._running

    @property
    def queued_tools(self) -> int:
        return len(self._open) - self._running

    @property
    def tool_ema_s(self) -> Mapping[str, float]:
        return self.durations.ema_s

    def runs_tools(self, session_id: str) -> bool:
        """The session has a tool call queued or running."""
        return session_id in self._by_session

    def observe(self, event: AnyEvent) -> None:
        """Follow one event (others than tool and session-end events change nothing)."""
        if event.kind == "session_end":
            # A session's tool that never reported its end is over with the session.
            for call_id in list(self._by_session.get(event.session_id, ())):
                self._close(event.session_id, call_id)
        elif event.kind == "tool_enqueue":
            self._open_call(event.session_id, event.call_id, started=False)
        elif event.kind == "tool_start":
            self._open_call(event.session_id, event.call_id, started=True)
        elif event.kind == "tool_end":
            self._close(event.session_id, event.call_id)
            self.durations.record(event.tool, event.duration_s)

    def _open_call(self, session_id: str, call_id: str, *, started: bool) -> None:
        key = (session_id, call_id)
        if key in self._open:
            self._close(session_id, call_id)
        elif len(self._open) >= self.limit:
            self._close(*next(iter(self._open)))
        self._open[key] = started
        self._running += started
        self._by_session.setdefault(session_id, set()).add(call_id)

    def _close(self, session_id: str, call_id: str) -> None:
        started = self._open.pop((session_id, call_id), None)
        if started is None:
            return
        self._running -= started
        calls = self._by_session[session_id]
        calls.discard(call_id)
        if not calls:
            del self._by_session[session_id]


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
