"""Seed 004's virtual-time fair queue (§4.3, Eq. 2-3; Appendix B): agents are served in
the order they would complete under GPS, the ideal fair sharing of the KV cache.

Units. An agent's cost ``C`` is KV token-time (``cost.py``): KV tokens held times the
decode iterations they are held for. ``capacity`` is the KV token-time the server gives
per unit of ``now``: the paper's ``M`` KV tokens when ``now`` counts decode iterations;
a caller whose clock is in seconds passes ``M / seconds_per_iteration``. The virtual
time ``V`` is then KV token-time *per agent*: the service each agent active in GPS has
received since ``V = 0``, so ``V(a) + C`` is the ``V`` at which an agent arriving at
``a`` has received its whole cost, whatever arrives later.

GPS (Eq. 2). ``V(0) = 0`` and ``dV/dt = M / N_t``, where ``N_t`` counts the agents
active *in GPS*: from arrival until ``V`` reaches their tag ``F = V(a) + C`` (Eq. 3),
however early or late they finish in the real system. Between events ``V`` is linear;
each time it passes the smallest tag that agent leaves GPS and the slope steepens. Tags
sit in a heap, so an arrival or a GPS departure costs ``O(log n)`` (classic WFQ).

NOTE: ours, where the paper is silent:
- While no agent is active in GPS, ``V`` holds its value (Eq. 2's slope is undefined
  at ``N = 0``); only differences of ``V`` matter, and holding keeps tags monotone.
- An agent of zero cost gets ``F = V(a)`` and leaves GPS the instant it arrives: it
  never counts in ``N`` and is served before every agent with a larger tag.
- Agents arriving at the same instant are taken one at a time, in call order, each
  counted in ``N`` from that instant; equal tags are served in arrival order.
- A capacity change (``resize``) changes the slope from then on; issued tags stay, as
  they are service per agent, not times.
- ``forget`` drops what the clock keeps for an agent done in the real system, but the
  agent stays active in GPS until ``V`` passes its tag: the reference is the fluid
  system Theorem B.1 compares against, which the real system's speed does not change.
  Its id may then arrive again as a new agent with a new tag.
- Unknown agent ids raise ``KeyError``; bad values (non-positive capacity, negative or
  infinite cost, time going backwards, an id that arrives twice) raise ``ValueError``.
  Equal times are allowed: they are simultaneous events.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class _Tag:
    finish: float
    """``F``: the virtual time at which the agent leaves GPS."""
    rank: int
    """Arrival order among all arrivals, for ties in ``F``."""
    departed_s: float | None = None
    """The real time ``V`` reached ``finish`` (its GPS completion), once it has."""


class VirtualClock:
    """The GPS virtual time of Eq. 2 and the agents' finish tags (module docstring)."""

    def __init__(self, capacity: float) -> None:
        self.capacity = _checked_capacity(capacity)
        self.now = 0.0
        """The real time the clock was last brought to."""
        self.value = 0.0
        """``V(now)``."""
        self._in_gps: list[tuple[float, int, Hashable]] = []
        """Heap of ``(F, rank, agent id)`` of the agents active in GPS, forgotten or not."""
        self._tags: dict[Hashable, _Tag] = {}
        self._arrivals = 0

    @property
    def active(self) -> int:
        """``N``: agents active in GPS at ``now``."""
        return len(self._in_gps)

    def arrive(self, agent_id: Hashable, cost: float, now: float) -> float:
        """An agent arrives with KV token-time ``cost``; returns its tag ``F`` (Eq. 3)."""
        if not (math.isfinite(cost) and cost >= 0):
            raise ValueError(f"agent {agent_id!r}: cost must be finite and >= 0, got {cost}")
        if agent_id in self._tags:
            raise ValueError(f"agent {agent_id!r} arrived already; forget it before it re-arrives")
        self.advance(now)
        tag = _Tag(finish=self.value + cost, rank=self._arrivals)
        self._arrivals += 1
        self._tags[agent_id] = tag
        if cost == 0:
            tag.departed_s = now
        else:
            heapq.heappush(self._in_gps, (tag.finish, tag.rank, agent_id))
        return tag.finish

    def advance(self, now: float) -> float:
        """Bring the clock to ``now``, retiring from GPS every agent whose tag ``V``
        reaches on the way; returns ``V(now)``."""
        self._check_time(now)
        while (departure := self.next_departure()) is not None and departure <= now:
            self._depart_first(departure)
        if self._in_gps:
            self.value += (now - self.now) * self.capacity / len(self._in_gps)
        self.now = now
        return self.value

    def next_departure(self) -> float | None:
        """When the next agent leaves GPS if no one arrives before; ``None`` if GPS is
        empty."""
        if not self._in_gps:
            return None
        finish = self._in_gps[0][0]
        # max: rounding may leave V a hair past the tag; time must not go back for it.
        return max(self.now, self.now + (finish - self.value) * len(self._in_gps) / self.capacity)

    def resize(self, capacity: float, now: float) -> None:
        """The KV capacity becomes ``capacity`` at ``now`` (the slope changes from then)."""
        self.advance(now)
        self.capacity = _checked_capacity(capacity)

    def knows(self, agent_id: Hashable) -> bool:
        """Whether the agent arrived and was not forgotten."""
        return agent_id in self._tags

    def finish_tag(self, agent_id: Hashable) -> float:
        return self._tags[agent_id].finish

    def serve_key(self, agent_id: Hashable) -> tuple[float, int]:
        """The agent's place in the serve order: ``(F, arrival rank)``, ascending."""
        tag = self._tags[agent_id]
        return tag.finish, tag.rank

    def departure(self, agent_id: Hashable) -> float | None:
        """The agent's GPS completion time ``V^-1(F)``, once the clock has passed it."""
        return self._tags[agent_id].departed_s

    def forget(self, agent_id: Hashable) -> None:
        """The agent is done in the real system: drop its tag. It stays in GPS's ``N``
        until ``V`` passes its tag (module docstring)."""
        del self._tags[agent_id]

    def _depart_first(self, at: float) -> None:
        # Set V to the tag itself, not to a product of the slope, so that equal tags
        # leave together and rounding does not accumulate.
        finish, rank, agent_id = heapq.heappop(self._in_gps)
        self.now, self.value = at, finish
        tag = self._tags.get(agent_id)
        if tag is not None and tag.rank == rank:  # not forgotten, nor a later re-arrival
            tag.departed_s = at

    def _check_time(self, now: float) -> None:
        if not math.isfinite(now):
            raise ValueError(f"time must be finite, got {now}")
        if now < self.now:
            raise ValueError(f"time went backwards: {now} < {self.now}")


