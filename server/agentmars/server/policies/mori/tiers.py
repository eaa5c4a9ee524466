"""MORI's three tiers (seed 003 §4.1) and what the scheduler keeps of each program.

- ``GPU``: the program's KV stays in HBM between its calls (pinned); its calls go
  straight to the engine. The GPU-tier programs' contexts must fit the GPU KV.
- ``CPU``: its KV was offloaded to the CPU tier; its calls are gated until it is
  promoted, then its next call loads the KV back. The CPU-tier programs' KV must fit
  the CPU tier.
- ``WAITING``: its KV was discarded; its calls are gated until it is promoted, then
  its next call recomputes its context.

A program's *status* is separate (§4.1): Reasoning while a call of it is on the engine,
Acting between calls (``Idleness.reasoning``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agentmars.sdk.events import (
    AnyEvent,
    LLMSubmit,
    SessionEnd,
    SessionMove,
    SessionPause,
    SessionResume,
)
from agentmars.server.policies.mori.idleness import Idleness


class Tier(StrEnum):
    GPU = "gpu"
    CPU = "cpu"
    WAITING = "waiting"

    @property
    def pause_reason(self) -> str:
        """What the ``session_pause`` of a program gated in this tier says: the
        admission half tells a Waiting program (nothing of it left on its replica,
        free to move) from a CPU-tier one (its KV in that replica's CPU tier)."""
        return f"mori: {self.value} tier"


@dataclass(slots=True)
class Program:
    idleness: Idleness
    tier: Tier = Tier.GPU
    gated: bool = False
    """Its calls are held (it is in the CPU or Waiting tier and the engine paused it)."""
    demote_to: Tier | None = None
    """Lazy demotion (§4.3.1): a Reasoning victim moves to this tier when its call ends."""
    tokens: int = 0
    """Its context as last seen: what promoting it must fit."""
    cpu_blocks: int = 0
    """CPU-tier blocks its offloaded KV holds (or will, for a lazy demotion to CPU)."""
    submitted: str | None = None
    """Its latest call the stream announced (``llm_submit``); while gated, a call other
    than the one last seen on the engine is held: promotion levels 1 and 2."""
    held_since_s: float | None = None
    """When the engine half first saw that held call (its clock)."""
    resumed_s: float | None = None
    """When it was last let through (its held call starts Reasoning then, not before)."""
    call_id: str | None = None
    """Its call last seen on the engine (a new id is a new call)."""

    @property
    def holds_call(self) -> bool:
        """A call of it was announced that the engine has not run (held while gated)."""
        return self.submitted is not None and self.submitted != self.call_id


class GatedPrograms:
    """The programs the engine has gated, as the stream tells the admission half
    (``session_pause`` / ``session_resume``), and whether any of them has a call waiting
    (an ``llm_submit`` since): §4.3.1 promotes those before new programs."""

    def __init__(self) -> None:
        self._gated: dict[str, bool] = {}
        """Gated session -> a call of it waits."""

    def observe(self, event: AnyEvent) -> None:
        if isinstance(event, SessionPause):
            self._gated[event.session_id] = False
        elif isinstance(event, SessionResume | SessionEnd | SessionMove):
            self._gated.pop(event.session_id, None)
        elif isinstance(event, LLMSubmit) and event.session_id in self._gated:
            self._gated[event.session_id] = True

    def waiting_for_inference(self) -> bool:
        return any(self._gated.values())
