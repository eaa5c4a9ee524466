"""Admission of tool calls to sandbox slots: at most ``slots`` run at once, waiting
calls are served by priority (lower value first, as in vLLM), FIFO within one.

The priority comes from the caller, who has it from the control plane: the gateway
answers each LLM call with the policy's ``tool_priority`` for the session (header
``X-Agentmars-Tool-Priority``, seed 000 §4.2), and the SDK's ``ToolCall`` takes the
newest as its ``priority`` (docs/sdk.md "Tool priority").
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field

MIN_PRIORITY = -(2**31)
MAX_PRIORITY = 2**31 - 1


def check_priority(priority: object) -> int:
    if type(priority) is not int or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(
            f"priority must be an integer in [{MIN_PRIORITY}, {MAX_PRIORITY}] "
            f"(lower runs first), got {priority!r}"
        )
    return priority


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    granted: asyncio.Future[int] = field(compare=False)


class Admission:
    """Hands out slot indices. ``acquire`` waits for one; ``release`` gives it back,
    straight to the best waiter if any. Cancelling a waiting ``acquire`` is safe:
    a slot granted to a waiter that has just been cancelled is passed on."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self._slots = slots
        self._free = list(range(slots))
        heapq.heapify(self._free)
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()

    @property
    def active(self) -> int:
        return self.slots - len(self._free)

    @property
    def queued(self) -> int:
        return sum(1 for w in self._waiting if not w.granted.done())

    @property
    def slots(self) -> int:
        return self._slots

    def try_acquire(self) -> int | None:
        """A slot at once if one is free and no call waits for one, else None."""
        if self._free and not self.queued:
            return heapq.heappop(self._free)
        return None

    async def acquire(self, priority: int = 0) -> int:
        check_priority(priority)
        slot = self.try_acquire()
        if slot is not None:
            return slot
        granted: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, _Waiter(priority, next(self._seq), granted))
        try:
            return await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(granted.result())
            raise

    def release(self, slot: int) -> None:
        while self._waiting:
            waiter = heapq.heappop(self._waiting)
            if not waiter.granted.done():
                waiter.granted.set_result(slot)
                return
        heapq.heappush(self._free, slot)
