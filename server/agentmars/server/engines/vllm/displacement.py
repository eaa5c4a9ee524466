"""A preemptive policy's displacement (``EngineHalf.preemptive``) in the vLLM plugin:
the running calls a waiting call that cannot start displaces, the last-ranked first.

The plugin asks at the top of ``schedule()``, before vLLM's own pass, for the waiting
call that pass looks at first; the simulator's ``Scheduler._displaced_by`` makes the
same choice inside its waiting pass. The loop is here, apart from vLLM (requests are
opaque: the plugin passes how to rank, test and preempt them), so it is tested on
plain values. Imports no vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def displace(
    head_rank: Any,
    running: Sequence[T],
    rank: Callable[[T], Any],
    blocked: Callable[[], bool],
    preempt: Callable[[T], bool],
) -> list[T]:
    """While ``blocked()`` (the waiting call cannot start now) and the last-ranked of
    ``running`` ranks after the waiting call (``head_rank < rank(last)``), preempt that
    one; returns the calls preempted, in order.

    ``preempt`` takes the call out of ``running`` (a live list) and returns True, or
    returns False when it cannot be preempted now, which ends the loop. The running
    calls are ranked once (ours: their ranks do not depend on each other's
    preemption; the simulator asks again for each one); ``blocked`` is asked again
    after each preemption."""
    displaced: list[T] = []
    ranks: dict[int, Any] = {}
    while running and blocked():
        if not ranks:
            ranks = {id(call): rank(call) for call in running}
        last = max(running, key=lambda call: ranks[id(call)])
        if not head_rank < ranks[id(last)]:
            break
        if not preempt(last):
            break
        displaced.append(last)
    return displaced
