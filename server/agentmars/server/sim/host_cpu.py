"""The host's tool CPUs: ``cores`` cores shared by the running tools.

A tool asks for ``ToolSpec.cores`` cores for ``wall_s`` seconds. While the running
tools ask for no more than the host has, each runs at full speed. When they ask for
more, the cores are shared in proportion to what each asks for, so every tool slows
by the same factor ``cores / demand`` (processor sharing; ours — seed 000 only says
the tools contend for host CPUs). A tool that asks for no CPU (it waits on something
remote) never slows. With ``slots``, at most that many tools run at once and the rest
queue as in the sandbox pool: by priority (lower first; the admission half's
``tool_priority``), in arrival order within one.

Background work (``run_background``) shares the same cores without a slot: the agents'
own processes, when they run on the tool cores (a replay's agents do), each asking for
one core until its CPU time is done, slowing the tools as one more tool would and
slowed by them alike.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from dataclasses import dataclass

from agentmars.server.workloads.model import ToolSpec


@dataclass(slots=True)
class _Running:
    spec: ToolSpec
    remaining_s: float
    """Wall time left at full speed."""


class HostCPU:
    def __init__(self, cores: int, slots: int | None = None) -> None:
        if cores < 1:
            raise ValueError("the host needs at least one tool core")
        if slots is not None and slots < 1:
            raise ValueError("tool slots must be at least 1 (or unlimited)")
        self.cores = cores
        self.slots = slots
        self.busy_core_s = 0.0
        self._running: dict[Hashable, _Running] = {}
        # (priority, arrival number, key, spec): the arrival number keeps FIFO among
        # equal priorities and spares comparing keys.
        self._queue: list[tuple[int, int, Hashable, ToolSpec]] = []
        self._background: dict[Hashable, float] = {}
        """Background work: CPU seconds left, at one core each."""
        self._arrivals = itertools.count()
        self._now = 0.0

    @property
    def active(self) -> int:
        return len(self._running)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _demand(self) -> float:
        return sum(run.spec.cores for run in self._running.values())

    def _shared_speed(self, tools_demand: float) -> float:
        """How fast the tools and background work that use cores run now (1.0: full
        speed)."""
        demand = tools_demand + len(self._background)
        return 1.0 if demand <= self.cores else self.cores / demand

    @staticmethod
    def _speed_of(run: _Running, shared: float) -> float:
        # A tool that asks for no core waits on something else: contention cannot slow it.
        return shared if run.spec.cores > 0 else 1.0

    def advance(self, now: float) -> None:
        """Let the running tools progress until ``now``."""
        elapsed = now - self._now
        if elapsed > 0 and (self._running or self._background):
            demand = self._demand()
            shared = self._shared_speed(demand)
            for run in self._running.values():
                run.remaining_s -= elapsed * self._speed_of(run, shared)
            for key in self._background:
                self._background[key] -= elapsed * shared
            self.busy_core_s += elapsed * shared * demand
        self._now = now

    def submit(self, key: Hashable, spec: ToolSpec, priority: int = 0) -> bool:
        """Start the tool (True) or queue it for a slot (False), ahead of the queued
        tools of higher ``priority``. Call ``advance`` first."""
        if self.slots is not None and len(self._running) >= self.slots:
            heapq.heappush(self._queue, (priority, next(self._arrivals), key, spec))
            return False
        self._running[key] = _Running(spec, spec.wall_s)
        return True

    def run_background(self, key: Hashable, cpu_s: float) -> None:
        """Start background work of ``cpu_s`` CPU seconds (no slot; nothing queues for
        it). Call ``advance`` first; ``finish`` it when ``next_finish`` names it."""
        self._background[key] = cpu_s

    def is_background(self, key: Hashable) -> bool:
        return key in self._background

    def next_finish(self) -> tuple[float, Hashable] | None:
        """When the next running tool or background work finishes if nothing
        changes, and which."""
        if not self._running and not self._background:
            return None
        shared = self._shared_speed(self._demand())
        left = [
            (key, max(run.remaining_s, 0.0) / self._speed_of(run, shared))
            for key, run in self._running.items()
        ]
        left += [(key, max(cpu_s, 0.0) / shared) for key, cpu_s in self._background.items()]
        key, left_s = min(left, key=lambda item: item[1])
        return self._now + left_s, key

    def finish(self, key: Hashable) -> list[Hashable]:
        """Remove a finished tool or background work; return the queued tools that
        start in the tool's slot."""
        if self._background.pop(key, None) is not None:
            return []
        del self._running[key]
        started = []
        while self._queue and (self.slots is None or len(self._running) < self.slots):
            _, _, next_key, spec = heapq.heappop(self._queue)
            self._running[next_key] = _Running(spec, spec.wall_s)
            started.append(next_key)
        return started
