"""The simulator's virtual clock: what happens when, in a heap ordered by an explicit
key (time, rank, sequence). At one instant an engine step ends before anything else
is handled, and the next step starts only after everything else of that instant (so a
step sees every arrival of its start time)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Rank(IntEnum):
    STEP_END = 0
    PREFILL_END = 0
    TOOL_DONE = 1
    CALL_SUBMIT = 2
    SESSION_ARRIVAL = 3
    PIN_EXPIRY = 4
    TICK = 5
    KV_STATS = 6
    ADMISSION_PASS = 7
    STEP_START = 9


@dataclass(order=True)
class Scheduled:
    time: float
    rank: int
    seq: int
    handler: Callable[[Any], None] = field(compare=False)
    arg: Any = field(compare=False, default=None)
