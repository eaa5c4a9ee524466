"""Seed 001's starvation prevention (§3, Algorithm 1 lines 18-31): a counter per call,
counted at every engine step (steps with preemptions too). A call that waits through a
step adds one; a running call's counter goes back to 0. A call whose counter reaches
the threshold (seed 001: 100, "parameter experiments") is starving: it goes to the head
of the queue, ahead of every call that is not, and stays there until it finishes
("Prioritization continues until request completion, avoiding memory waste from
preempted (half-finished) requests"): once it runs, no call displaces it, not even
another starving one (``protected``). Among starving calls the ranking keeps its
order."""

from __future__ import annotations

from collections.abc import Iterable

from agentmars.server.policies.views import CallView

STARVATION_THRESHOLD = 100


class StarvationGuard:
    def __init__(self, threshold: int = STARVATION_THRESHOLD) -> None:
        self.threshold = threshold
        self.counts: dict[str, int] = {}
        self.starving: set[str] = set()
        self.protected: set[str] = set()
        """Starving calls that have run since: they keep running to their end."""

    def count_step(self, waiting: Iterable[CallView], running: Iterable[CallView]) -> None:
        for call in running:
            self.counts.pop(call.call_id, None)
            if call.call_id in self.starving:
                self.protected.add(call.call_id)
        for call in waiting:
            call_id = call.call_id
            if call_id in self.starving:
                continue
            count = self.counts.get(call_id, 0) + 1
            if count >= self.threshold:
                self.starving.add(call_id)
                self.counts.pop(call_id, None)
            else:
                self.counts[call_id] = count

    def group(self, call_id: str) -> int:
        """Where the call's rank starts: 0 starving and running, 1 starving, 2 not."""
        if call_id in self.protected:
            return 0
        return 1 if call_id in self.starving else 2

    def is_starving(self, call_id: str) -> bool:
        return call_id in self.starving

    def forget(self, call_id: str) -> None:
        self.counts.pop(call_id, None)
        self.starving.discard(call_id)
        self.protected.discard(call_id)
