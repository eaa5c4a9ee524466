"""MORI's admission of new programs, in the gateway (seed 003 §4.3.1, promotion level
3): a new program enters only when no gated program has a call waiting (levels 1 and
2 go first, inside the engine) and its prompt fits the free GPU KV, the smallest
context first. The fit against the engine's KV figures is ThunderAgent's (MORI is
built on it, §5)."""

from __future__ import annotations

from collections.abc import Sequence

from agentmars.sdk.events import AnyEvent
from agentmars.server.policies.mori.tiers import GatedPrograms
from agentmars.server.policies.thunderagent import ThunderAgentAdmission
from agentmars.server.policies.views import SessionView


class MoriAdmission(ThunderAgentAdmission):
    def __init__(self) -> None:
        super().__init__()
        self._gated = GatedPrograms()

    def on_event(self, event: AnyEvent) -> None:
        super().on_event(event)
        self._gated.observe(event)

    def holds_new(self) -> bool:
        return self._gated.waiting_for_inference()

    def order(self, queue: Sequence[SessionView]) -> Sequence[SessionView]:
        return sorted(queue, key=lambda session: (session.prompt_tokens, session.arrival_s))
