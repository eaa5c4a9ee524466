"""MORI's half in the gateway (seed 003 §4.3.1): the admission of new programs and,
behind several replicas, the single global Waiting queue's placement.

New programs (promotion level 3) enter only when no gated program has a call waiting
(levels 1 and 2 go first, inside the engines) and their prompt fits the free GPU KV,
the smallest context first, each on the replica with the most room. The fit against
the engines' KV figures is ThunderAgent's (MORI is built on it, §5).

A program demoted to Waiting has nothing of its own left on its replica, so it
belongs to no replica (§4.1: "a single global Waiting queue is shared across all
replicas"). When its next call comes and its replica has no room for it, it is
promoted, Best-Fit-Decreasing, to the replica with the most room (``moves``), if that
one can take its prompt; a CPU-tier program keeps its replica (its KV is in that
replica's CPU memory: affinity).

NOTE: ours —
- a Waiting program whose replica has room stays there, where the paper takes the
  replica with the most room whatever it was on: these engines keep a released
  program's blocks in the prefix cache, and (``offload_evicted``) the GPU's evicted
  blocks in the CPU tier's LRU copies, so its replica may still hold part of its
  context, which a move would recompute. Moving by most room alone lost 2-16% of
  the throughput on three replicas at 20 and 50 programs per replica
  (docs/results/seed-003.md "The global Waiting queue");
- the move happens when the call comes, not at the control loop's next tick; if no
  replica has room for it then, it stays gated where it was and that replica's
  engine half promotes it there; its idleness history stays with the replica it
  left.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentmars.sdk.events import AnyEvent, SessionEnd, SessionMove, SessionPause, SessionResume
from agentmars.server.policies.mori.tiers import GatedPrograms, Tier
from agentmars.server.policies.thunderagent import ThunderAgentAdmission
from agentmars.server.policies.views import AdmissionView, SessionView


class MoriAdmission(ThunderAgentAdmission):
    def __init__(self) -> None:
        super().__init__()
        self._gated = GatedPrograms()
        self._kv_dropped: set[str] = set()
        """Programs in the Waiting tier: gated with nothing left on their replica."""

    def on_event(self, event: AnyEvent) -> None:
        super().on_event(event)
        self._gated.observe(event)
        if isinstance(event, SessionPause) and event.reason == Tier.WAITING.pause_reason:
            self._kv_dropped.add(event.session_id)
        elif isinstance(event, SessionPause | SessionResume | SessionEnd | SessionMove):
            self._kv_dropped.discard(event.session_id)

    def holds_new(self) -> bool:
        return self._gated.waiting_for_inference()

    def order(self, queue: Sequence[SessionView]) -> Sequence[SessionView]:
        return sorted(queue, key=lambda session: (session.prompt_tokens, session.arrival_s))

    def moves(self, session: SessionView, current: int, view: AdmissionView) -> int | None:
        """A Waiting program's call that its replica has no room for: to the replica
        with the most room, if it fits there."""
        if session.session_id not in self._kv_dropped:
            return None
        room = self.room(view)
        if not room or room.get(current, 0) >= session.prompt_tokens:
            return None
        best = max(room, key=lambda index: (room[index], -index))
        if room[best] < session.prompt_tokens:
            return None
        self._unstarted.add(session.session_id, session.prompt_tokens, best)
        return best
