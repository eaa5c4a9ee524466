"""Steering vLLM's choice of the running call to preempt (the policy's ``victim``).

With ``--scheduling-policy fcfs`` vLLM 0.32 preempts ``self.running.pop()``: the last
running call. Right before that, when a running call's allocation has failed and no
pin is left to drop, the plugin moves the policy's victim to the end of the list. The
candidates are the calls from the one being scheduled to the end: vLLM has not
scheduled them in this step yet, so taking one out needs no undoing (the stock
choice, the last call, is always among them). Imports no vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def steer_victim(running: list[T], current: T, choose: Callable[[Sequence[T]], T]) -> T | None:
    """Move ``choose(candidates)`` to the end of ``running`` and return it; None (and
    ``running`` as it was) when ``current`` is not running (a waiting call's failed
    allocation preempts nothing) or is the only candidate."""
    if current not in running:
        return None
    candidates = running[running.index(current) :]
    if len(candidates) < 2:
        return None
    victim = choose(candidates)
    if victim not in candidates:
        raise ValueError("the policy's victim is not one of the running calls offered")
    running.remove(victim)
    running.append(victim)
    return victim
