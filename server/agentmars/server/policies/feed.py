"""The door through which the stream's events reach a policy half: each boundary once.

One call's boundaries can reach a host more than once: the SDK posts its ``llm_submit``
to the gateway, which records its own for the same call; the gateway forwards both
kinds into the engine, which sees the call itself. They all carry the same call id
(the SDK's, forwarded in ``vllm_xargs.call_id``) and turn, so a boundary is known by
(kind, session, turn, call) and the first report of it wins, whichever side made it.
The turn is part of it because a tool call's id may be the model's, which an agent
loop can see again in a later turn. Events that
are not call or session boundaries (``kv_stats``, ``tool_stats``, ``window_update``,
``session_pause``...) are known by their ``event_id``, so one that comes back over the
side channel is not handed over twice either.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

from agentmars.sdk.events import AnyEvent, CallEvent, SessionEnd, SessionStart

MEMORY = 65_536
"""Boundaries remembered (ours: a duplicate arrives within seconds of the original;
the oldest are forgotten past this many)."""


def boundary_of(event: AnyEvent) -> Hashable:
    """What makes two reports of the same boundary the same."""
    if isinstance(event, CallEvent):
        return (event.kind, event.session_id, event.turn, event.call_id)
    if isinstance(event, SessionStart | SessionEnd):
        return (event.kind, event.session_id)
    return event.event_id


class EventFeed:
    """Calls ``deliver`` with each boundary the first time it is reported."""

    def __init__(self, deliver: Callable[[AnyEvent], None], memory: int = MEMORY) -> None:
        self._deliver = deliver
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self._memory = memory
        self.duplicates = 0
        """Reports dropped because the boundary was delivered already."""

    def __call__(self, event: AnyEvent) -> bool:
        """Deliver ``event`` unless its boundary was; True if it was delivered now."""
        key = boundary_of(event)
        if key in self._seen:
            self.duplicates += 1
            return False
        self._seen[key] = None
        if len(self._seen) > self._memory:
            self._seen.popitem(last=False)
        self._deliver(event)
        return True
