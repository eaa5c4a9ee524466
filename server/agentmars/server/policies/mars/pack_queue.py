"""PackQueue, the Global Load Balancer of MARS's control plane (seed 000 §4.2,
Algorithm 1 lines 1-9): the waiting sessions in the order admission considers them.

Each session is annotated with its projected KV blocks (EstimateBlocks of its prefill
length). Normally smaller sessions go first (interactive work finishes sooner); under
CPU overload larger ones go first (GPU-heavy sessions add the least tool work to a
congested host); when every queued session is long, the queue is packed first-fit
against the available KV, so that an oversized head does not block sessions behind it
that fit now.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import TypeVar

from agentmars.server.policies.views import SessionView

S = TypeVar("S", bound=SessionView)


class PackMode(StrEnum):
    ASCENDING = "ascending"
    DESCENDING = "descending"
    FIRST_FIT = "first-fit"


def pack_mode(blocks: Sequence[int], *, cpu_overloaded: bool, long_blocks: float) -> PackMode:
    """Which packing Algorithm 1 uses for a queue with these projected blocks."""
    if cpu_overloaded:
        return PackMode.DESCENDING
    if blocks and all(b >= long_blocks for b in blocks):
        return PackMode.FIRST_FIT
    return PackMode.ASCENDING


def pack_queue(
    queue: Sequence[S],
    blocks: Sequence[int],
    mode: PackMode,
    available_blocks: int | None,
) -> list[S]:
    """``queue`` (arrival order) reordered by ``mode``; ``blocks[i]`` is ``queue[i]``'s
    estimate. Ties keep arrival order. First-fit without KV figures keeps arrival
    order (nothing to fit against)."""
    order = range(len(queue))
    if mode is PackMode.ASCENDING:
        ranked = sorted(order, key=lambda i: blocks[i])
    elif mode is PackMode.DESCENDING:
        ranked = sorted(order, key=lambda i: -blocks[i])
    else:
        ranked = first_fit(blocks, available_blocks)
    return [queue[i] for i in ranked]


def first_fit(blocks: Sequence[int], available: int | None) -> list[int]:
    """Indices of the sessions that fit the available blocks one after another, in
    arrival order, then the rest in arrival order."""
    if available is None:
        return list(range(len(blocks)))
    fitting, rest = [], []
    for index, need in enumerate(blocks):
        if need <= available:
            fitting.append(index)
            available -= need
        else:
            rest.append(index)
    return fitting + rest


def tool_rank(blocks: int, cpu_overloaded: bool) -> int:
    """The session's place in the sandbox pool's tool queue (lower first), in the
    order PackQueue puts sessions: smaller first, larger first under CPU overload."""
    return -blocks if cpu_overloaded else blocks