def _checked_capacity(capacity: float) -> float:
    if not (math.isfinite(capacity) and capacity > 0):
        raise ValueError(f"capacity must be finite and > 0, got {capacity}")
    return capacity


class FairQueue(Generic[T]):
    """Justitia's waiting queue: waiting calls in ascending order of their agent's tag
    ``F`` (ties: the agent's arrival order), first in first out within an agent. It holds
    only waiting calls, so serving is non-preemptive at the call level (§4.3): a call the
    engine took off the queue runs on, whoever arrives later."""

    def __init__(self, capacity: float) -> None:
        self.clock = VirtualClock(capacity)
        self._waiting: list[tuple[float, int, int, Hashable, T]] = []
        """Heap of ``(F, agent rank, push order, agent id, call)``."""
        self._pushes = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def arrive(self, agent_id: Hashable, cost: float, now: float) -> float:
        """An agent arrives with KV token-time ``cost``; returns its tag ``F``."""
        return self.clock.arrive(agent_id, cost, now)

    def push(self, agent_id: Hashable, call: T) -> None:
        """A call of an agent that has arrived waits for the engine."""
        finish, rank = self.clock.serve_key(agent_id)
        heapq.heappush(self._waiting, (finish, rank, self._pushes, agent_id, call))
        self._pushes += 1

    def peek(self) -> T | None:
        return self._waiting[0][-1] if self._waiting else None

    def pop(self) -> T | None:
        """The next call to serve, off the queue."""
        return heapq.heappop(self._waiting)[-1] if self._waiting else None

    def leave(self, agent_id: Hashable) -> None:
        """The agent is done in the real system: forget it, and drop any call of it still
        waiting (it was cancelled). O(n) only when such calls remain."""
        self.clock.forget(agent_id)
        if any(entry[3] == agent_id for entry in self._waiting):
            self._waiting = [entry for entry in self._waiting if entry[3] != agent_id]
            heapq.heapify(self._waiting)


def gps_completion_times(arrivals: Sequence[tuple[float, float]], capacity: float) -> list[float]:
    """Each agent's GPS completion time ``fbar_j`` for arrivals ``(time, KV token-time
    cost)`` on ``capacity``, in the arrivals' order: the reference Theorem B.1 bounds the
    real completion times against (``f_j - fbar_j <= 2 c_max + C_max / M``)."""
    clock = VirtualClock(capacity)
    for index in sorted(range(len(arrivals)), key=lambda i: arrivals[i][0]):
        time, cost = arrivals[index]
        clock.arrive(index, cost, time)
    while (departure := clock.next_departure()) is not None:
        clock.advance(departure)
    return [_departed(clock, index) for index in range(len(arrivals))]


def _departed(clock: VirtualClock, agent_id: int) -> float:
    departed = clock.departure(agent_id)
    assert departed is not None, "GPS drained, so every agent has left it"
    return departed
